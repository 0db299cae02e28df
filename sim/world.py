"""The simulated node: the state of every device at a simulated instant.

Everything here is a pure function of the scenario and the simulated time, so a golden
exposition at a fixed time is byte-for-byte reproducible, and the fake NVML and the
generated sysfs tree always agree with each other.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from dataclasses import dataclass
from typing import Final, Protocol

from fleetwatch.collectors.sources.sysfs import PMA_ERROR_BITS
from fleetwatch.sim.fault_base import Fault
from fleetwatch.sim.gpu_faults import ROW_REMAP_EVENTS
from fleetwatch.sim.scenario import HcaSpec, MountSpec, Scenario

# Steady traffic per active port, in bytes per second of line rate used.
_LINK_LOAD: Final = 0.35
_PACKET_BYTES: Final = 4096
# A simulated NFS mount writes in 1 MiB WRITE calls (wsize) of 2 ms round trip when healthy.
MOUNT_WSIZE: Final = 1 << 20
_MOUNT_RTT_MS: Final = 2.0


class Clock(Protocol):
    """Seconds since the simulated node started."""

    def elapsed(self) -> float: ...


class WallClock:
    """Simulated time follows real time from construction."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self._start


@dataclass(frozen=True, kw_only=True)
class PortState:
    """An InfiniBand port at one instant."""

    state_id: int
    state: str
    phys_state_id: int
    phys_state: str
    rate_gbps: float


class SimulatedNode:
    """A scenario made live: ask it for any reading at the current simulated time."""

    def __init__(self, *, scenario: Scenario, clock: Clock) -> None:
        self.scenario = scenario
        self.clock = clock
        self._hang_release = threading.Event()

    def now(self) -> float:
        return self.clock.elapsed()

    def _started(self, t: float) -> list[Fault]:
        """The faults that have started by `t`, in order: each reading folds their effects."""
        return [f for f in self.scenario.faults if f.at <= t]

    # -- GPUs -------------------------------------------------------------------------
    def gpu_lost(self, gpu: int, t: float | None = None) -> bool:
        """NVML answers `GpuIsLost` for the GPU: lost (still on the bus) or fallen off it."""
        t = self.now() if t is None else t
        return any(gpu in f.lost_gpus() for f in self._started(t))

    def gpu_on_bus(self, gpu: int, t: float | None = None) -> bool:
        """The GPU is a PCI function in sysfs (until a fault removes it from the bus)."""
        t = self.now() if t is None else t
        return not any(gpu in f.bus_removals() for f in self._started(t))

    def off_bus_events(self, t: float | None = None) -> list[tuple[float, int]]:
        """(time, gpu) for every GPU that has fallen off the bus by `t`, in order."""
        t = self.now() if t is None else t
        return [(f.at, gpu) for f in self._started(t) for gpu in f.bus_removals()]

    def _wave(self, gpu: int, t: float, amplitude: float, period: float) -> float:
        """A small deterministic wobble so graphs look alive and GPUs differ."""
        return amplitude * math.sin(2 * math.pi * t / period + gpu * 0.7)

    def base_temperature(self, gpu: int) -> float:
        """The GPU's steady die temperature (°C) before wobble and faults."""
        return self.scenario.baseline.temperature_celsius + 0.5 * gpu

    def gpu_temperature(self, gpu: int, t: float | None = None) -> float:
        """GPU die temperature (°C): baseline plus wobble, then faults change it."""
        t = self.now() if t is None else t
        value = self.base_temperature(gpu) + self._wave(gpu, t, 1.0, 60.0)
        for fault in self._started(t):
            value = fault.temperature(gpu, value, t, self)
        return round(value, 1)

    def memory_temperature(self, gpu: int, t: float | None = None) -> float:
        """HBM temperature follows the die with a fixed offset."""
        t = self.now() if t is None else t
        offset = (
            self.scenario.baseline.memory_temperature_celsius
            - self.scenario.baseline.temperature_celsius
        )
        return round(self.gpu_temperature(gpu, t) + offset, 1)

    def tensor_active(self, gpu: int, t: float | None = None) -> float:
        t = self.now() if t is None else t
        value = self.scenario.baseline.tensor_active + self._wave(gpu, t, 0.02, 30.0)
        for fault in self._started(t):
            value = fault.tensor_active(gpu, value, t)
        return round(min(1.0, max(0.0, value)), 4)

    def sm_active(self, gpu: int, t: float | None = None) -> float:
        t = self.now() if t is None else t
        base = self.scenario.baseline
        ratio = self.tensor_active(gpu, t) / base.tensor_active if base.tensor_active else 1.0
        return round(min(1.0, base.sm_active * ratio), 4)

    def power_watts(self, gpu: int, t: float | None = None) -> float:
        t = self.now() if t is None else t
        base = self.scenario.baseline
        ratio = self.tensor_active(gpu, t) / base.tensor_active if base.tensor_active else 1.0
        return round(min(base.power_limit_watts, 90 + (base.power_watts - 90) * ratio), 3)

    def energy_joules(self, gpu: int, t: float | None = None) -> float:
        """Energy since start: integral of a constant-ish draw (exact for the baseline)."""
        t = self.now() if t is None else t
        return round(1.0e6 + self.scenario.baseline.power_watts * t, 3)

    def throttle_reasons(self, gpu: int, t: float | None = None) -> frozenset[str]:
        """Clock-event reasons active now: faults, plus thermal slowdown above slowdown temp."""
        t = self.now() if t is None else t
        reasons = {r for f in self._started(t) for r in f.throttle_reasons(gpu, t)}
        if self.gpu_temperature(gpu, t) >= SLOWDOWN_CELSIUS:
            reasons.add("sw_thermal_slowdown")
        return frozenset(reasons)

    def throttle_seconds(self, gpu: int, reason: str, t: float | None = None) -> float:
        """Cumulative seconds `reason` was active (the violation-time counters)."""
        t = self.now() if t is None else t
        return sum(f.throttle_seconds(gpu, reason, t) for f in self._started(t))

    def xid_events(self, t: float | None = None) -> list[tuple[float, int, int]]:
        """(time, gpu, xid) for every Xid that has happened by `t`, in order."""
        t = self.now() if t is None else t
        return [event for f in self._started(t) for event in f.xid_events()]

    def ecc_errors(self, gpu: int, severity: str, t: float | None = None) -> int:
        t = self.now() if t is None else t
        return int(sum(f.ecc_errors(gpu, severity, t) for f in self._started(t)))

    def row_remap(self, gpu: int, t: float | None = None) -> dict[str, int]:
        """Remapped rows by cause plus pending/failure flags."""
        t = self.now() if t is None else t
        state = dict.fromkeys(ROW_REMAP_EVENTS, 0)
        for fault in self._started(t):
            for event in fault.row_remaps(gpu):
                state[event] += 1
        state["pending"] = min(1, state["pending"])
        state["failure"] = min(1, state["failure"])
        return state

    def fabric_degraded(self, gpu: int, t: float | None = None) -> bool:
        """True while a fault holds the GPU's NVLink-fabric bandwidth down."""
        t = self.now() if t is None else t
        return any(f.fabric_degraded(gpu, t) for f in self._started(t))

    # -- MIG ----------------------------------------------------------------------------
    def mig_enabled(self, gpu: int, t: float | None = None) -> bool:
        """The GPU's MIG mode: the scenario's `mig.gpus`, then each `mig_mode` fault."""
        t = self.now() if t is None else t
        mig = self.scenario.mig
        enabled = mig is not None and gpu in mig.gpus
        for fault in self._started(t):
            enabled = fault.mig_enabled(gpu, enabled, t)
        return enabled

    def mig_gone(self, gpu: int, slot: int, t: float | None = None) -> bool:
        """True while a fault holds the MIG instance in `slot` destroyed under its handle."""
        t = self.now() if t is None else t
        return any(f.mig_gone(gpu, slot, t) for f in self._started(t))

    # -- NVLink -------------------------------------------------------------------------
    def nvlink_up(self, gpu: int, link: int, t: float | None = None) -> bool:
        t = self.now() if t is None else t
        return not any(f.nvlink_down(gpu, link, t) for f in self._started(t))

    def nvlink_errors(self, gpu: int, link: int, error: str, t: float | None = None) -> int:
        t = self.now() if t is None else t
        return int(sum(f.nvlink_errors(gpu, link, error, t) for f in self._started(t)))

    def nvlink_throughput(self, gpu: int, t: float | None = None) -> float:
        """Per-GPU NVLink traffic in bytes/s each direction, following tensor activity."""
        t = self.now() if t is None else t
        return round(self.tensor_active(gpu, t) * 200e9, 0)

    # -- Hangs --------------------------------------------------------------------------
    def hang_calls(self) -> frozenset[str]:
        """Every NVML call some fault of the scenario may block, at any time."""
        return frozenset(call for f in self.scenario.faults for call in f.hang_calls())

    def hang_remaining(self, call: str, gpu: int | None, t: float | None = None) -> float:
        """Seconds a call made now must block for (0 when no hang applies)."""
        t = self.now() if t is None else t
        return max((f.hang_remaining(call, gpu, t) for f in self._started(t)), default=0.0)

    def block_for_hang(self, call: str, gpu: int | None) -> None:
        """Block the calling thread like a wedged driver would, while a hang fault applies."""
        remaining = self.hang_remaining(call, gpu)
        if remaining > 0:
            self._hang_release.wait(remaining)

    def release_hangs(self) -> None:
        """Wake every blocked call (shutdown of tests); later hangs block again."""
        self._hang_release.set()
        self._hang_release = threading.Event()

    # -- InfiniBand ---------------------------------------------------------------------
    def hca(self, device: str) -> HcaSpec:
        return next(h for h in self.scenario.infiniband if h.device == device)

    def port_state(self, device: str, port: int, t: float | None = None) -> PortState:
        t = self.now() if t is None else t
        rate: float = self.hca(device).rate_gbps
        for fault in self._started(t):
            rate = fault.port_rate(device, port, rate, t)
        if any(f.port_down(device, port, t) for f in self._started(t)):
            return PortState(
                state_id=1, state="DOWN", phys_state_id=2, phys_state="Polling", rate_gbps=rate
            )
        return PortState(
            state_id=4, state="ACTIVE", phys_state_id=5, phys_state="LinkUp", rate_gbps=rate
        )

    def port_flaps(self, device: str, port: int, t: float | None = None) -> int:
        """How many times the link went down by `t` (what `link_downed` counts)."""
        t = self.now() if t is None else t
        return sum(f.port_flaps(device, port) for f in self._started(t))

    def port_error_raw(self, device: str, port: int, error: str, t: float | None = None) -> int:
        """An error count without saturation (what a 64-bit extended counter shows)."""
        t = self.now() if t is None else t
        count = sum(f.port_errors(device, port, error, t) for f in self._started(t))
        if error == "link_downed":
            count += self.port_flaps(device, port, t)
        return int(count)

    def port_error(self, device: str, port: int, error: str, t: float | None = None) -> int:
        """An error count as sysfs shows it: pinned at all-ones once it saturates."""
        limit = (1 << PMA_ERROR_BITS[error]) - 1
        return min(limit, self.port_error_raw(device, port, error, t))

    def port_data_words(
        self, device: str, port: int, direction: str, t: float | None = None
    ) -> int:
        """Data counter in 4-octet words (as sysfs `port_{rcv,xmit}_data` counts)."""
        t = self.now() if t is None else t
        hca = self.hca(device)
        bytes_per_second = hca.rate_gbps * 125_000_000 * _LINK_LOAD
        skew = 1.0 if direction == "tx" else 0.98
        down_seconds = sum(f.port_down_seconds(device, port, t) for f in self._started(t))
        return int(bytes_per_second * skew * max(0.0, t + 3600 - down_seconds) / 4)

    def port_packets(self, device: str, port: int, direction: str, t: float | None = None) -> int:
        return self.port_data_words(device, port, direction, t) * 4 // _PACKET_BYTES

    # -- Checkpoint mounts ----------------------------------------------------------------
    def mount(self, mountpoint: str) -> MountSpec:
        return next(m for m in self.scenario.mounts if m.mountpoint == mountpoint)

    def _mount_stopped(self, mountpoint: str, t: float) -> bool:
        """Nothing is written while the mount is hung or read-only."""
        return self.mount_read_only(mountpoint, t) or self.mount_hang_remaining(mountpoint, t) > 0

    def _mount_slowdown(self, mountpoint: str, t: float) -> float:
        return math.prod(f.mount_slowdown(mountpoint, t) for f in self._started(t))

    def _fault_segments(self, t: float) -> list[tuple[float, float]]:
        """[a, b) pieces of 0..t within which no fault of the scenario starts or ends, so a
        mount's write rate is constant along each."""
        edges = {0.0, t}
        for fault in self.scenario.faults:
            edges.add(fault.at)
            if fault.seconds is not None:
                edges.add(fault.at + fault.seconds)
        points = sorted(e for e in edges if 0.0 <= e <= t)
        return list(itertools.pairwise(points))

    def _mount_bursts(self, mount: MountSpec, a: float, b: float) -> float:
        """Seconds of [a, b) that fall within a save (one starts every
        `checkpoint_every_seconds` from 0 and lasts `checkpoint_seconds`)."""

        def before(x: float) -> float:
            every, length = mount.checkpoint_every_seconds, mount.checkpoint_seconds
            return (x // every) * length + min(x % every, length)

        return before(b) - before(a)

    def mount_written(self, mountpoint: str, t: float | None = None) -> tuple[float, float]:
        """(bytes written, WRITE round-trip milliseconds) to the mount by `t`: saves write at
        the mount's rate divided by its slowdown, each WRITE's round trip multiplied by it."""
        t = self.now() if t is None else t
        mount = self.mount(mountpoint)
        written = rtt_ms = 0.0
        for a, b in self._fault_segments(t):
            middle = (a + b) / 2
            if self._mount_stopped(mountpoint, middle):
                continue
            slowdown = self._mount_slowdown(mountpoint, middle)
            moved = mount.write_bytes_per_second * self._mount_bursts(mount, a, b) / slowdown
            written += moved
            rtt_ms += moved / MOUNT_WSIZE * _MOUNT_RTT_MS * slowdown
        return written, rtt_ms

    def mount_probe_seconds(
        self, mountpoint: str, size: int, t: float | None = None
    ) -> dict[str, float]:
        """Seconds per phase of a canary probe of `size` bytes on the mount at `t`: written and
        read back at the mount's rate, fsync and delete one WRITE round trip each, every
        phase multiplied by the mount's slowdown."""
        t = self.now() if t is None else t
        slowdown = self._mount_slowdown(mountpoint, t)
        transfer = size / self.mount(mountpoint).write_bytes_per_second * slowdown
        round_trip = _MOUNT_RTT_MS / 1000 * slowdown
        return {"write": transfer, "fsync": round_trip, "read": transfer, "delete": round_trip}

    def mount_free_bytes(self, mountpoint: str, t: float | None = None) -> float:
        """Free bytes: the mount's `free_bytes` less what faults have filled (never below 0)."""
        t = self.now() if t is None else t
        filled = sum(f.mount_filled_bytes(mountpoint, t) for f in self._started(t))
        return max(0.0, self.mount(mountpoint).free_bytes - filled)

    def mount_read_only(self, mountpoint: str, t: float | None = None) -> bool:
        t = self.now() if t is None else t
        return any(f.mount_read_only(mountpoint, t) for f in self._started(t))

    def mount_hang_remaining(self, mountpoint: str, t: float | None = None) -> float:
        """Seconds a call on the mount made now must block for (0: it answers)."""
        t = self.now() if t is None else t
        return max((f.mount_hang_remaining(mountpoint, t) for f in self._started(t)), default=0.0)

    def block_for_mount_hang(self, mountpoint: str) -> None:
        """Block the calling thread as a hung mount's caller would, while a fault hangs it."""
        remaining = self.mount_hang_remaining(mountpoint)
        if remaining > 0:
            self._hang_release.wait(None if math.isinf(remaining) else remaining)


# Hardware slowdown of a simulated H100, as NVML reports it on a real one.
SLOWDOWN_CELSIUS: Final = 87.0
SHUTDOWN_CELSIUS: Final = 93.0
GPU_MAX_CELSIUS: Final = 85.0
MEMORY_MAX_CELSIUS: Final = 95.0
