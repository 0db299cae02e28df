"""Simulator fault kinds of the checkpoint mounts (the scenario's `mounts:`): slow, hung,
read-only, filling.

Each kind declares its scenario keys as fields (fault_params.py) and overrides the hooks
(fault_base.py) of the readings it changes; faults.py lists it in `FAULT_KINDS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fleetwatch.sim.fault_base import Fault
from fleetwatch.sim.fault_params import MOUNTPOINT, SECONDS, number


@dataclass(frozen=True, kw_only=True)
class MountFault(Fault):
    """A fault of one simulated mount (of the scenario's `mounts:`)."""

    mountpoint: str = field(metadata=MOUNTPOINT)

    def on(self, mountpoint: str, t: float) -> bool:
        """This fault is of that mount and applies at `t`."""
        return mountpoint == self.mountpoint and self.active(t)


@dataclass(frozen=True, kw_only=True)
class MountSlow(MountFault):
    """The mount's checkpoint writes run `factor` times slower (a save writes that much less
    per second and lasts longer) and each WRITE's round trip takes `factor` times longer."""

    KIND = "mount_slow"

    factor: float = field(metadata=number("slowdown (write rate divided by it)", low=1, high=1e6))
    seconds: float | None = field(default=None, metadata=SECONDS)

    def mount_slowdown(self, mountpoint: str, t: float) -> float:
        return self.factor if self.on(mountpoint, t) else 1.0


@dataclass(frozen=True, kw_only=True)
class MountHung(MountFault):
    """Every call on the mount (statvfs, the probe) blocks for `seconds` (absent: to the end)
    like a hard NFS mount whose server is gone, and nothing is written to it meanwhile."""

    KIND = "mount_hung"

    seconds: float | None = field(default=None, metadata=SECONDS)

    def mount_hang_remaining(self, mountpoint: str, t: float) -> float:
        if not self.on(mountpoint, t):
            return 0.0
        return math.inf if self.seconds is None else self.at + self.seconds - t


@dataclass(frozen=True, kw_only=True)
class MountReadOnly(MountFault):
    """The mount turns read-only (`ro` in mountinfo, ST_RDONLY in statvfs, as after the
    server or an error remounts it): nothing is written to it."""

    KIND = "mount_read_only"

    seconds: float | None = field(default=None, metadata=SECONDS)

    def mount_read_only(self, mountpoint: str, t: float) -> bool:
        return self.on(mountpoint, t)


@dataclass(frozen=True, kw_only=True)
class MountFilling(MountFault):
    """The mount's free space falls by `bytes_per_second` (another writer filling it), down to
    none."""

    KIND = "mount_filling"

    bytes_per_second: float = field(metadata=number("bytes filled per second", low=0, high=1e12))
    seconds: float | None = field(default=None, metadata=SECONDS)

    def mount_filled_bytes(self, mountpoint: str, t: float) -> float:
        if mountpoint != self.mountpoint:
            return 0.0
        return self.bytes_per_second * self.elapsed_active(t)
