"""Every NVML call the GPU collectors make, failing with every NVML error code, on the mock NVML.

Run as its own process (`python -m tests.faults.nvml_error_drive`), by
`tests/faults/test_nvml_error_codes.py`: it loads NVIDIA's mock NVML (FLEETWATCH_NVML_MOCK,
H100 profile) into this process, which the test process must not do (pynvml keeps the library
it loaded for good, and other tests expect no driver). It builds the exporter's own NVML
collectors (`fleetwatch.exporter.export.create_collectors`, the flags of `fleetwatch export`)
on the real pynvml seen through `FailingNvml`, which makes one NVML function raise one
`NVMLError` code, for one GPU's handle (GPU 2) or, for a call that takes no GPU handle, for
every call.

First a clean cycle records which collector calls which function, and the series each
exports. Then, for every (function, code) pair, including a code pynvml has never heard of,
each collector that calls the function runs one cycle with the fault and one after it is
lifted. Printed as JSON: the pairs tried, and each broken expectation:
- `escaped`: something that is not an `Exception` left `collect()` (it would end the
  collector's worker thread; an `Exception` is the engine's to report as the collector down);
- `others`: with a fault on GPU 2's handle, another GPU's series changed;
- `extra`: a series the clean cycle did not export (a value made up from the failure);
- `stale`: GPU 2's series kept while its call failed with a code that is an error (the value
  is absent, or the whole GPU dropped for `GPU_IS_LOST`, never the last value again);
- `uncounted`: an error code (not "not supported", not a lost GPU) neither counted in the
  collector's `*_nvml_errors_total{call,error}` nor raised naming the call;
- `unbounded`: an `error` label value that is not one of NVML's error names;
- `not_back`: the cycle after the fault is lifted lacks a series of the clean cycle.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from fleetwatch.cli import parse_args
from fleetwatch.collectors import COLLECTORS
from fleetwatch.collectors.base import CollectorContext
from fleetwatch.collectors.sources.nvml_calls import ABSENT, error_name
from fleetwatch.exporter.export import create_collectors
from fleetwatch.exporter.settings import ExportSettings
from testbed.nvmlmock import LIBRARY, NON_NVML, NvmlMock

FAULTY_GPU = 2
UNKNOWN_CODE = 12345  # a code no NVML release has defined
Key = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class Fault:
    call: str
    code: int


@dataclass
class FailingNvml:
    """pynvml, with `fault` (when set) raised by its function for GPU 2's handle, or for every
    call of a function that takes no GPU handle; `called` records which functions ran."""

    lib: Any
    fault: Fault | None = None
    fired: int = 0  # faults raised
    called: set[str] = field(default_factory=set)
    per_gpu: set[str] = field(default_factory=set)  # functions called with a GPU handle
    handles: dict[int, int] = field(default_factory=dict)  # handle address -> index

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.lib, name)
        if not (name.startswith("nvml") and callable(attr)):
            return attr
        return self._wrapped(name, attr)

    def _gpu_of(self, args: tuple[Any, ...]) -> int | None:
        if not args or not isinstance(args[0], self.lib.c_nvmlDevice_t):
            return None
        return self.handles.get(ctypes.cast(args[0], ctypes.c_void_p).value or 0, -1)

    def _wrapped(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.called.add(name)
            gpu = self._gpu_of(args)
            if gpu is not None:
                self.per_gpu.add(name)
            fault = self.fault
            if fault is not None and fault.call == name and gpu in (None, FAULTY_GPU):
                self.fired += 1
                raise self.lib.NVMLError(fault.code)
            result = function(*args, **kwargs)
            if name == "nvmlDeviceGetHandleByIndex":
                self.handles[ctypes.cast(result, ctypes.c_void_p).value or 0] = int(args[0])
            return result

        return call


def series(families: list[Any]) -> set[Key]:
    return {
        (family.spec.name, tuple(sorted(labels.items())))
        for family in families
        for labels, value in zip(family.labels, family.values, strict=True)
        if value is not None
    }


def error_series(keys: set[Key]) -> set[tuple[str, str]]:
    """(call, error) of every `*_nvml_errors_total` series."""
    found = set()
    for name, labels in keys:
        if name.endswith("nvml_errors_total"):
            as_dict = dict(labels)
            found.add((as_dict.get("call", ""), as_dict.get("error", "")))
    return found


def gpu_of(key: Key) -> str | None:
    return dict(key[1]).get("gpu")


def cycle(collector: Any) -> tuple[set[Key] | None, BaseException | None]:
    try:
        return series(list(collector.collect())), None
    except BaseException as exc:  # sorted by the caller: an Exception is the engine's
        return None, exc


def build(nvml: FailingNvml) -> dict[str, Any]:

    empty = Path(tempfile.mkdtemp())
    args = parse_args(
        [
            "export",
            *NON_NVML,
            "--no-collector.xid",
            f"--path.sysfs={empty}",
            f"--path.procfs={empty}",
        ]
    )
    settings = ExportSettings.from_args(args, COLLECTORS)
    context = CollectorContext(
        sysfs_root=settings.sysfs_root,
        procfs_root=settings.procfs_root,
        rootfs_root=settings.rootfs_root,
        nvml=nvml,
    )
    return create_collectors(context, settings)


def codes(lib: Any) -> list[tuple[int, str]]:
    """Every NVML error code pynvml names, and one it does not; "not supported" last, since
    the source stops asking a GPU for what it once said it does not support."""
    known = [(int(getattr(lib, n)), n) for n in sorted(dir(lib)) if n.startswith("NVML_ERROR_")]
    known.append((UNKNOWN_CODE, "unknown"))
    return sorted(known, key=lambda code: isinstance(lib.NVMLError(code[0]), ABSENT))


def main() -> int:
    mock = NvmlMock.from_environment()
    if "MOCK_NVML_CONFIG" not in os.environ:
        # The mock (Go) reads the environment the process started with: start again with it.
        overrides = Path(tempfile.mkdtemp()) / "overrides.yaml"
        overrides.write_text("version: 1\n")
        os.environ["MOCK_NVML_CONFIG"] = str(mock.profile("h100"))
        os.environ["MOCK_NVML_OVERRIDES"] = str(overrides)
        os.execv(sys.executable, [sys.executable, "-m", __spec__.name])
    ctypes.CDLL(str(mock.root / LIBRARY), mode=ctypes.RTLD_GLOBAL)  # found by its soname
    nvml = FailingNvml(lib=pynvml)
    collectors = build(nvml)
    clean: dict[str, set[Key]] = {}
    calls: dict[str, set[str]] = {}
    for name, collector in collectors.items():
        cycle(collector)  # GPM ratios need a first sample
        nvml.called.clear()
        keys, error = cycle(collector)
        if keys is None:
            raise SystemExit(f"{name} failed on the clean mock: {error!r}")
        clean[name], calls[name] = keys, set(nvml.called)
    names = {error_name(pynvml.NVMLError(code)) for code, _ in codes(pynvml)}
    tried = 0
    untried: list[str] = []
    broken: list[dict[str, Any]] = []
    for call in sorted(set().union(*calls.values())):
        for code, code_name in codes(pynvml):
            exc = pynvml.NVMLError(code)
            absent = isinstance(exc, ABSENT)
            lost = isinstance(exc, pynvml.NVMLError_GpuIsLost)
            for name, collector in collectors.items():
                if call not in calls[name]:
                    continue
                before, _ = cycle(collector)
                nvml.fault, fired = Fault(call=call, code=code), nvml.fired
                keys, error = cycle(collector)
                nvml.fault = None
                if nvml.fired == fired:  # asked no more: "not supported" before, or lost
                    untried.append(f"{call} {code_name} ({name})")
                    continue
                tried += 1
                after, _ = cycle(collector)
                if name == "gpm":  # a ratio needs a new pair of samples after a failure
                    after, _ = cycle(collector)
                where = {"call": call, "code": code_name, "collector": name}
                problems = check(
                    clean=before or set(),
                    keys=keys,
                    error=error,
                    per_gpu=call in nvml.per_gpu,
                    absent=absent,
                    lost=lost,
                    call=call,
                    names=names,
                )
                # "Not supported" is the GPU's answer for good where the source remembers
                # it (fabric info, GPM support): only those series may stay away.
                expected = {
                    k for k in before or set() if not (absent and gpu_of(k) == str(FAULTY_GPU))
                }
                if after is None or not expected <= after:
                    missing = expected - (after or set())
                    problems.append(("not_back", sorted(map(str, missing))[:3]))
                broken.extend({**where, "problem": p, "detail": d} for p, d in problems)
    print(
        json.dumps(
            {
                "tried": tried,
                "untried": untried,
                "codes": len(codes(pynvml)),
                "pairs": sum(len(c) for c in calls.values()),
                "calls": sorted(set().union(*calls.values())),
                "broken": broken,
            }
        )
    )
    return 0


def check(
    *,
    clean: set[Key],
    keys: set[Key] | None,
    error: BaseException | None,
    per_gpu: bool,
    absent: bool,
    lost: bool,
    call: str,
    names: set[str],
) -> list[tuple[str, Any]]:
    """The broken expectations of one faulty cycle."""
    if keys is None:
        if not isinstance(error, Exception):
            return [("escaped", repr(error))]
        if absent or lost or call in str(error):
            return []
        return [("uncounted", f"raised {error!r}")]
    problems: list[tuple[str, Any]] = []
    errors = error_series(keys)
    extra = {k for k in keys - clean if not k[0].endswith("nvml_errors_total")}
    if extra:
        problems.append(("extra", sorted(map(str, extra))[:3]))
    if {e for _, e in errors} - names:
        problems.append(("unbounded", sorted(errors)))
    if per_gpu:
        faulty = str(FAULTY_GPU)
        others_now = {k for k in keys if gpu_of(k) not in (faulty, None)}
        others_clean = {k for k in clean if gpu_of(k) not in (faulty, None)}
        if others_now != others_clean:
            problems.append(("others", sorted(map(str, others_now ^ others_clean))[:3]))
        kept = {k for k in keys if gpu_of(k) == faulty} == {k for k in clean if gpu_of(k) == faulty}
        if not absent and kept:
            problems.append(("stale", "every series of GPU 2 kept"))
    if not (absent or lost) and not any(c == call for c, _ in errors):
        problems.append(("uncounted", sorted(errors)))
    return problems


if __name__ == "__main__":
    sys.exit(main())
