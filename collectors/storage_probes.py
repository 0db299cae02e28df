"""The storage collector's canary probes: where each probe directory lies, when its next
probe is due, and what the probes counted, as families.

A probe (a bounded write, fsync, read back and delete in a fleetwatch-owned directory,
`sources.probe`) runs on the lane of the mount its directory lies on, like every call on a
mount; this module only decides when and on which mount, and counts the results. A
directory on a mount that is not watched is the wrong filesystem: counted as a failure once
per interval, never probed.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterable

from fleetwatch.catalog.storage import (
    STORAGE_PROBE_FAILURES_TOTAL,
    STORAGE_PROBE_LAST_SUCCESS_TIMESTAMP_SECONDS,
    STORAGE_PROBE_READ_BYTES_PER_SECOND,
    STORAGE_PROBE_SECONDS,
    STORAGE_PROBE_WRITE_BYTES_PER_SECOND,
    STORAGE_PROBES_TOTAL,
)
from fleetwatch.collectors.families import FamilyBuilder
from fleetwatch.collectors.sources.mount_calls import ProbeResult
from fleetwatch.collectors.sources.mounts import Mount, mount_of
from fleetwatch.collectors.sources.probe import PHASES, ProbeFailed
from fleetwatch.logs import LogOnce


class _ProbeState:
    """One probed mount's counters and last success."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.next_due = 0.0
        self.runs = 0
        self.failures: Counter[str] = Counter()
        self.last: ProbeResult | None = None
        self.last_success: float | None = None


class CanaryProbes:
    """Every probe directory's mount, schedule and counts, across cycles."""

    def __init__(
        self,
        *,
        directories: Iterable[str],
        interval: float,
        size: int,
        clock: Callable[[], float],
        once: LogOnce,
    ) -> None:
        self._directories = tuple(directories)
        self._interval = interval
        self._size = size
        self._clock = clock
        self._once = once
        self._probes: dict[str, _ProbeState] = {}  # by probe directory
        self._probe_mount: dict[str, str] = {}  # probe directory -> mount point

    def place(self, mounts: Iterable[Mount]) -> None:
        """Map each probe directory to the mount it lies on in this cycle's mount table."""
        table = tuple(mounts)
        self._probe_mount.clear()
        for directory in self._directories:
            mount = mount_of(os.path.abspath(directory), table)
            if mount is None:
                continue
            self._probe_mount[str(directory)] = mount.mountpoint

    def due(self, mountpoint: str) -> tuple[str, int] | None:
        """The probe (directory, bytes) to run on the mount now, if one lies on it and is due."""
        for directory, point in self._probe_mount.items():
            if point != mountpoint:
                continue
            state = self._probes.setdefault(directory, _ProbeState(directory))
            now = self._clock()
            if now < state.next_due:
                return None
            state.next_due = now + self._interval
            return directory, self._size
        return None

    def count(self, point: str, probe: ProbeResult | ProbeFailed | None) -> None:
        """Count a new result of the probe on the mount at `point` (logged once per reason
        when it failed)."""
        if probe is None:
            return
        state = next((self._probes[d] for d, p in self._probe_mount.items() if p == point), None)
        if state is None:
            return
        if isinstance(probe, ProbeFailed):
            state.failures[probe.reason] += 1
            self._once.warning(
                (point, "probe", probe.reason),
                "canary probe failed",
                mountpoint=point,
                directory=state.directory,
                reason=probe.reason,
                detail=str(probe),
            )
            return
        state.runs += 1
        state.last, state.last_success = probe, time.time()

    def add(self, builder: FamilyBuilder, point: str) -> None:
        """The probe families of the watched mount at `point`, if a probe lies on it."""
        for directory, where in self._probe_mount.items():
            state = self._probes.get(directory)
            if where != point or state is None:
                continue
            _add_state(builder, point, state)
            return

    def add_unplaced(self, builder: FamilyBuilder, watched: set[str]) -> None:
        """Probe directories on a mount that is not watched: the wrong filesystem."""
        for directory, point in self._probe_mount.items():
            if point in watched:
                continue
            state = self._probes.setdefault(directory, _ProbeState(directory))
            now = self._clock()
            if now >= state.next_due:
                state.next_due = now + self._interval
                state.failures["wrong_filesystem"] += 1
                self._once.warning(
                    (directory, "wrong_filesystem"),
                    "probe directory is not on a watched mount (a network filesystem or one "
                    "named by --collector.storage.mounts): not probed",
                    directory=directory,
                    mountpoint=point,
                )
            _add_state(builder, point, state)


def _add_state(builder: FamilyBuilder, point: str, state: _ProbeState) -> None:
    builder.add(STORAGE_PROBES_TOTAL.name, (point,), state.runs)
    for reason, count in sorted(state.failures.items()):
        builder.add(STORAGE_PROBE_FAILURES_TOTAL.name, (point, reason), count)
    if state.last is None:
        return
    seconds = state.last.seconds
    for phase in PHASES:
        builder.add(STORAGE_PROBE_SECONDS.name, (point, phase), seconds.get(phase))
    writing = seconds["write"] + seconds["fsync"]
    write_rate = state.last.size / writing if writing else None
    builder.add(STORAGE_PROBE_WRITE_BYTES_PER_SECOND.name, (point,), write_rate)
    reading = seconds["read"]
    read_rate = state.last.size / reading if reading else None
    builder.add(STORAGE_PROBE_READ_BYTES_PER_SECOND.name, (point,), read_rate)
    builder.add(STORAGE_PROBE_LAST_SUCCESS_TIMESTAMP_SECONDS.name, (point,), state.last_success)
