"""Simulator fault kinds of one GPU: heat, clocks, activity, memory errors, Xids, a GPU
lost or off the bus, a hung NVML call, MIG changes.

Each kind declares its scenario keys as fields (fault_params.py) and overrides the hooks
(fault_base.py) of the readings it changes; faults.py lists it in `FAULT_KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from fleetwatch.sim.fault_base import Fault, GpuFault, Readings
from fleetwatch.sim.fault_params import GPU, PER_SECOND, SECONDS, choice, integer, number, param

THROTTLE_REASONS: Final = (
    "gpu_idle",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake",
)
ECC_SEVERITIES: Final = ("corrected", "uncorrected")
ROW_REMAP_EVENTS: Final = ("correctable", "uncorrectable", "pending", "failure")


@dataclass(frozen=True, kw_only=True)
class Temperature(GpuFault):
    """Ramps the GPU (and HBM) temperature linearly to `celsius` over `ramp_seconds`; a
    later fault ramps from there."""

    KIND = "temperature"

    celsius: float = field(metadata=number("target die temperature (°C)", low=0, high=130))
    ramp_seconds: float = field(
        default=0.0, metadata=number("seconds to reach it (0: at once)", low=0, high=1e6)
    )
    seconds: float | None = field(default=None, metadata=SECONDS)

    def temperature(self, gpu: int, value: float, t: float, node: Readings) -> float:
        if gpu != self.gpu or not self.active(t):
            return value
        ramp = self.ramp_seconds
        progress = 1.0 if ramp <= 0 else min(1.0, (t - self.at) / ramp)
        start = (
            node.gpu_temperature(gpu, self.at - 1e-9) if self.at > 0 else node.base_temperature(gpu)
        )
        return start + (self.celsius - start) * progress


@dataclass(frozen=True, kw_only=True)
class Xid(GpuFault):
    """An Xid event (NVML event and kernel-log record; one before the exporter started is
    kernel-log history)."""

    KIND = "xid"

    xid: int = field(metadata=integer("Xid number", low=1, high=1000))

    def xid_events(self) -> tuple[tuple[float, int, int], ...]:
        return ((self.at, self.gpu, self.xid),)


@dataclass(frozen=True, kw_only=True)
class GpuLost(GpuFault):
    """NVML loses the GPU (as after Xid 79): its calls raise `GpuIsLost`; it stays a PCI
    function in sysfs, so `fleetwatch_gpus_pci_present` still counts it."""

    KIND = "gpu_lost"

    def lost_gpus(self) -> tuple[int, ...]:
        return (self.gpu,)


@dataclass(frozen=True, kw_only=True)
class GpuOffBus(GpuFault):
    """The GPU falls off the PCI bus (a PCIe surprise removal, or a GPU that did not
    enumerate): its calls raise `GpuIsLost`, it leaves `bus/pci/devices`, and the kernel log
    records `GPU has fallen off the bus`."""

    KIND = "gpu_off_bus"

    def lost_gpus(self) -> tuple[int, ...]:
        return (self.gpu,)

    def bus_removals(self) -> tuple[int, ...]:
        return (self.gpu,)


@dataclass(frozen=True, kw_only=True)
class Hang(Fault):
    """That NVML call blocks like a wedged driver for `seconds` (for every GPU, or only
    `gpu`)."""

    KIND = "hang"

    call: str = field(
        metadata=param(
            "NVML function, as pynvml names it",
            "e.g. `nvmlDeviceGetPowerUsage`",
            lambda check, value, key, _hw: check.string(value, key),
        )
    )
    seconds: float = field(metadata=number("how long calls block", low=0, high=1e7))
    gpu: int | None = field(default=None, metadata=GPU)

    def hang_calls(self) -> frozenset[str]:
        return frozenset({self.call})

    def hang_remaining(self, call: str, gpu: int | None, t: float) -> float:
        if call != self.call or not self.active(t) or self.gpu not in (None, gpu):
            return 0.0
        return self.at + self.seconds - t


@dataclass(frozen=True, kw_only=True)
class Throttle(GpuFault):
    """A clock-event reason is active; the SM clock drops unless it is `gpu_idle` or
    `sync_boost`."""

    KIND = "throttle"

    reason: str = field(metadata=choice("clock-event reason", THROTTLE_REASONS))
    seconds: float | None = field(default=None, metadata=SECONDS)

    def throttle_reasons(self, gpu: int, t: float) -> frozenset[str]:
        return frozenset({self.reason}) if gpu == self.gpu and self.active(t) else frozenset()

    def throttle_seconds(self, gpu: int, reason: str, t: float) -> float:
        return self.elapsed_active(t) if (gpu, reason) == (self.gpu, self.reason) else 0.0


@dataclass(frozen=True, kw_only=True)
class TensorActive(GpuFault):
    """Tensor-core activity is set to `value`; SM activity, power and NVLink traffic follow
    it."""

    KIND = "tensor_active"

    value: float = field(metadata=number("tensor-core activity", low=0, high=1.0))
    seconds: float | None = field(default=None, metadata=SECONDS)

    def tensor_active(self, gpu: int, value: float, t: float) -> float:
        return self.value if gpu == self.gpu and self.active(t) else value


@dataclass(frozen=True, kw_only=True)
class EccErrors(GpuFault):
    """ECC error counters of `error` grow by `per_second`."""

    KIND = "ecc_errors"

    error: str = field(metadata=choice("severity", ECC_SEVERITIES))
    per_second: float = field(metadata=PER_SECOND)
    seconds: float | None = field(default=None, metadata=SECONDS)

    def ecc_errors(self, gpu: int, severity: str, t: float) -> float:
        if (gpu, severity) != (self.gpu, self.error):
            return 0.0
        return self.per_second * self.elapsed_active(t)


@dataclass(frozen=True, kw_only=True)
class RowRemap(GpuFault):
    """A row remap event: a remapped row by cause, or the pending/failure flag."""

    KIND = "row_remap"

    error: str = field(metadata=choice("event", ROW_REMAP_EVENTS))

    def row_remaps(self, gpu: int) -> tuple[str, ...]:
        return (self.error,) if gpu == self.gpu else ()


@dataclass(frozen=True, kw_only=True)
class MigMode(GpuFault):
    """The GPU switches MIG mode (as `nvidia-smi -mig` and a GPU reset do) while the
    exporter runs: enabled, it holds the scenario's `mig` instances; disabled, none (needs
    a `mig` section: without it the fake NVML answers NotSupported to MIG calls)."""

    KIND = "mig_mode"

    mode: str = field(metadata=choice("MIG mode from then on", ("enabled", "disabled")))

    def mig_enabled(self, gpu: int, value: bool, t: float) -> bool:
        return self.mode == "enabled" if gpu == self.gpu else value


@dataclass(frozen=True, kw_only=True)
class MigInstanceGone(GpuFault):
    """A MIG instance disappears under the exporter: its slot still yields a handle, but
    every call on that handle answers NotFound."""

    KIND = "mig_instance_gone"

    slot: int = field(metadata=integer("MIG slot", low=0, high=6))
    seconds: float | None = field(default=None, metadata=SECONDS)

    def mig_gone(self, gpu: int, slot: int, t: float) -> bool:
        return gpu == self.gpu and slot == self.slot and self.active(t)
