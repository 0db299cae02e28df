"""Simulator fault kinds: one type per kind, with its parameters, validation and effect.

A scenario's `faults:` list names a kind per entry; `FAULT_KINDS` maps the kind to its type.
Each type declares its parameters (`PARAMS`: name, meaning, bounds, how a value is checked),
checks references to the scenario's hardware (a GPU index, an NVLink, an HCA and its ports)
with the same `ScenarioError` wording as the rest of the scenario, and says in its docstring
what it does to the simulated node (docs/simulation.md's fault table is generated from
these). Its effect is a set of hooks the simulated node (world.py) folds over every fault that
has started: each hook of `Fault` leaves its reading alone, and a kind overrides the hooks of
the readings it changes. So a new kind is one class here plus its entry in `FAULT_KINDS`;
only a reading the node has never had needs a new hook.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol, Self

from fleetwatch.sim.checks import Checker

NVLINK_ERRORS: Final = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")
THROTTLE_REASONS: Final = (
    "gpu_idle",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake",
)
IB_ERRORS: Final = (
    "symbol",
    "link_error_recovery",
    "link_downed",
    "rcv",
    "rcv_remote_physical",
    "rcv_switch_relay",
    "xmit_discards",
    "xmit_constraint",
    "rcv_constraint",
    "local_link_integrity",
    "excessive_buffer_overrun",
    "vl15_dropped",
    "xmit_wait",
)
ECC_SEVERITIES: Final = ("corrected", "uncorrected")
ROW_REMAP_EVENTS: Final = ("correctable", "uncorrectable", "pending", "failure")
# Keys every fault has: when it starts, and which kind it is.
COMMON_KEYS: Final = frozenset({"at", "kind"})
MAX_AT_SECONDS: Final = 1e7


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """What a fault may refer to: the scenario's GPU count, NVLinks per GPU and HCA ports."""

    gpus: int
    nvlinks_per_gpu: int
    ports: Mapping[str, int]
    """Port count per HCA device name, in scenario order."""
    mounts: tuple[str, ...] = ()
    """Mount points of the scenario's `mounts:`."""


Parse = Callable[[Checker, Any, str, Hardware], Any]


@dataclass(frozen=True, kw_only=True)
class Param:
    """One key of a fault: its meaning and bounds (for the docs) and how a value is checked."""

    name: str
    meaning: str
    bounds: str
    parse: Parse
    required: bool = True


def _figure(value: float) -> str:
    """A bound as the docs write it: `130`, `0.5`, `1e7`."""
    if value >= 1e5:
        return f"{value:.0e}".replace("e+0", "e").replace("e+", "e")
    return str(int(value)) if value == int(value) else f"{value:g}"


def number(name: str, meaning: str, *, low: float, high: float, required: bool = True) -> Param:
    """A number within `low..high`."""
    return Param(
        name=name,
        meaning=meaning,
        bounds=f"{_figure(low)}..{_figure(high)}",
        parse=lambda check, value, key, _hw: check.number(value, key, low=low, high=high),
        required=required,
    )


def integer(name: str, meaning: str, *, low: int, high: int) -> Param:
    """An integer within `low..high`."""
    return Param(
        name=name,
        meaning=meaning,
        bounds=f"{low}..{high}",
        parse=lambda check, value, key, _hw: check.integer(value, key, low=low, high=high),
    )


def choice(name: str, meaning: str, choices: tuple[str, ...]) -> Param:
    """One of a fixed set of names."""
    return Param(
        name=name,
        meaning=meaning,
        bounds=", ".join(f"`{c}`" for c in choices),
        parse=lambda check, value, key, _hw: check.string(value, key, choices=choices),
    )


def gpu_index(*, required: bool = True) -> Param:
    """A GPU of the scenario."""
    return Param(
        name="gpu",
        meaning="GPU index",
        bounds="0..`gpus`-1",
        parse=lambda check, value, key, hw: check.integer(value, key, low=0, high=hw.gpus - 1),
        required=required,
    )


NVLINK: Final = Param(
    name="link",
    meaning="NVLink index",
    bounds="0..`nvlinks_per_gpu`-1",
    parse=lambda check, value, key, hw: check.integer(
        value, key, low=0, high=hw.nvlinks_per_gpu - 1
    ),
)
DEVICE: Final = Param(
    name="device",
    meaning="HCA",
    bounds="an `infiniband` device",
    parse=lambda check, value, key, hw: check.string(value, key, choices=tuple(hw.ports)),
)
PORT: Final = Param(
    name="port",
    meaning="port of the HCA",
    bounds="1..its `ports`",
    # Checked against the HCA's `ports` once the device is known (`PortFault`).
    parse=lambda check, value, key, _hw: check.integer(value, key, low=1, high=4),
)
MOUNTPOINT: Final = Param(
    name="mountpoint",
    meaning="simulated mount",
    bounds="a `mounts` mount point",
    parse=lambda check, value, key, hw: check.string(value, key, choices=hw.mounts),
)
SECONDS: Final = number(
    "seconds", "how long it lasts (absent: to the end)", low=0, high=1e7, required=False
)
PER_SECOND: Final = number("per_second", "errors counted per second", low=0, high=1e9)


class Readings(Protocol):
    """What a fault's effect may read from the simulated node."""

    def gpu_temperature(self, gpu: int, t: float | None = None) -> float: ...

    def base_temperature(self, gpu: int) -> float: ...


@dataclass(frozen=True, kw_only=True)
class Fault:
    """A timed fault. `at` is seconds after the exporter starts; `seconds` bounds it.

    Subclasses are the kinds: `KIND` names one in scenario files, `PARAMS` lists its keys,
    the docstring says its effect, and the hooks below that it overrides change readings.
    The node calls each hook only on faults that have started (`at` <= the time asked).
    """

    KIND: ClassVar[str]
    PARAMS: ClassVar[tuple[Param, ...]]

    at: float
    seconds: float | None = None

    @property
    def kind(self) -> str:
        """The kind's name in scenario files."""
        return self.KIND

    @classmethod
    def effect(cls) -> str:
        """What the fault does, from the docstring (one paragraph, for the docs' table)."""
        return " ".join(inspect.cleandoc(cls.__doc__ or "").split())

    @classmethod
    def parse(cls, check: Checker, data: dict[str, Any], key: str, hardware: Hardware) -> Self:
        """Check the keys of one `faults[]` entry at `key` and build the fault."""
        names = frozenset(p.name for p in cls.PARAMS)
        required = frozenset(p.name for p in cls.PARAMS if p.required)
        check.keys(data, key, required | COMMON_KEYS, names | COMMON_KEYS)
        values: dict[str, Any] = {
            "at": check.number(data["at"], f"{key}.at", low=0, high=MAX_AT_SECONDS)
        }
        for param in sorted(cls.PARAMS, key=lambda p: p.name):
            if param.name in data:
                values[param.name] = param.parse(
                    check, data[param.name], f"{key}.{param.name}", hardware
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
        """Row remap events (`ROW_REMAP_EVENTS`) this fault has caused."""
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

    gpu: int


@dataclass(frozen=True, kw_only=True)
class PortFault(Fault):
    """A fault of one InfiniBand port."""

    device: str
    port: int

    def check_references(self, check: Checker, key: str, hardware: Hardware) -> None:
        """The port exists on its HCA."""
        ports = hardware.ports[self.device]
        if self.port > ports:
            raise check.fail(f"{key}.port", f"{self.device} has {ports} port(s)")

    def on(self, device: str, port: int) -> bool:
        """This fault is of that port."""
        return self.device == device and self.port == port


@dataclass(frozen=True, kw_only=True)
class Temperature(GpuFault):
    """Ramps the GPU (and HBM) temperature linearly to `celsius` over `ramp_seconds`; a
    later fault ramps from there."""

    KIND = "temperature"
    PARAMS = (
        gpu_index(),
        number("celsius", "target die temperature (°C)", low=0, high=130),
        number("ramp_seconds", "seconds to reach it (0: at once)", low=0, high=1e6, required=False),
        SECONDS,
    )

    celsius: float
    ramp_seconds: float = 0.0

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
class NvlinkErrors(GpuFault):
    """An NVLink error counter grows by `per_second`."""

    KIND = "nvlink_errors"
    PARAMS = (
        gpu_index(),
        NVLINK,
        choice("error", "error counter", NVLINK_ERRORS),
        PER_SECOND,
        SECONDS,
    )

    link: int
    error: str
    per_second: float

    def nvlink_errors(self, gpu: int, link: int, error: str, t: float) -> float:
        if (gpu, link, error) != (self.gpu, self.link, self.error):
            return 0.0
        return self.per_second * self.elapsed_active(t)


@dataclass(frozen=True, kw_only=True)
class NvlinkDown(GpuFault):
    """The link reads inactive."""

    KIND = "nvlink_down"
    PARAMS = (gpu_index(), NVLINK, SECONDS)

    link: int

    def nvlink_down(self, gpu: int, link: int, t: float) -> bool:
        return (gpu, link) == (self.gpu, self.link) and self.active(t)


@dataclass(frozen=True, kw_only=True)
class IbPortDown(PortFault):
    """The port goes DOWN/Polling (a flap when `seconds` is set; `link_downed` counts it) and
    carries no traffic."""

    KIND = "ib_port_down"
    PARAMS = (DEVICE, PORT, SECONDS)

    def port_down(self, device: str, port: int, t: float) -> bool:
        return self.on(device, port) and self.active(t)

    def port_flaps(self, device: str, port: int) -> int:
        return 1 if self.on(device, port) else 0

    def port_down_seconds(self, device: str, port: int, t: float) -> float:
        return self.elapsed_active(t) if self.on(device, port) else 0.0


@dataclass(frozen=True, kw_only=True)
class IbErrors(PortFault):
    """A port error counter grows by `per_second`, saturating at its PMA width in sysfs."""

    KIND = "ib_errors"
    PARAMS = (DEVICE, PORT, choice("error", "error counter", IB_ERRORS), PER_SECOND, SECONDS)

    error: str
    per_second: float

    def port_errors(self, device: str, port: int, error: str, t: float) -> float:
        if not self.on(device, port) or error != self.error:
            return 0.0
        return self.per_second * self.elapsed_active(t)


@dataclass(frozen=True, kw_only=True)
class IbRate(PortFault):
    """The link trains at `value` Gb/s (0 leaves the HCA's `rate_gbps`)."""

    KIND = "ib_rate"
    PARAMS = (DEVICE, PORT, number("value", "link rate (Gb/s)", low=0, high=1600.0), SECONDS)

    value: float

    def port_rate(self, device: str, port: int, rate: float, t: float) -> float:
        return self.value if self.on(device, port) and self.active(t) and self.value else rate


@dataclass(frozen=True, kw_only=True)
class Xid(GpuFault):
    """An Xid event (NVML event and kernel-log record; one before the exporter started is
    kernel-log history)."""

    KIND = "xid"
    PARAMS = (gpu_index(), integer("xid", "Xid number", low=1, high=1000))

    xid: int

    def xid_events(self) -> tuple[tuple[float, int, int], ...]:
        return ((self.at, self.gpu, self.xid),)


@dataclass(frozen=True, kw_only=True)
class GpuLost(GpuFault):
    """NVML loses the GPU (as after Xid 79): its calls raise `GpuIsLost`; it stays a PCI
    function in sysfs, so `fleetwatch_gpus_pci_present` still counts it."""

    KIND = "gpu_lost"
    PARAMS = (gpu_index(),)

    def lost_gpus(self) -> tuple[int, ...]:
        return (self.gpu,)


@dataclass(frozen=True, kw_only=True)
class GpuOffBus(GpuFault):
    """The GPU falls off the PCI bus (a PCIe surprise removal, or a GPU that did not
    enumerate): its calls raise `GpuIsLost`, it leaves `bus/pci/devices`, and the kernel log
    records `GPU has fallen off the bus`."""

    KIND = "gpu_off_bus"
    PARAMS = (gpu_index(),)

    def lost_gpus(self) -> tuple[int, ...]:
        return (self.gpu,)

    def bus_removals(self) -> tuple[int, ...]:
        return (self.gpu,)


@dataclass(frozen=True, kw_only=True)
class Hang(Fault):
    """That NVML call blocks like a wedged driver for `seconds` (for every GPU, or only
    `gpu`)."""

    KIND = "hang"
    PARAMS = (
        Param(
            name="call",
            meaning="NVML function, as pynvml names it",
            bounds="e.g. `nvmlDeviceGetPowerUsage`",
            parse=lambda check, value, key, _hw: check.string(value, key),
        ),
        number("seconds", "how long calls block", low=0, high=1e7),
        gpu_index(required=False),
    )

    call: str
    gpu: int | None = None

    def hang_calls(self) -> frozenset[str]:
        return frozenset({self.call})

    def hang_remaining(self, call: str, gpu: int | None, t: float) -> float:
        if call != self.call or not self.active(t) or self.gpu not in (None, gpu):
            return 0.0
        return self.at + (self.seconds or 0) - t


@dataclass(frozen=True, kw_only=True)
class Throttle(GpuFault):
    """A clock-event reason is active; the SM clock drops unless it is `gpu_idle` or
    `sync_boost`."""

    KIND = "throttle"
    PARAMS = (gpu_index(), choice("reason", "clock-event reason", THROTTLE_REASONS), SECONDS)

    reason: str

    def throttle_reasons(self, gpu: int, t: float) -> frozenset[str]:
        return frozenset({self.reason}) if gpu == self.gpu and self.active(t) else frozenset()

    def throttle_seconds(self, gpu: int, reason: str, t: float) -> float:
        return self.elapsed_active(t) if (gpu, reason) == (self.gpu, self.reason) else 0.0


@dataclass(frozen=True, kw_only=True)
class TensorActive(GpuFault):
    """Tensor-core activity is set to `value`; SM activity, power and NVLink traffic follow
    it."""

    KIND = "tensor_active"
    PARAMS = (gpu_index(), number("value", "tensor-core activity", low=0, high=1.0), SECONDS)

    value: float

    def tensor_active(self, gpu: int, value: float, t: float) -> float:
        return self.value if gpu == self.gpu and self.active(t) else value


@dataclass(frozen=True, kw_only=True)
class EccErrors(GpuFault):
    """ECC error counters of `error` grow by `per_second`."""

    KIND = "ecc_errors"
    PARAMS = (gpu_index(), choice("error", "severity", ECC_SEVERITIES), PER_SECOND, SECONDS)

    error: str
    per_second: float

    def ecc_errors(self, gpu: int, severity: str, t: float) -> float:
        if (gpu, severity) != (self.gpu, self.error):
            return 0.0
        return self.per_second * self.elapsed_active(t)


@dataclass(frozen=True, kw_only=True)
class RowRemap(GpuFault):
    """A row remap event: a remapped row by cause, or the pending/failure flag."""

    KIND = "row_remap"
    PARAMS = (gpu_index(), choice("error", "event", ROW_REMAP_EVENTS))

    error: str

    def row_remaps(self, gpu: int) -> tuple[str, ...]:
        return (self.error,) if gpu == self.gpu else ()


@dataclass(frozen=True, kw_only=True)
class FabricDegraded(GpuFault):
    """The GPU's NVLink-fabric health mask reports degraded bandwidth (needs
    `extra.fabric_clique_id`: without it the fake NVML has no fabric and answers
    NotSupported)."""

    KIND = "fabric_degraded"
    PARAMS = (gpu_index(), SECONDS)

    def fabric_degraded(self, gpu: int, t: float) -> bool:
        return gpu == self.gpu and self.active(t)


@dataclass(frozen=True, kw_only=True)
class MountFault(Fault):
    """A fault of one simulated mount (of the scenario's `mounts:`)."""

    mountpoint: str

    def on(self, mountpoint: str, t: float) -> bool:
        """This fault is of that mount and applies at `t`."""
        return mountpoint == self.mountpoint and self.active(t)


@dataclass(frozen=True, kw_only=True)
class MountSlow(MountFault):
    """The mount's checkpoint writes run `factor` times slower (a save writes that much less
    per second and lasts longer) and each WRITE's round trip takes `factor` times longer."""

    KIND = "mount_slow"
    PARAMS = (
        MOUNTPOINT,
        number("factor", "slowdown (write rate divided by it)", low=1, high=1e6),
        SECONDS,
    )

    factor: float

    def mount_slowdown(self, mountpoint: str, t: float) -> float:
        return self.factor if self.on(mountpoint, t) else 1.0


@dataclass(frozen=True, kw_only=True)
class MountHung(MountFault):
    """Every call on the mount (statvfs, the probe) blocks for `seconds` (absent: to the end)
    like a hard NFS mount whose server is gone, and nothing is written to it meanwhile."""

    KIND = "mount_hung"
    PARAMS = (MOUNTPOINT, SECONDS)

    def mount_hang_remaining(self, mountpoint: str, t: float) -> float:
        if not self.on(mountpoint, t):
            return 0.0
        return math.inf if self.seconds is None else self.at + self.seconds - t


@dataclass(frozen=True, kw_only=True)
class MountReadOnly(MountFault):
    """The mount turns read-only (`ro` in mountinfo, ST_RDONLY in statvfs, as after the
    server or an error remounts it): nothing is written to it."""

    KIND = "mount_read_only"
    PARAMS = (MOUNTPOINT, SECONDS)

    def mount_read_only(self, mountpoint: str, t: float) -> bool:
        return self.on(mountpoint, t)


@dataclass(frozen=True, kw_only=True)
class MountFilling(MountFault):
    """The mount's free space falls by `bytes_per_second` (another writer filling it), down to
    none."""

    KIND = "mount_filling"
    PARAMS = (
        MOUNTPOINT,
        number("bytes_per_second", "bytes filled per second", low=0, high=1e12),
        SECONDS,
    )

    bytes_per_second: float

    def mount_filled_bytes(self, mountpoint: str, t: float) -> float:
        if mountpoint != self.mountpoint:
            return 0.0
        return self.bytes_per_second * self.elapsed_active(t)


@dataclass(frozen=True, kw_only=True)
class MigMode(GpuFault):
    """The GPU switches MIG mode (as `nvidia-smi -mig` and a GPU reset do) while the
    exporter runs: enabled, it holds the scenario's `mig` instances; disabled, none (needs
    a `mig` section: without it the fake NVML answers NotSupported to MIG calls)."""

    KIND = "mig_mode"
    PARAMS = (gpu_index(), choice("mode", "MIG mode from then on", ("enabled", "disabled")))

    mode: str

    def mig_enabled(self, gpu: int, value: bool, t: float) -> bool:
        return self.mode == "enabled" if gpu == self.gpu else value


@dataclass(frozen=True, kw_only=True)
class MigInstanceGone(GpuFault):
    """A MIG instance disappears under the exporter: its slot still yields a handle, but
    every call on that handle answers NotFound."""

    KIND = "mig_instance_gone"
    PARAMS = (gpu_index(), integer("slot", "MIG slot", low=0, high=6), SECONDS)

    slot: int

    def mig_gone(self, gpu: int, slot: int, t: float) -> bool:
        return gpu == self.gpu and slot == self.slot and self.active(t)


FAULT_KINDS: Final[Mapping[str, type[Fault]]] = {
    kind.KIND: kind
    for kind in (
        Temperature,
        NvlinkErrors,
        NvlinkDown,
        IbPortDown,
        IbErrors,
        IbRate,
        Xid,
        GpuLost,
        GpuOffBus,
        Hang,
        Throttle,
        TensorActive,
        EccErrors,
        RowRemap,
        FabricDegraded,
        MountSlow,
        MountHung,
        MountReadOnly,
        MountFilling,
        MigMode,
        MigInstanceGone,
    )
}
"""Every fault kind by its name in scenario files, in the docs' order."""
