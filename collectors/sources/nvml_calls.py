"""How an NVML call fails: pynvml's errors sorted into what they mean for the caller.

NVML's errors are per call, and four kinds matter:
- not supported (`NotSupported`, `FunctionNotFound`, `NoPermission`): the value is absent
  (None or False), never 0 and never an error;
- GPU lost (`GpuIsLost`, Xid 79): `GpuLostError`, the caller drops that GPU and keeps
  the others;
- a timeout where one is expected (waiting for events): None, "nothing came";
- anything else (`Timeout`, `Unknown`, `InUse`, ...): within a cycle's readings the value
  is absent and a `CallFailure` is kept for the collector to count; from a call whose
  result the caller cannot do without, `NvmlError`.

Only the NVML source modules import pynvml's exceptions: collectors see `GpuLostError`,
`NvmlError` and typed results.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import pynvml

# Errors that mean "this GPU or driver does not report this value": absent, not failed.
ABSENT: Final = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_NoPermission,
)
_FIELD_VALUE_ATTRS: Final = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
# nvmlFieldValue_t as bytes (fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn,
# the value union), and the union's member per valueType, in `_FIELD_VALUE_ATTRS`' order:
# a batch of a hundred values is decoded by one C-level unpack, not five attribute reads each.
_FIELD_RECORD: Final = struct.Struct("@IIqqII8s")
_FIELD_UNION: Final = tuple(struct.Struct("@" + code) for code in "dILQqiH")
_FIELD_RECORD_MATCHES: Final = (
    _FIELD_RECORD.size == ctypes.sizeof(pynvml.c_nvmlFieldValue_t)
    and struct.calcsize("@" + "IIqqIIQ" * 2) == 2 * _FIELD_RECORD.size
)


class GpuLostError(Exception):
    """A GPU answered `GPU_IS_LOST`: it fell off the bus; drop it, keep the others."""

    def __init__(self, index: int) -> None:
        super().__init__(f"GPU {index} is lost (fallen off the bus)")
        self.index = index


class NvmlError(Exception):
    """An NVML call failed, not for lack of support and not from a lost GPU.

    `call` is the NVML function, `error` pynvml's short error name (`Timeout`, `InUse`,
    `Unknown`): a bounded value fit for a label or a log field.
    """

    def __init__(self, call: str, error: str, *, gpu: int | None = None) -> None:
        where = "" if gpu is None else f" on GPU {gpu}"
        super().__init__(f"{call} failed{where}: {error}")
        self.call = call
        self.error = error
        self.gpu = gpu


@dataclass(frozen=True, kw_only=True)
class CallFailure:
    """One NVML call that failed in a way that is not "not supported"."""

    call: str
    error: str


def error_name(exc: pynvml.NVMLError) -> str:
    """`NVMLError_Timeout` → `Timeout`: a short, bounded label value. A code this pynvml
    has no class for (a newer driver's) is `Unrecognized`; its number is in `str(exc)`."""
    name = type(exc).__name__
    return "Unrecognized" if name == "NVMLError" else name.removeprefix("NVMLError_")


@contextlib.contextmanager
def classified(call: str, *, gpu: int | None = None) -> Iterator[None]:
    """Raise pynvml errors from the block as `GpuLostError` (for `gpu`) or `NvmlError`.

    "Not supported" is not handled here: a caller that can do without the value catches
    `ABSENT` itself, inside the block.
    """
    try:
        yield
    except pynvml.NVMLError_GpuIsLost as exc:
        if gpu is None:
            raise NvmlError(call, error_name(exc)) from exc
        raise GpuLostError(gpu) from exc
    except pynvml.NVMLError as exc:
        raise NvmlError(call, error_name(exc), gpu=gpu) from exc


def field_value(result: Any) -> float | None:
    """A field-value result as a number, or None when its own `nvmlReturn` failed."""
    if result.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    value_type = int(result.valueType)
    if not 0 <= value_type < len(_FIELD_VALUE_ATTRS):
        return None
    return float(getattr(result.value, _FIELD_VALUE_ATTRS[value_type]))


def field_values(results: Any) -> list[float | None]:
    """Every result of one nvmlDeviceGetFieldValues, as `field_value` reads each.

    pynvml answers a ctypes array of `c_nvmlFieldValue_t`: it is read as bytes in one pass
    (what `field_value` does per element costs more than the call itself on a batch of a
    hundred); anything else (the simulation's values) is read element by element.
    """
    if not (_FIELD_RECORD_MATCHES and isinstance(results, ctypes.Array)):
        return [field_value(result) for result in results]
    fields = _records(len(results)).unpack(bytes(results))
    return [
        (float(raw) if value_type == _ULL else _union_value(value_type, raw))
        if returned == pynvml.NVML_SUCCESS
        else None
        for value_type, returned, raw in zip(fields[4::7], fields[5::7], fields[6::7], strict=True)
    ]


_ULL: Final = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG  # counters: most of a batch


@functools.cache
def _records(count: int) -> struct.Struct:
    """`count` field-value records in one C-level unpack, each union read as its 8 bytes'
    unsigned integer (the union member of another value type is made from those bytes)."""
    return struct.Struct("@" + "IIqqIIQ" * count)


def _union_value(value_type: int, raw: int) -> float | None:
    """The union's member for `value_type` from its 8 bytes as an unsigned integer; None
    for a value type this code does not know."""
    if not 0 <= value_type < len(_FIELD_UNION):
        return None
    return float(_FIELD_UNION[value_type].unpack_from(raw.to_bytes(8, sys.byteorder))[0])


FieldId = int | tuple[int, int]
"""A field id, or (field id, scope id): the scope of a link-scoped field is the link."""


class FieldBatch:
    """A fixed list of field ids asked of one GPU in one nvmlDeviceGetFieldValues.

    pynvml builds its argument array anew on every call, two attribute writes through its
    structure's Python `__setattr__` per id (about 0.9 ms for a GPU's 126 NVLink ids, more
    than NVML takes to answer). When `lib` is pynvml itself the array is made once here and
    NVML's C function (of the library pynvml loaded) is called on it every cycle; another
    `lib` (the simulation's NVML, a timing wrapper) is called as `nvmlDeviceGetFieldValues`.
    One batch is read by one thread at a time (its collector's worker).
    """

    def __init__(self, lib: Any, ids: Sequence[FieldId]) -> None:
        self.ids = tuple(ids)
        self._array: ctypes.Array[Any] | None = None
        function = (
            _c_function("nvmlDeviceGetFieldValues")
            if lib is pynvml and _FIELD_RECORD_MATCHES
            else None
        )
        if function is None or not self.ids:
            return
        self._function = function
        self._array = (pynvml.c_nvmlFieldValue_t * len(self.ids))()
        for slot, key in zip(self._array, self.ids, strict=True):
            slot.fieldId, slot.scopeId = key if isinstance(key, tuple) else (key, 0)
        self._count = ctypes.c_int32(len(self.ids))

    @property
    def prepared(self) -> bool:
        """Whether the batch calls NVML's C function on its own array (else `lib`'s)."""
        return self._array is not None

    def read(self, calls: Calls, handle: Any) -> dict[FieldId, float | None]:
        """Each id's value (None: not answered), or {} when the call failed (sorted by
        `calls` as any failed call: a lost GPU raises)."""
        if self._array is None:
            return calls.fields(handle, self.ids)
        returned = self._function(handle, self._count, ctypes.byref(self._array))
        if returned != pynvml.NVML_SUCCESS:
            calls.sort("nvmlDeviceGetFieldValues", pynvml.NVMLError(returned))
            return {}
        return dict(zip(self.ids, field_values(self._array), strict=True))


@functools.cache
def _c_function(name: str) -> Any:
    """NVML's C function `name` from the library pynvml loads (loading the same name again
    returns the loaded library), or None where it cannot be loaded."""
    try:
        return getattr(ctypes.CDLL("libnvidia-ml.so.1"), name)
    except (OSError, AttributeError):
        return None


def nvlink_error_counter(lib: Any) -> Callable[[Any, int, int], int]:
    """`nvmlDeviceGetNvLinkErrorCounter(handle, link, counter)` for one thread's use: NVML's C
    function on an output made here when `lib` is pynvml itself (pynvml's wrapper looks the
    function up under a lock and makes three ctypes objects every call: a third of the call's
    CPU on the mock, 432 calls a DGX H100 cycle), else `lib`'s (the simulation's NVML, a
    wrapper that injects faults). A failed call raises pynvml's `NVMLError` of its code, as
    pynvml's does."""
    function = _c_function("nvmlDeviceGetNvLinkErrorCounter") if lib is pynvml else None
    if function is None:
        return cast("Callable[[Any, int, int], int]", lib.nvmlDeviceGetNvLinkErrorCounter)
    out = ctypes.c_ulonglong()
    into = ctypes.byref(out)

    def read(handle: Any, link: int, counter: int) -> int:
        returned = function(handle, link, counter, into)
        if returned != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(returned)
        return out.value

    return read


class Calls:
    """Runs NVML calls for one GPU and one cycle, sorting each failure by what it means.

    A value is absent (None) when not supported or failed; failures are kept in
    `failures` for the reading; a lost GPU raises `GpuLostError`.
    """

    def __init__(self, lib: Any, gpu: int) -> None:
        self._lib = lib
        self.gpu = gpu
        self.failures: list[CallFailure] = []

    def get(self, call: str, *args: Any) -> Any:
        """The call's result, or None when absent or failed (failures are recorded)."""
        try:
            return getattr(self._lib, call)(*args)
        except pynvml.NVMLError as exc:
            self.sort(call, exc)
            return None

    def sort(self, call: str, exc: pynvml.NVMLError) -> None:
        """File a failure of `call` the caller caught: absent says nothing, a lost GPU
        raises `GpuLostError`, anything else is recorded in `failures`."""
        if isinstance(exc, pynvml.NVMLError_GpuIsLost):
            raise GpuLostError(self.gpu) from exc
        if not isinstance(exc, ABSENT):
            self.failures.append(CallFailure(call=call, error=error_name(exc)))

    def number(self, call: str, *args: Any) -> float | None:
        value = self.get(call, *args)
        return None if value is None else float(value)

    def fields(self, handle: Any, ids: Sequence[FieldId]) -> dict[FieldId, float | None]:
        """One batched nvmlDeviceGetFieldValues; each value checked on its own nvmlReturn.

        Keys are the requested ids (`field` or `(field, scope)`); a failed batch gives {}.
        """
        results = self.get("nvmlDeviceGetFieldValues", handle, list(ids))
        if results is None:
            return {}
        return dict(zip(ids, field_values(results), strict=True))
