"""Storage collector: the mounts that hold checkpoints, and a canary probe on them.

Which mounts: those `--collector.storage.mounts` names (any filesystem type, FUSE included),
else every network or parallel filesystem in `<procfs>/1/mountinfo` (nfs, nfs4, lustre,
gpfs, wekafs, beegfs, ceph and the like: `sources.mounts.NETWORK_FSTYPES`), with no
configuration. Per mount: capacity, free and available bytes, inodes and read-only from
`statvfs`; bytes moved and operations from `<procfs>/1/mountstats` (NFS, per operation:
count, transmissions, major timeouts, bytes, queue, round-trip and execution time), a Lustre
client's llite stats (`<procfs>/fs/lustre/llite` before Lustre 2.12, debugfs, `<sysfs>/kernel/
debug/lustre/llite`, from 2.12 on: root's, mode 0700), or, for a local
filesystem, its block device in `<procfs>/diskstats`. Opt in, `--collector.storage.
probe-dir` names a fleetwatch-owned directory whose mount gets a bounded canary write,
fsync, read back and delete every `--collector.storage.probe-interval`.

Whose mounts: the host's. pid 1's mount table is the host's mount namespace when
`--path.procfs` is the host's /proc (a DaemonSet mounts it at /host/proc); where pid 1's
files cannot be read (hidepid; mountstats is readable by root only) this process's own
(`self`) are read instead, said once in the log, keeping the mounts under `--path.rootfs`
named by their host paths. Mount points, `--collector.storage.mounts` and `--collector.
storage.probe-dir` are host paths throughout; a call on a mount reaches it under
`--path.rootfs` (`/`, or where the container mounts the host's root).

Every call that touches a mount (statvfs, the probe) runs in a helper process
(`sources.mount_calls`: a FUSE call stuck in the kernel cannot be killed, and would keep
the exporter from exiting), driven from a `blocking.ReplyLane` per mount (one call at a
time, no thread: the helper's replies end them); the procfs reads run on a thread lane of
their own. `collect()` submits and waits at most `_WAIT_SECONDS`, so a hung mount never
delays a collection, another mount or another collector, and its calls never stack. A call
running longer than `--collector.storage.hung-timeout` makes the mount hung
(`fleetwatch_storage_hung` 1, counted once in `fleetwatch_storage_stuck_calls_total`) and
its statvfs series are left out until the call returns, when the mount recovers by itself.

What a cycle reads from procfs is `sources.procfs_mounts`' job, when and where the canary
probes run and what they count is `storage_probes`'; this module watches the mounts and maps
what they read to families.

The lean profile (`--no-collector.storage.all-operations`) keeps the per-operation series of
the data-path operations only (`LEAN_OPERATIONS`), and of those the counts, major timeouts,
round-trip and execution times; without it, every per-operation family of every operation
the kernel has counted at least once.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fleetwatch.catalog import collected_by
from fleetwatch.catalog.storage import (
    STORAGE_AVAILABLE_BYTES,
    STORAGE_CALL_ERRORS_TOTAL,
    STORAGE_FREE_BYTES,
    STORAGE_HUNG,
    STORAGE_INODES,
    STORAGE_INODES_FREE,
    STORAGE_MOUNT_INFO,
    STORAGE_OPERATION_ERRORS_TOTAL,
    STORAGE_OPERATION_EXECUTE_SECONDS_TOTAL,
    STORAGE_OPERATION_MAJOR_TIMEOUTS_TOTAL,
    STORAGE_OPERATION_QUEUE_SECONDS_TOTAL,
    STORAGE_OPERATION_RECEIVED_BYTES_TOTAL,
    STORAGE_OPERATION_RTT_SECONDS_TOTAL,
    STORAGE_OPERATION_SENT_BYTES_TOTAL,
    STORAGE_OPERATION_TRANSMISSIONS_TOTAL,
    STORAGE_OPERATIONS_TOTAL,
    STORAGE_PARSE_ERRORS_TOTAL,
    STORAGE_READ_BYTES_TOTAL,
    STORAGE_READ_ONLY,
    STORAGE_SIZE_BYTES,
    STORAGE_STUCK_CALLS_TOTAL,
    STORAGE_WRITTEN_BYTES_TOTAL,
)
from fleetwatch.collectors.base import CollectorContext, CollectorSpec
from fleetwatch.collectors.blocking import Lane, LaneState, ReplyLane
from fleetwatch.collectors.families import FamilyBuilder, LabelCache, SeriesFamily
from fleetwatch.collectors.sources.mount_calls import MountCaller, MountCalls, MountReading
from fleetwatch.collectors.sources.mounts import (
    Mount,
    NfsOperation,
    lustre_fsname,
    watched_mounts,
)
from fleetwatch.collectors.sources.procfs_mounts import (
    MountTable,
    ProcReading,
    llite_dirs,
    read_procfs,
)
from fleetwatch.collectors.storage_probes import CanaryProbes
from fleetwatch.flags import duration_setting, number_setting, setting
from fleetwatch.logs import LogOnce

log = logging.getLogger(__name__)

# How long one collection waits for the mounts' calls before serving what it has: well
# inside the shortest collector deadline (80 ms at a 100 ms interval). A healthy statvfs
# answers in milliseconds; a slower call (a probe) is read on the next cycle, its call still
# running on its lane meanwhile.
_WAIT_SECONDS: Final = 0.05
_PROCFS_LANE: Final = "procfs"
# The lean profile keeps a checkpoint's data path (and GETATTR, the metadata call every
# open and close-to-open check waits on), and of each the counts, timeouts and times.
LEAN_OPERATIONS: Final = frozenset({"READ", "WRITE", "COMMIT", "GETATTR"})

INFO = STORAGE_MOUNT_INFO.name
HUNG = STORAGE_HUNG.name
STUCK = STORAGE_STUCK_CALLS_TOTAL.name
CALL_ERRORS = STORAGE_CALL_ERRORS_TOTAL.name
PARSE_ERRORS = STORAGE_PARSE_ERRORS_TOTAL.name
SIZE = STORAGE_SIZE_BYTES.name
FREE = STORAGE_FREE_BYTES.name
AVAILABLE = STORAGE_AVAILABLE_BYTES.name
INODES = STORAGE_INODES.name
INODES_FREE = STORAGE_INODES_FREE.name
READ_ONLY = STORAGE_READ_ONLY.name
READ_BYTES = STORAGE_READ_BYTES_TOTAL.name
WRITTEN_BYTES = STORAGE_WRITTEN_BYTES_TOTAL.name
OPERATIONS = STORAGE_OPERATIONS_TOTAL.name
OP_TRANSMISSIONS = STORAGE_OPERATION_TRANSMISSIONS_TOTAL.name
OP_MAJOR_TIMEOUTS = STORAGE_OPERATION_MAJOR_TIMEOUTS_TOTAL.name
OP_SENT = STORAGE_OPERATION_SENT_BYTES_TOTAL.name
OP_RECEIVED = STORAGE_OPERATION_RECEIVED_BYTES_TOTAL.name
OP_QUEUE = STORAGE_OPERATION_QUEUE_SECONDS_TOTAL.name
OP_RTT = STORAGE_OPERATION_RTT_SECONDS_TOTAL.name
OP_EXECUTE = STORAGE_OPERATION_EXECUTE_SECONDS_TOTAL.name
OP_ERRORS = STORAGE_OPERATION_ERRORS_TOTAL.name

# Counters are exported modulo 2^53, the largest integer a float64 holds exactly (as
# node_exporter's mountstats collector does): a kernel counter above it (real kernels write
# wrapped u64 values such as 18446743919241604546 ms) reads as a counter reset in
# Prometheus, never as a value that lost its low digits.
_FLOAT64_MANTISSA: Final = 1 << 53


def exact(value: int) -> int:
    """`value` modulo 2^53, so that it converts to a float64 exactly."""
    return value % _FLOAT64_MANTISSA


SPECS: Final = collected_by("storage")


class StorageCollector:
    """Watches mounts through one lane per mount; `collect()` never blocks on a mount.

    `calls` makes the calls on mounts: the helper process (`MountCalls`) unless the
    hardware set-up gives a stand-in (simulated mounts)."""

    def __init__(
        self,
        *,
        procfs: Path,
        rootfs: Path = Path("/"),
        sysfs: Path = Path("/sys"),
        settings: StorageSettings,
        discover: bool = True,
        wait: float = _WAIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        calls: MountCaller | None = None,
    ) -> None:
        self._procfs = procfs
        self._rootfs = rootfs
        self._llite = llite_dirs(procfs, sysfs)
        self._mount_table = MountTable()
        self._settings = settings
        self._discover = discover
        self._wait = wait
        self._clock = clock
        self._labels = LabelCache(SPECS)
        self._once = LogOnce(log)
        self._procfs_lane: Lane[ProcReading] = Lane(_PROCFS_LANE, clock=clock)
        self._lanes: dict[str, LaneState[MountReading]] = {}
        self._calls = MountCalls(rootfs=rootfs) if calls is None else calls
        self._seen: dict[str, float] = {}  # finished_at of the lane outcome already counted
        self._call_errors: Counter[tuple[str, str]] = Counter()
        self._parse_errors: Counter[str] = Counter()
        self._probes = CanaryProbes(
            directories=settings.probe_dir,
            interval=settings.probe_interval,
            size=int(settings.probe_bytes),
            clock=clock,
            once=self._once,
        )
        self._procfs_seen = 0.0
        self._hung: set[str] = set()

    # -- one cycle ------------------------------------------------------------------------
    def collect(self) -> list[SeriesFamily]:
        deadline = self._clock() + min(self._wait, self._settings.hung_timeout)
        self._procfs_lane.submit(
            lambda: read_procfs(
                self._procfs, rootfs=str(self._rootfs), llite=self._llite, table=self._mount_table
            )
        )
        self._procfs_lane.wait(deadline)
        reading = self._proc_reading()
        builder = FamilyBuilder(self._labels)
        if reading is None:
            return builder.families()
        mounts = self._watched(reading)
        for mount in mounts:
            lane = self._lanes.get(mount.mountpoint)
            if lane is None:
                lane = self._lanes[mount.mountpoint] = self._lane(mount.mountpoint)
            if lane.busy_for() is None:  # a busy lane is not given another call (nor a probe)
                self._new_result(mount.mountpoint, lane)  # counted before the next replaces it
                self._submit(lane, mount.mountpoint, self._probes.due(mount.mountpoint))
        for mount in mounts:
            self._lanes[mount.mountpoint].wait(deadline)
        self._forget_unmounted({mount.mountpoint for mount in mounts})
        for mount in mounts:
            self._add_mount(builder, mount, reading)
        for name, count in sorted(self._parse_errors.items()):
            builder.add(PARSE_ERRORS, (name,), count)
        self._probes.add_unplaced(builder, set(self._lanes))
        return builder.families()

    def _lane(self, point: str) -> LaneState[MountReading]:
        """The helper's calls are waited for without a thread (50 mounts: 50 fewer threads,
        about 1 MiB); a stand-in's `call` (simulated mounts) runs on a thread lane."""
        if isinstance(self._calls, MountCalls):
            return ReplyLane(point, clock=self._clock)
        return Lane(point, clock=self._clock)

    def _submit(
        self, lane: LaneState[MountReading], point: str, probe: tuple[str, int] | None
    ) -> None:
        if isinstance(lane, ReplyLane):
            assert isinstance(self._calls, MountCalls)
            lane.submit(functools.partial(self._calls.start, point, probe))
        else:
            assert isinstance(lane, Lane)
            lane.submit(functools.partial(self._calls.call, point, probe))

    def _proc_reading(self) -> ProcReading | None:
        """The latest procfs read; raises when it failed (the collector is then down)."""
        if self._procfs_lane.hung(self._settings.hung_timeout):
            self._once.warning(("procfs",), "reading the procfs mount files is blocked")
        outcome = self._procfs_lane.outcome()
        if outcome is None:
            return None
        if outcome.error is not None:
            raise outcome.error
        if outcome.finished_at != self._procfs_seen:
            self._procfs_seen = outcome.finished_at
            assert outcome.value is not None
            for file, reason in outcome.value.fallbacks:
                self._once.log(
                    logging.INFO,  # expected in the chart: mountstats is root's, the exporter not
                    ("fallback", file),
                    "cannot read pid 1's mount file: reading this process's own instead (in a "
                    "container, only the host's mounts under --path.rootfs are then seen)",
                    file=str(self._procfs / file),
                    reason=reason,
                )
            for problem in outcome.value.problems:
                self._parse_errors[problem.path] += 1
                self._once.warning(
                    (problem.path, problem.reason),
                    "skipped a malformed line of a procfs mount file",
                    file=problem.path,
                    line=problem.line,
                    reason=problem.reason,
                )
        return outcome.value

    def _watched(self, reading: ProcReading) -> list[Mount]:
        """The mounts to watch this cycle (named, else discovered network ones); maps each
        probe directory to the mount it lies on."""
        named = self._settings.mounts
        found = watched_mounts(reading.mounts, named) if named or self._discover else []
        mounts = {m.mountpoint: m for m in found}
        for point in named:
            if point not in mounts:
                self._once.warning(
                    ("absent", point), "a mount named to watch is not mounted", mountpoint=point
                )
        self._probes.place(reading.mounts)
        return [mounts[point] for point in sorted(mounts)]

    def _forget_unmounted(self, points: set[str]) -> None:
        """Close the lanes of mounts no longer listed (a stuck one ends when its call does)."""
        for point in [p for p in self._lanes if p not in points]:
            self._lanes.pop(point).close()
            self._seen.pop(point, None)

    # -- families -------------------------------------------------------------------------
    def _add_mount(self, builder: FamilyBuilder, mount: Mount, reading: ProcReading) -> None:
        point = (mount.mountpoint,)
        lane = self._lanes[mount.mountpoint]
        hung = lane.hung(self._settings.hung_timeout)
        if hung and mount.mountpoint not in self._hung:
            self._hung.add(mount.mountpoint)
            log.warning(
                "mount is hung: a call on it is blocked (no further call is started on it)",
                extra={"mountpoint": mount.mountpoint},
            )
        elif not hung and mount.mountpoint in self._hung:
            self._hung.discard(mount.mountpoint)
            log.info("mount answered again", extra={"mountpoint": mount.mountpoint})
        builder.add(INFO, (mount.mountpoint, mount.fstype, mount.server, mount.source), 1)
        builder.add(HUNG, point, 1 if hung else 0)
        builder.add(STUCK, point, lane.stuck_calls)
        result = self._new_result(mount.mountpoint, lane)
        capacity = None if hung or result is None else result.capacity
        read_only = mount.read_only or (capacity is not None and capacity.read_only)
        builder.add(READ_ONLY, point, 1 if read_only else 0)
        if capacity is not None:
            builder.add(SIZE, point, capacity.size_bytes)
            builder.add(FREE, point, capacity.free_bytes)
            builder.add(AVAILABLE, point, capacity.available_bytes)
            builder.add(INODES, point, capacity.inodes)
            builder.add(INODES_FREE, point, capacity.inodes_free)
        for (where, reason), count in self._call_errors.items():
            if where == mount.mountpoint:
                builder.add(CALL_ERRORS, (where, reason), count)
        self._add_io(builder, mount, reading)
        self._probes.add(builder, mount.mountpoint)

    def _new_result(self, point: str, lane: LaneState[MountReading]) -> MountReading | None:
        """The lane's latest reading; a new one's errors and probe are counted once."""
        outcome = lane.outcome()
        if outcome is None:
            return None
        new = self._seen.get(point) != outcome.finished_at
        self._seen[point] = outcome.finished_at
        if outcome.error is not None:  # the helper died (a FUSE server crash can take it)
            if new:
                self._count_error(point, "helper_failed", str(outcome.error))
            return None
        reading = outcome.value
        assert reading is not None
        if new:
            if reading.error is not None:
                self._count_error(point, reading.error, "statvfs failed")
            self._probes.count(point, reading.probe)
        return reading

    def _count_error(self, point: str, reason: str, detail: str) -> None:
        self._call_errors[(point, reason)] += 1
        self._once.warning(
            (point, reason),
            "a call on a mount failed",
            mountpoint=point,
            reason=reason,
            detail=detail,
        )

    def _add_io(self, builder: FamilyBuilder, mount: Mount, reading: ProcReading) -> None:
        point = mount.mountpoint
        entry = reading.stats.get(point)
        if entry is not None and entry.nfs is not None:
            builder.add(READ_BYTES, (point,), exact(entry.nfs.read_bytes))
            builder.add(WRITTEN_BYTES, (point,), exact(entry.nfs.write_bytes))
            for op in entry.nfs.operations:
                if self._exported(op):
                    self._add_operation(builder, point, op)
            return
        fsname = lustre_fsname(mount)
        lustre = reading.lustre.get(fsname) if fsname else None
        if lustre is not None:
            builder.add(READ_BYTES, (point,), exact(lustre.read_bytes))
            builder.add(WRITTEN_BYTES, (point,), exact(lustre.write_bytes))
            if self._settings.all_operations:
                for name, count in sorted(lustre.operations.items()):
                    builder.add(OPERATIONS, (point, name), exact(count))
            return
        disk = reading.disks.get((mount.major, mount.minor)) if mount.major else None
        if disk is not None:
            reads, read_bytes, writes, write_bytes = disk
            builder.add(READ_BYTES, (point,), read_bytes)
            builder.add(WRITTEN_BYTES, (point,), write_bytes)
            builder.add(OPERATIONS, (point, "read"), reads)
            builder.add(OPERATIONS, (point, "write"), writes)

    def _exported(self, op: NfsOperation) -> bool:
        if not self._settings.all_operations:
            return op.name in LEAN_OPERATIONS
        return op.requests > 0

    def _add_operation(self, builder: FamilyBuilder, point: str, op: NfsOperation) -> None:
        labels = (point, op.name)
        builder.add(OPERATIONS, labels, exact(op.requests))
        builder.add(OP_TRANSMISSIONS, labels, exact(op.transmissions))
        builder.add(OP_MAJOR_TIMEOUTS, labels, exact(op.major_timeouts))
        builder.add(OP_RTT, labels, exact(op.rtt_ms) / 1000)
        builder.add(OP_EXECUTE, labels, exact(op.execute_ms) / 1000)
        if not self._settings.all_operations:
            return  # lean: bytes, queue time and errors per operation are left out
        builder.add(OP_SENT, labels, exact(op.bytes_sent))
        builder.add(OP_RECEIVED, labels, exact(op.bytes_received))
        builder.add(OP_QUEUE, labels, exact(op.queue_ms) / 1000)
        builder.add(OP_ERRORS, labels, None if op.errors is None else exact(op.errors))

    def close(self) -> None:
        """Stop every lane; lanes stuck in a call are left behind (daemon threads)."""
        idle = [lane for lane in self._lanes.values() if lane.busy_for() is None]
        self._procfs_lane.close()
        for lane in self._lanes.values():
            lane.close()
        self._calls.close()
        deadline = time.monotonic() + 1.0
        for lane in idle:  # a busy lane may wait on a stuck call for good: not joined
            lane.join(max(0.0, deadline - time.monotonic()))


def _mount_point(text: str) -> str:
    """A mount point flag value: an absolute path, normalised."""
    if not text.startswith("/"):
        raise argparse.ArgumentTypeError(f"{text!r}: a mount point must be an absolute path")
    return os.path.normpath(text)


@dataclass(frozen=True, kw_only=True)
class StorageSettings:
    """`--collector.storage.*` flags."""

    mounts: tuple[str, ...] = setting(
        (),
        parse=_mount_point,
        repeatable=True,
        metavar="MOUNTPOINT",
        help="watch this mount point (a host path), whatever its filesystem type (FUSE "
        "included; repeat the flag for more); none given: every network or parallel "
        "filesystem (nfs, nfs4, lustre, gpfs, wekafs, beegfs, ceph, ...)",
    )
    probe_dir: tuple[str, ...] = setting(
        (),
        parse=_mount_point,
        repeatable=True,
        metavar="DIR",
        help="a fleetwatch-owned directory (a host path) to run the canary probe in (write, "
        "fsync, read back, delete), probing the mount it lies on, which must be a watched "
        "one; never created: missing, unwritable or on another filesystem is reported "
        "(repeatable, one per mount)",
    )
    probe_bytes: float = number_setting(
        8 << 20,
        minimum=4096,
        maximum=1 << 30,
        integer=True,
        unit="bytes",
        help="bytes one probe writes and reads back",
    )
    probe_interval: float = duration_setting(
        60.0, minimum=1.0, maximum=86400.0, help="how often each probe directory is probed"
    )
    hung_timeout: float = duration_setting(
        10.0,
        minimum=0.1,
        maximum=300.0,
        help="a mount whose call (statvfs, the probe) has been blocked this long is hung "
        "(keep it above the time a probe takes on a healthy mount)",
    )
    all_operations: bool = setting(
        True,
        help="export every NFS operation the kernel counted, with bytes, queue time and errors; "
        "off (lean profile), only READ, WRITE, COMMIT and GETATTR, with counts, transmissions, "
        "major timeouts, round-trip and execution times",
    )


def _create(context: CollectorContext, settings: StorageSettings) -> StorageCollector:
    return StorageCollector(
        procfs=context.procfs_root,
        rootfs=context.rootfs_root,
        sysfs=context.sysfs_root,
        settings=settings,
        discover=context.discover_mounts,
        calls=context.mount_calls(context.rootfs_root),
    )


SPEC = CollectorSpec(
    name="storage",
    help="checkpoint mounts: capacity, client I/O, hung mounts, a canary probe",
    settings=StorageSettings,
    create=_create,
    metrics=SPECS,
)
