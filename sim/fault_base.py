"""The fault type every simulator fault kind derives from: its timing, its keys, its hooks.

A kind is a frozen dataclass deriving from `Fault`: `KIND` names it in scenario files, its
fields that carry a `Param` (fault_params.py) are its scenario keys, its docstring says what
it does to the simulated node (docs/simulation.md's fault table is generated from these),
and `check_references` checks what spans keys. Its effect is a set of hooks the simulated
node (world.py) folds over every fault that has started: each hook of `Fault` leaves its
reading alone, and a kind overrides the hooks of the readings it changes. So a new kind is
one class plus its entry in `FAULT_KINDS` (faults.py); only a reading the node has never
had needs a new hook here.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Protocol, Self

from fleetwatch.sim.checks import Checker
from fleetwatch.sim.fault_params import GPU, Hardware, Key, keys_of

# Keys every fault has: when it starts, and which kind it is.
COMMON_KEYS: Final = frozenset({"at", "kind"})
MAX_AT_SECONDS: Final = 1e7


class _ToTheEnd:
    """`Fault.seconds` of a kind without a `seconds` key: None, the fault lasts to the end.

    A descriptor without `__set__`, so a kind's own `seconds` field, required (`hang`) or
    not, is set on the instance by the frozen dataclass's `__init__`; a property would refuse
    that. The kind declares the field where its key goes in the docs' order.
    """

    def __get__(self, instance: object, owner: type | None = None) -> float | None:
        return None


class Readings(Protocol):
    """What a fault's effect may read from the simulated node."""

    def gpu_temperature(self, gpu: int, t: float | None = None) -> float: ...

    def base_temperature(self, gpu: int) -> float: ...


@dataclass(frozen=True, kw_only=True)
class Fault:
    """A timed fault. `at` is seconds after the exporter starts; `seconds` bounds it.

    Subclasses are the kinds: `KIND` names one in scenario files, its fields with a `Param`
    are its keys, the docstring says its effect, and the hooks below that it overrides change
    readings. The node calls each hook only on faults that have started (`at` <= the time
    asked).
    """

    KIND: ClassVar[str]

    at: float
    seconds = _ToTheEnd()
    """How long the fault lasts (None: to the end); a kind with a `seconds` key overrides it
    with a field."""

    @property
    def kind(self) -> str:
        """The kind's name in scenario files."""
        return self.KIND

    @classmethod
    def scenario_keys(cls) -> tuple[Key, ...]:
        """The kind's scenario keys besides `at` and `kind`, in the docs' order."""
        return keys_of(cls)

    @classmethod
    def effect(cls) -> str:
        """What the fault does, from the docstring (one paragraph, for the docs' table)."""
        return " ".join(inspect.cleandoc(cls.__doc__ or "").split())

    @classmethod
    def parse(cls, check: Checker, data: dict[str, Any], key: str, hardware: Hardware) -> Self:
        """Check the keys of one `faults[]` entry at `key` and build the fault."""
        keys = cls.scenario_keys()
        names = frozenset(k.name for k in keys)
        required = frozenset(k.name for k in keys if k.required)
        check.keys(data, key, required | COMMON_KEYS, names | COMMON_KEYS)
        values: dict[str, Any] = {
            "at": check.number(data["at"], f"{key}.at", low=0, high=MAX_AT_SECONDS)
        }
        for each in sorted(keys, key=lambda k: k.name):
            if each.name in data:
                values[each.name] = each.param.parse(
                    check, data[each.name], f"{key}.{each.name}", hardware
                )
        fault = cls(**values)
        fault.check_references(check, key, hardware)
        return fault

    def check_references(self, check: Checker, key: str, hardware: Hardware) -> None:
        """Checks across keys (a port within its HCA's ports); none by default."""

    def active(self, t: float) -> bool:
        """True while the fault applies at simulated time `t`."""
        return t >= self.at and (self.seconds is None or t < self.at + self.seconds)

    def elapsed_active(self, t: float) -> float:
        """Seconds this fault has been applying by time `t` (0 before it starts)."""
        end = t if self.seconds is None else min(t, self.at + self.seconds)
        return max(0.0, end - self.at)

    # -- Effects: by default a fault changes no reading and counts nothing -------------
    def temperature(self, gpu: int, value: float, t: float, node: Readings) -> float:
        """The GPU die temperature (°C) after this fault, given `value` before it."""
        return value

    def tensor_active(self, gpu: int, value: float, t: float) -> float:
        """Tensor-core activity (0..1) after this fault, given `value` before it."""
        return value

    def throttle_reasons(self, gpu: int, t: float) -> frozenset[str]:
        """Clock-event reasons this fault holds active."""
        return frozenset()

    def throttle_seconds(self, gpu: int, reason: str, t: float) -> float:
        """Seconds this fault has held `reason` active (violation-time counters)."""
        return 0.0

    def xid_events(self) -> tuple[tuple[float, int, int], ...]:
        """(time, gpu, xid) of the Xids this fault reports."""
        return ()

    def lost_gpus(self) -> tuple[int, ...]:
        """GPUs NVML answers `GpuIsLost` for."""
        return ()

    def bus_removals(self) -> tuple[int, ...]:
        """GPUs that have fallen off the PCI bus."""
        return ()

    def ecc_errors(self, gpu: int, severity: str, t: float) -> float:
        """ECC errors of `severity` this fault has counted."""
        return 0.0

    def row_remaps(self, gpu: int) -> tuple[str, ...]:
        """Row remap events (`ROW_REMAP_EVENTS`, gpu_faults.py) this fault has caused."""
        return ()

    def fabric_degraded(self, gpu: int, t: float) -> bool:
        """True while this fault holds the GPU's NVLink-fabric bandwidth down."""
        return False

    def nvlink_down(self, gpu: int, link: int, t: float) -> bool:
        """True while this fault holds the NVLink down."""
        return False

    def mig_enabled(self, gpu: int, value: bool, t: float) -> bool:
        """The GPU's MIG mode after this fault, given `value` before it."""
        return value

    def mig_gone(self, gpu: int, slot: int, t: float) -> bool:
        """True while this fault holds the MIG instance in `slot` destroyed under its handle."""
        return False

    def nvlink_errors(self, gpu: int, link: int, error: str, t: float) -> float:
        """NVLink errors of `error` this fault has counted."""
        return 0.0

    def hang_calls(self) -> frozenset[str]:
        """NVML calls this fault may block (asked of every fault, started or not)."""
        return frozenset()

    def hang_remaining(self, call: str, gpu: int | None, t: float) -> float:
        """Seconds a call made now must block for."""
        return 0.0

    def port_down(self, device: str, port: int, t: float) -> bool:
        """True while this fault holds the InfiniBand port down."""
        return False

    def port_rate(self, device: str, port: int, rate: float, t: float) -> float:
        """The port's link rate (Gb/s) after this fault, given `rate` before it."""
        return rate

    def port_flaps(self, device: str, port: int) -> int:
        """Times this fault took the port down."""
        return 0

    def port_down_seconds(self, device: str, port: int, t: float) -> float:
        """Seconds this fault has held the port down (no traffic flows)."""
        return 0.0

    def port_errors(self, device: str, port: int, error: str, t: float) -> float:
        """Port errors of `error` this fault has counted (before saturation)."""
        return 0.0

    def mount_slowdown(self, mountpoint: str, t: float) -> float:
        """What this fault divides the mount's write rate by (and multiplies its round trip
        by), now."""
        return 1.0

    def mount_hang_remaining(self, mountpoint: str, t: float) -> float:
        """Seconds a call on the mount made now must block for."""
        return 0.0

    def mount_read_only(self, mountpoint: str, t: float) -> bool:
        """True while this fault holds the mount read-only."""
        return False

    def mount_filled_bytes(self, mountpoint: str, t: float) -> float:
        """Bytes of the mount this fault has filled by time `t`."""
        return 0.0


@dataclass(frozen=True, kw_only=True)
class GpuFault(Fault):
    """A fault of one GPU."""

    gpu: int = field(metadata=GPU)
