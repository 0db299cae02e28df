"""Xid collector: a counter per GPU and Xid, from NVML events and/or the kernel log.

`--collector.xid.source` picks the sources. `nvml` (the default): the NVML events queued
for the collector's event set are taken (`nvmlEventSetWait_v2` with a zero timeout: the
driver keeps them until taken, so nothing waits); it needs no privilege, but NVML keeps no
history, so Xids raised while no exporter listened are not counted. `kmsg`: a thread reads
NVRM Xid lines from the kernel log, history included; it needs read access to /dev/kmsg
(`CAP_SYSLOG` under `kernel.dmesg_restrict=1`); it sleeps until the kernel logs a record.
`nvml,kmsg` runs both. Each run has the queued NVML events taken on a lane
(`collectors/blocking.py`: one thread, woken only for that) and waits up to a second for
them before it reads the counts: an Xid is served by the run after it was raised, and no
thread wakes between runs. A take blocked in a wedged driver holds only the lane: the runs
go on serving the counts (the kernel log's too; logged once) and take again once it
returns, so the Xid series never go stale for it. A failed event call is counted
(`fleetwatch_gpu_xid_nvml_errors_total`, each new kind logged once) and tried again at the
next run; `fleetwatch_gpu_xid_events_listening` says per GPU whether its events arrive (0
while its registration failed, or the last take failed or is blocked). Which sources run is
logged once at start.

Kernel-log records stamped before the reader opened are history: an exporter started (or
restarted) on a node whose log holds an old Xid must not report it as a new error, or
enabling the kernel-log source fleet-wide would alert on every node with an Xid since
boot. History Xids go to `fleetwatch_gpu_xid_history_errors` and never into the Xid
counter, so that counter's series still appears with the first new Xid (the alert rules
read a new series as a new Xid). The kernel log also gives what NVML events do not, counted
when new: the driver's fallen-off-the-bus report, NVSwitch SXids, the recovery action an
Xid 154 announces, and for NVLink5 Xids 144-150 the action NVIDIA's decode table
(`src/fleetwatch/catalog/nvidia_xids.yaml`, `nvlink5_decode`) gives the message's unit and
error status (the Xid's catalog action, its most severe outcome, when no row describes it).
Unreadable records are counted (`fleetwatch_kmsg_unreadable_records_total`) and logged
once. The same reader serves checkpoint storage (collectors/sources/kmsg_storage.py): each
NFS server's state from its last `not responding`/`OK` message, history included, and,
counted when new, hung tasks, ext4/XFS errors, remounts and shutdowns, NVMe timeouts and
resets, Lustre client evictions.

The same Xid usually arrives from both sources. `XidLedger` counts it once: an Xid from
one source cancels one not-yet-matched report of the same GPU and Xid from the other
source within `--collector.xid.dedup-window`. Kernel-log records carry their own
timestamp (seconds since boot, the clock `time.monotonic` uses on Linux; the ledger reads
the kernel log's clock), so Xids from the log's history never cancel a fresh NVML event.
An NVML event carries no time: a take reports it as raised between the last take that
emptied the queue (or the set's opening) and now, and a record of the kernel log matches
it when it lies within the window of that span, however long the collection interval.
The counter of a GPU that fell off the bus stays: that Xid 79 is exactly what an operator
needs to see.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from fleetwatch.catalog import collected_by
from fleetwatch.catalog.nvidia_xids import NVLINK5_XIDS, XidCatalog, shipped_catalog
from fleetwatch.catalog.storage import (
    KMSG_FILESYSTEM_ERRORS_TOTAL,
    KMSG_HUNG_TASKS_TOTAL,
    KMSG_LUSTRE_EVICTIONS_TOTAL,
    KMSG_NFS_SERVER_NOT_RESPONDING,
    KMSG_NVME_ERRORS_TOTAL,
)
from fleetwatch.catalog.xid import (
    GPU_FALLEN_OFF_BUS_TOTAL,
    GPU_XID_ERRORS_TOTAL,
    GPU_XID_EVENTS_LISTENING,
    GPU_XID_HISTORY_ERRORS,
    GPU_XID_NVLINK5_ERRORS_TOTAL,
    GPU_XID_NVML_ERRORS_TOTAL,
    GPU_XID_RECOVERY_ACTIONS_TOTAL,
    KMSG_UNREADABLE_RECORDS_TOTAL,
    NVSWITCH_SXID_ERRORS_TOTAL,
)
from fleetwatch.collectors.base import CollectorContext, CollectorSpec
from fleetwatch.collectors.blocking import Lane
from fleetwatch.collectors.families import FamilyBuilder, LabelCache, SeriesFamily
from fleetwatch.collectors.gpu import RECOVERY_ACTIONS
from fleetwatch.collectors.gpu_common import NvmlFailures, gpu_labels
from fleetwatch.collectors.sources.kmsg import (
    DEFAULT_PATH,
    RECOVERY_XID,
    UNREADABLE_REASONS,
    FallenOffBus,
    KernelLog,
    KernelXid,
    SwitchXid,
    Unreadable,
    normalize_pci,
    parse_record,
)
from fleetwatch.collectors.sources.kmsg_storage import StorageEvent
from fleetwatch.collectors.sources.nvml import Gpu, NvmlSource
from fleetwatch.collectors.sources.nvml_calls import GpuLostError, NvmlError
from fleetwatch.collectors.sources.nvml_events import (
    EVENTS_A_LOOK,
    create_event_set,
    free_events,
    ready_xids,
    register_xids,
)
from fleetwatch.flags import duration_setting, setting

log = logging.getLogger(__name__)

XID = GPU_XID_ERRORS_TOTAL.name
XID_HISTORY = GPU_XID_HISTORY_ERRORS.name
LISTENING = GPU_XID_EVENTS_LISTENING.name
NVML_ERRORS = GPU_XID_NVML_ERRORS_TOTAL.name
FALLEN_OFF_BUS = GPU_FALLEN_OFF_BUS_TOTAL.name
SXID = NVSWITCH_SXID_ERRORS_TOTAL.name
RECOVERY = GPU_XID_RECOVERY_ACTIONS_TOTAL.name
NVLINK5 = GPU_XID_NVLINK5_ERRORS_TOTAL.name
OTHER_UNIT: Final = "other"
"""The `unit` label of an NVLink5 Xid whose unit the decode table does not name (bounded)."""
UNREADABLE = KMSG_UNREADABLE_RECORDS_TOTAL.name
NFS_NOT_RESPONDING = KMSG_NFS_SERVER_NOT_RESPONDING.name
HUNG_TASKS = KMSG_HUNG_TASKS_TOTAL.name
FILESYSTEM_ERRORS = KMSG_FILESYSTEM_ERRORS_TOTAL.name
NVME_ERRORS = KMSG_NVME_ERRORS_TOTAL.name
LUSTRE_EVICTIONS = KMSG_LUSTRE_EVICTIONS_TOTAL.name
SPECS: Final = collected_by("xid")
Origin = Literal["nvml", "kmsg"]
ORIGINS: Final[tuple[Origin, ...]] = ("nvml", "kmsg")
_RETRY_SECONDS: Final = 5.0  # before reading the kernel log again after a failed read
_TAKE_WAIT_SECONDS: Final = 1.0  # how long a run waits for its take of the NVML events
# Reports of one GPU and Xid kept for a match with the other source, at most (the oldest go
# first): an Xid storm must not grow the ledger without bound.
_UNMATCHED_KEPT: Final = 256
# The kernel-log thread's longest sleep: /dev/kmsg wakes it for a record and `close()` for
# the stop; a file or the simulation is looked at every second whatever this says.
_KMSG_WAIT_SECONDS: Final = 60.0


@dataclass(frozen=True)
class NvmlXidState:
    """What the NVML side of the collector last knew, published whole after each take (read
    by runs while a take may be under way): per GPU with Xid events, (gpu, uuid) and whether
    they reach the ledger; failed calls by (gpu, uuid, call, error), gpu and uuid empty for a
    call on the whole set."""

    listening: tuple[tuple[tuple[str, str], bool], ...] = ()
    failures: tuple[tuple[tuple[str, str, str, str], int], ...] = ()


class NvmlXids:
    """Takes the Xid events NVML queued for one event set into the ledger.

    The set is created at the first `take()` that finds GPUs (again at the next take after
    NVML had none or could not create it) and each GPU with Xid events is registered on it;
    a GPU whose registration failed is tried again at each take, one without the events
    (not supported) is not asked again. `take()` never waits for an event. One lock spans a
    take and `close()`, so the set is never freed under a call. Each event goes to the ledger
    as raised between `_since` (the set's opening, then the last take that emptied the
    queue) and the take, on the ledger's clock. Failed calls are counted and each new kind
    logged once; `state` says which GPUs' events reach the ledger.
    """

    def __init__(self, source: NvmlSource, ledger: XidLedger) -> None:
        self._source = source
        self._ledger = ledger
        self._lock = threading.Lock()
        self._event_set: Any = None
        self._since = 0.0
        self._closed = False
        self._registered: set[int] = set()  # GPU indices registered on the set
        self._without: set[int] = set()  # GPUs without Xid events: not asked again
        self._lost: set[int] = set()  # GPUs that answered "lost" when registered
        self._failures = NvmlFailures(
            collector="xid",
            spec=GPU_XID_NVML_ERRORS_TOTAL,
            message="an NVML call for Xid events failed: the Xids it concerns are not counted "
            "from NVML until it answers (tried again at each run)",
        )
        self.state = NvmlXidState()

    def take(self) -> None:
        with self._lock:
            if self._closed:
                return
            answered = False
            gpus: tuple[Gpu, ...] = ()
            try:
                gpus = self._source.gpus()
                if self._event_set is None:
                    if not gpus:  # no driver or no GPU yet: NVML's start is tried again
                        return  # at the next take
                    since = self._ledger.now()
                    self._event_set = create_event_set(self._source)
                    self._since = since
                self._register(gpus)
                now, taken = self._ledger.now(), 0
                for event in ready_xids(self._source, self._event_set):
                    taken += 1
                    self._ledger.record(
                        gpu=str(event.gpu),
                        uuid=event.uuid,
                        xid=event.xid,
                        origin="nvml",
                        at=now,
                        since=self._since,
                    )
                    log.warning("Xid", extra={"gpu": event.gpu, "xid": event.xid, "origin": "nvml"})
                if taken < EVENTS_A_LOOK:  # the queue is empty: what comes next is newer
                    self._since = now
                answered = True
            except NvmlError as exc:
                self._failures.record_error(None, exc)
            finally:
                self._publish(gpus, answered)

    def _register(self, gpus: tuple[Gpu, ...]) -> None:
        """Register every GPU not registered yet (and not known to lack the events)."""
        for gpu in gpus:
            if gpu.index in self._registered or gpu.index in self._without:
                continue
            try:
                if register_xids(self._source, self._event_set, gpu):
                    self._registered.add(gpu.index)
                else:
                    self._without.add(gpu.index)
            except NvmlError as exc:
                self._failures.record_error(gpu.identity, exc)
            except GpuLostError:  # fallen off the bus: its series go, as the gpu
                self._lost.add(gpu.index)  # collector's do (asked again at each take)
            else:
                self._lost.discard(gpu.index)

    def _publish(self, gpus: tuple[Gpu, ...], answered: bool) -> None:
        """The state after a take: every GPU not known to lack the events (nor lost) listens
        when registered on the set and the take answered (none does while the set could not
        be made)."""
        self.state = NvmlXidState(
            listening=tuple(
                (gpu_labels(gpu.identity), answered and gpu.index in self._registered)
                for gpu in gpus
                if gpu.index not in self._without and gpu.index not in self._lost
            ),
            failures=self._failures.counts(),
        )

    def close(self, timeout: float) -> None:
        """Free the event set; left to the process's exit when a take is still blocked in
        NVML after `timeout` seconds (freeing it under that call is not safe)."""
        if not self._lock.acquire(timeout=timeout):
            log.warning("NVML Xid event set left open: a take is blocked in NVML")
            return
        try:
            self._closed = True
            if self._event_set is not None:
                free_events(self._source, self._event_set)
        except NvmlError as exc:
            self._failures.record_error(None, exc)
        finally:
            self._event_set = None
            self._lock.release()


class XidLedger:
    """Xid counts by (gpu, uuid, xid), each Xid counted once whichever source saw it first."""

    def __init__(self, *, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()
        # Reports not matched yet, as (earliest, latest) time the Xid could have been raised.
        self._unmatched: dict[tuple[Origin, str, str], deque[tuple[float, float]]] = {}
        self._last_sequence = -1

    def now(self) -> float:
        """The time on the ledger's clock (the one reports are stamped with)."""
        return self._clock()

    def record(
        self,
        *,
        gpu: str,
        uuid: str,
        xid: int,
        origin: Origin,
        at: float | None = None,
        since: float | None = None,
        sequence: int | None = None,
    ) -> bool:
        """Count one Xid report; False when it duplicates one already counted.

        The report says the Xid was raised at `at` (now when None), or with `since` at some
        time from `since` to `at` (an NVML take). It matches the oldest unmatched report of
        the other source whose time, or span, is within the window of its own.
        """
        latest = self._clock() if at is None else at
        earliest = latest if since is None else min(since, latest)
        other: Origin = "kmsg" if origin == "nvml" else "nvml"
        with self._lock:
            if sequence is not None:
                if sequence <= self._last_sequence:  # the same kmsg record read twice
                    return False
                self._last_sequence = sequence
            pending = self._unmatched.get((other, gpu, str(xid)))
            if pending:
                while pending and pending[0][1] + self._window < earliest:
                    pending.popleft()  # too old to be the same event
                if pending and pending[0][0] - self._window <= latest:
                    pending.popleft()
                    return False
            self._counts[(gpu, uuid, str(xid))] += 1
            self._unmatched.setdefault(
                (origin, gpu, str(xid)), deque(maxlen=_UNMATCHED_KEPT)
            ).append((earliest, latest))
            return True

    def counts(self) -> dict[tuple[str, str, str], int]:
        with self._lock:
            return dict(self._counts)


class KernelLogCounts:
    """What the kernel-log thread counts besides new Xids, and each NFS server's state
    (1 not responding, 0 answering); `collect()` reads a copy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.families: dict[str, Counter[tuple[str, ...]]] = {
            XID_HISTORY: Counter(),
            FALLEN_OFF_BUS: Counter(),
            SXID: Counter(),
            RECOVERY: Counter(),
            NVLINK5: Counter(),
            UNREADABLE: Counter({(reason,): 0 for reason in UNREADABLE_REASONS}),
            NFS_NOT_RESPONDING: Counter(),
            HUNG_TASKS: Counter({(): 0}),
            FILESYSTEM_ERRORS: Counter(),
            NVME_ERRORS: Counter(),
            LUSTRE_EVICTIONS: Counter(),
        }

    def add(self, family: str, labels: tuple[str, ...]) -> int:
        """Count one; the new count."""
        with self._lock:
            self.families[family][labels] += 1
            return self.families[family][labels]

    def set(self, family: str, labels: tuple[str, ...], value: int) -> None:
        """Set a state (a gauge family such as an NFS server's)."""
        with self._lock:
            self.families[family][labels] = value

    def snapshot(self) -> dict[str, dict[tuple[str, ...], int]]:
        with self._lock:
            return {name: dict(counts) for name, counts in self.families.items()}


class XidCollector:
    """Serves the Xid counters: NVML's queued events taken at each run (on a lane), the
    kernel log read by a thread as the kernel writes it."""

    def __init__(
        self,
        *,
        source: NvmlSource,
        kernel_log: KernelLog | None,
        ledger: XidLedger,
        nvml_events: bool = True,
        catalog: XidCatalog | None = None,
    ) -> None:
        self._source = source
        self._catalog = shipped_catalog() if catalog is None else catalog
        self._kernel_log = kernel_log
        self.ledger = ledger
        self._nvml = NvmlXids(source, ledger) if nvml_events else None
        self._take_blocked = False  # the last run found a take blocked in NVML
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._take_lane: Lane[None] | None = None
        self._labels = LabelCache(SPECS)
        self.kernel_counts = KernelLogCounts()

    def start(self) -> bool:
        """Start the NVML lane and the kernel-log thread (once; False when started before);
        `collect()` calls it on first use."""
        if self._threads or self._take_lane is not None:
            return False
        if self._nvml is not None:
            # The first take opens the event set: Xids count from when start() returns.
            self._take_lane = Lane("xid-nvml")
            self._take_lane.submit(self._nvml.take)
            self._take_lane.wait(time.monotonic() + _TAKE_WAIT_SECONDS)
        if self._kernel_log is not None:
            thread = threading.Thread(target=self._listen_kmsg, name="xid-kmsg", daemon=True)
            thread.start()
            self._threads.append(thread)
        return True

    def collect(self) -> list[SeriesFamily]:
        if not self.start() and self._take_lane is not None:  # start() took them just now
            self._take_nvml_events(self._take_lane)
        builder = FamilyBuilder(self._labels)
        for labels, count in sorted(self.ledger.counts().items()):
            builder.add(XID, labels, count)
        if self._nvml is not None:
            state = self._nvml.state
            for gpu, listening in state.listening:
                builder.add(LISTENING, gpu, listening and not self._take_blocked)
            for call, count in state.failures:
                builder.add(NVML_ERRORS, call, count)
        if self._kernel_log is not None:
            for family, counts in self.kernel_counts.snapshot().items():
                for values, n in sorted(counts.items()):
                    builder.add(family, values, n)
        return builder.families()

    def _take_nvml_events(self, lane: Lane[None]) -> None:
        """Take the queued NVML events on the lane and wait up to `_TAKE_WAIT_SECONDS` for
        them (or for an earlier take still in flight, `start()`'s included); none while a take
        is blocked in NVML since an earlier run (logged once a blocked call)."""
        assert self._nvml is not None
        stuck = lane.stuck_calls
        self._take_blocked = lane.hung(_TAKE_WAIT_SECONDS)
        if self._take_blocked:
            if lane.stuck_calls > stuck:
                log.warning(
                    "taking NVML Xid events is blocked in NVML: the counts are served without "
                    "them until the call returns",
                    extra={"seconds": round(lane.busy_for() or 0.0, 1)},
                )
            return
        before = lane.outcome()
        lane.submit(self._nvml.take)
        if not lane.wait(time.monotonic() + _TAKE_WAIT_SECONDS):
            self._take_blocked = True  # still in NVML: the next run finds it blocked
            return
        outcome = lane.outcome()
        if outcome is not before and outcome is not None and outcome.error is not None:
            raise outcome.error

    def _listen_kmsg(self) -> None:
        assert self._kernel_log is not None
        while not self._stop.is_set():
            try:
                lines = self._kernel_log.read(_KMSG_WAIT_SECONDS)
            except OSError as exc:
                log.warning("reading the kernel log failed", extra={"reason": str(exc)})
                self._stop.wait(_RETRY_SECONDS)
                continue
            for line in lines:
                self._kernel_line(line)

    def _kernel_line(self, line: str) -> None:
        assert self._kernel_log is not None
        found = parse_record(line)
        if found is None:
            return
        if isinstance(found, Unreadable):
            if self.kernel_counts.add(UNREADABLE, (found.reason,)) == 1:
                log.warning(
                    "unreadable kernel log record, counted and skipped (logged once per reason)",
                    extra={"reason": found.reason, "why": found.why, "record": found.line[:200]},
                )
            return
        new = found.seconds >= self._kernel_log.opened_at
        match found:
            case KernelXid() if new:
                self._new_xid(found)
            case KernelXid():
                self.kernel_counts.add(
                    XID_HISTORY, (*self._identity(found.pci_bus_id), str(found.xid))
                )
            case FallenOffBus() if new:
                self.kernel_counts.add(
                    FALLEN_OFF_BUS, (*self._identity(found.pci_bus_id), found.pci_bus_id)
                )
                log.warning("GPU has fallen off the bus", extra={"pci_bus_id": found.pci_bus_id})
            case StorageEvent():
                self._storage_event(found, new=new)
            case SwitchXid() if new:
                severity = "fatal" if found.fatal else "non_fatal"
                self.kernel_counts.add(SXID, (found.device, str(found.sxid), severity))
                log.warning(
                    "SXid", extra={"device": found.device, "sxid": found.sxid, "severity": severity}
                )

    def _storage_event(self, found: StorageEvent, *, new: bool) -> None:
        """An NFS server's state follows every message, history included (a server that
        stopped answering before the exporter started and never came back is still not
        answering: the last message wins, as gpud reads it); the other storage events count
        only when new."""
        match found.kind:
            case "nfs_not_responding" | "nfs_ok":
                state = int(found.kind == "nfs_not_responding")
                self.kernel_counts.set(NFS_NOT_RESPONDING, (found.subject,), state)
                return
            case _ if not new:
                return
            case "hung_task":
                self.kernel_counts.add(HUNG_TASKS, ())
            case "filesystem":
                self.kernel_counts.add(FILESYSTEM_ERRORS, (found.subject, found.fs, found.detail))
            case "nvme":
                self.kernel_counts.add(NVME_ERRORS, (found.subject, found.detail))
            case "lustre_eviction":
                self.kernel_counts.add(LUSTRE_EVICTIONS, (found.subject,))
        log.warning(
            "storage event in the kernel log",
            extra={"kind": found.kind, "subject": found.subject, "detail": found.detail},
        )

    def _identity(self, pci_bus_id: str) -> tuple[str, str]:
        """(gpu, uuid) of the GPU at `pci_bus_id`; empty for one NVML never enumerated
        (lost before start), which is still worth counting."""
        by_pci = {normalize_pci(g.identity.pci_bus_id): g.identity for g in self._source.gpus()}
        identity = by_pci.get(pci_bus_id)
        return ("", "") if identity is None else (str(identity.index), identity.uuid)

    def _new_xid(self, found: KernelXid) -> None:
        gpu, uuid = self._identity(found.pci_bus_id)
        counted = self.ledger.record(
            gpu=gpu,
            uuid=uuid,
            xid=found.xid,
            origin="kmsg",
            at=found.seconds,
            sequence=found.sequence,
        )
        if counted:
            log.warning(
                "Xid",
                extra={
                    "gpu": gpu,
                    "pci_bus_id": found.pci_bus_id,
                    "xid": found.xid,
                    "origin": "kmsg",
                },
            )
        if found.xid == RECOVERY_XID:
            code = found.recovery_action
            unknown = code is None or not 0 <= code < len(RECOVERY_ACTIONS)
            action = "unknown" if code is None or unknown else RECOVERY_ACTIONS[code]
            self.kernel_counts.add(RECOVERY, (gpu, uuid, action))
        elif found.xid in NVLINK5_XIDS:
            self.kernel_counts.add(NVLINK5, (gpu, uuid, str(found.xid), *self._decode(found)))

    def _decode(self, found: KernelXid) -> tuple[str, str]:
        """(unit label, action) of an NVLink5 Xid by NVIDIA's decode table; the Xid's catalog
        action (its most severe outcome) when no row describes the message."""
        fields = found.nvlink
        action = None
        if fields is not None:
            action = self._catalog.decode(
                xid=found.xid,
                unit=fields.unit,
                fatal=fields.fatal,
                intr_info=fields.intr_info,
                error_status=fields.error_status,
            )
        if action is None:
            entry = self._catalog.entry(found.xid)
            action = "unknown" if entry is None else entry.action
        units = self._catalog.units(found.xid)
        unit = fields.unit if fields is not None and fields.unit in units else OTHER_UNIT
        return unit, action

    def close(self) -> None:
        self._stop.set()
        if self._kernel_log is not None:
            self._kernel_log.close()
        for thread in self._threads:
            thread.join(timeout=2.0)
        if self._take_lane is not None:
            self._take_lane.close()  # its thread ends once idle; a take holds the set's lock
        if self._nvml is not None:
            self._nvml.close(timeout=2.0)


def parse_sources(value: str) -> frozenset[Origin]:
    """`--collector.xid.source`: `nvml`, `kmsg` or both, comma-separated."""
    names = [name.strip() for name in value.split(",")]
    chosen = frozenset(origin for origin in ORIGINS if origin in names)
    if len(chosen) != len(set(names)):
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected nvml, kmsg or nvml,kmsg (comma-separated sources)"
        )
    return chosen


def _show_sources(sources: frozenset[Origin]) -> str:
    return ",".join(origin for origin in ORIGINS if origin in sources)


@dataclass(frozen=True, kw_only=True)
class XidSettings:
    """`--collector.xid.*` flags."""

    source: frozenset[Origin] = setting(
        frozenset({"nvml"}),
        parse=parse_sources,
        shown=_show_sources,
        metavar="nvml|kmsg|nvml,kmsg",
        help="where Xids come from: NVML events (no privilege; Xids raised while no exporter "
        "listened are lost), the kernel log (history included; needs read access to "
        "/dev/kmsg, CAP_SYSLOG under kernel.dmesg_restrict=1), or both, counted once",
    )
    kmsg_path: Path = setting(
        DEFAULT_PATH,
        parse=Path,
        metavar="PATH",
        help="kernel log device to read, or a file of records in its format (read from "
        "its start, then as it grows); under --simulate, a path other than /dev/kmsg is "
        "read instead of the scenario's kernel log",
    )
    dedup_window: float = duration_setting(
        10.0,
        minimum=0.001,
        maximum=3600.0,
        help="an Xid the kernel log records within this long of the span in which NVML's "
        "take says it was raised (since the last take) counts once",
    )


def _kernel_log(
    context: CollectorContext, settings: XidSettings, *, nvml_events: bool
) -> KernelLog | None:
    try:
        return context.open_kernel_log(settings.kmsg_path)
    except OSError as exc:
        log.warning(
            "kernel log unavailable: Xids come from NVML events only"
            if nvml_events
            else "kernel log unavailable and NVML events not selected: no Xid is counted",
            extra={"path": str(settings.kmsg_path), "reason": exc.strerror},
        )
        return None


def _create(context: CollectorContext, settings: XidSettings) -> XidCollector:
    nvml_events = "nvml" in settings.source
    kernel_log = (
        _kernel_log(context, settings, nvml_events=nvml_events)
        if "kmsg" in settings.source
        else None
    )
    if kernel_log is None and nvml_events:
        log.info(
            "Xids from NVML events only: Xids raised while no exporter listened are not "
            "counted (--collector.xid.source=nvml,kmsg adds the kernel log, which needs "
            "read access to /dev/kmsg)"
        )
    elif kernel_log is not None:
        log.info("Xids from the kernel log", extra={"nvml_events": nvml_events})
    return XidCollector(
        source=context.nvml_source,
        kernel_log=kernel_log,
        ledger=XidLedger(
            window=settings.dedup_window,
            clock=time.monotonic if kernel_log is None else kernel_log.now,
        ),
        nvml_events=nvml_events,
    )


SPEC = CollectorSpec(
    name="xid",
    help="Xid errors per GPU from NVML events and/or the kernel log",
    settings=XidSettings,
    create=_create,
    metrics=SPECS,
)
