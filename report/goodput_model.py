"""Interruptions of training jobs, found and attributed: the Goodput model's first half.

Pure functions over plain records (no store, no pandas), so each rule is tested on its own
and the report, the simulator's truth and the docs describe one model:

- `find_interruptions`: the moments a job stopped making progress and had to restart,
  from its restarts (pods recreated, containers restarted in place, Slurm restart counts)
  and from its activity (every GPU of the job idle at once, then busy again: an in-place
  restart no scheduler sees). A checkpoint save, a planned stop and the job's end are not
  interruptions; restarts within `merge_seconds` of each other are one.
- `attribute`: the cause and node of one interruption, from the node signals of the job's
  nodes in a window around it (Meta's rule: 10 minutes before to 5 after), by `PRECEDENCE`;
  the other signals stay as evidence.

Pricing, ETTR, fleet rates and lemon scores are `fleetwatch.report.goodput_pricing`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from fleetwatch.catalog.nvidia_xids import FALLEN_OFF_BUS, XidCatalog

# Causes, in precedence order: when several signals coincide the first listed wins. A
# GPU that fell off the bus takes an NVLink and its job's network down with it, so the
# GPU comes first; what fleetwatch did in answer (a taint) comes after every hardware
# signal it answered; "node lost" (the node went silent) and "unattributed" are what is
# left when nothing speaks.
GPU_LOST: Final = "gpu_lost_from_bus"
ROW_REMAP: Final = "row_remap_failure"
GPU_MEMORY: Final = "gpu_memory"
GPU_SYSTEM_PROCESSOR: Final = "gpu_system_processor"
GPU_OTHER: Final = "gpu_other"
NVLINK: Final = "nvlink_fabric"
INFINIBAND: Final = "infiniband"
THERMAL: Final = "thermal"
CHECKPOINT_STORAGE: Final = "checkpoint_storage"
NODE_LOST: Final = "node_lost"
FLEETWATCH: Final = "taken_out_by_fleetwatch"
UNATTRIBUTED: Final = "unattributed"

PRECEDENCE: Final = (
    GPU_LOST,
    ROW_REMAP,
    GPU_MEMORY,
    GPU_SYSTEM_PROCESSOR,
    GPU_OTHER,
    NVLINK,
    INFINIBAND,
    THERMAL,
    CHECKPOINT_STORAGE,
    NODE_LOST,
    FLEETWATCH,
)
"""Every cause a signal can give, the strongest first; `UNATTRIBUTED` is none of them."""
CAUSES: Final = (*PRECEDENCE, UNATTRIBUTED)

LLAMA3: Final[dict[str, tuple[str, str]]] = {
    GPU_LOST: ("faulty GPU", "GPU"),
    ROW_REMAP: ("GPU HBM3 memory", "GPU"),
    GPU_MEMORY: ("GPU HBM3 memory", "GPU"),
    GPU_SYSTEM_PROCESSOR: ("GPU system processor", "GPU"),
    GPU_OTHER: ("faulty GPU", "GPU"),
    NVLINK: ("faulty GPU", "GPU"),
    INFINIBAND: ("network switch/cable", "network"),
    THERMAL: ("GPU thermal interface + sensor", "GPU"),
    CHECKPOINT_STORAGE: ("dependency", "dependency"),
    NODE_LOST: ("host (power, chassis, CPU, memory)", "host"),
    FLEETWATCH: ("host maintenance", "unplanned maintenance"),
    UNATTRIBUTED: ("software bug, NCCL watchdog, unknown", "dependency/unknown"),
}
"""Each cause beside the Llama 3 405B report's Table 5 (component, category), so a fleet's
table can be put beside theirs (docs/goodput.md)."""

# Restart kinds: what the scheduler (or the job's activity) showed.
POD_RECREATED: Final = "pods_recreated"
CONTAINER_RESTARTED: Final = "container_restarted"
SLURM_RESTART: Final = "slurm_restart"
IN_PLACE: Final = "in_place"


def xid_cause(code: int, catalog: XidCatalog) -> str | None:
    """The cause an Xid gives, by NVIDIA's catalog: 79 is the GPU lost from the bus; a
    critical Xid (its action more than restarting the application) is GPU memory (ECC,
    DRAM retirement, contained/uncontained memory errors), the GPU system processor (GSP),
    NVLink (an NVLink Xid), or another GPU fault. None for an Xid the catalog does not
    count critical (an application's fault), which stays evidence only."""
    if code == FALLEN_OFF_BUS:
        return GPU_LOST
    entry = catalog.entry(code)
    if entry is None or code not in catalog.critical():
        return None
    name = entry.name
    if any(word in name for word in ("ECC", "DRAM", "SBE", "CONTAINED_ERROR")):
        return GPU_MEMORY
    if "GSP" in name:
        return GPU_SYSTEM_PROCESSOR
    if "NVLINK" in name or name.startswith("ALI_"):
        return NVLINK
    return GPU_OTHER


@dataclass(frozen=True, kw_only=True)
class Restart:
    """A restart the scheduler shows: when (epoch s), what kind, on which nodes."""

    time: float
    kind: str
    nodes: tuple[str, ...] = ()
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class Span:
    """A stretch of time [start, end) in epoch seconds."""

    start: float
    end: float

    def overlaps(self, start: float, end: float) -> bool:
        """Whether this span and [start, end) share any time."""
        return self.start < end and start < self.end

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, kw_only=True)
class JobHistory:
    """What the report read about one training job within the window.

    `active` are the spans during which the job made progress (some GPU of the job busy);
    `saves` its checkpoint saves (the checkpoint records), `planned` its planned stops
    (a suspend, a maintenance stop: the scheduler's own pause, no restart attempt)."""

    job: tuple[str, str]
    nodes: tuple[str, ...]
    gpus: int
    start: float
    end: float
    restarts: tuple[Restart, ...] = ()
    active: tuple[Span, ...] = ()
    saves: tuple[Span, ...] = ()
    planned: tuple[Span, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Signal:
    """A node signal: a cause, on a node, from `time` (to `until`, for a condition that
    lasted: an alert firing, a node silent), with what showed it."""

    node: str
    time: float
    cause: str
    detail: str
    until: float | None = None

    def distance(self, when: float) -> float:
        """Seconds from the signal to `when`: 0 while it lasted, else to its nearer edge."""
        end = self.time if self.until is None else self.until
        if self.time <= when <= end:
            return 0.0
        return self.time - when if when < self.time else when - end


@dataclass(frozen=True, kw_only=True)
class Interruption:
    """One interruption of one job: when it stopped progressing (`time`), the restarts
    that make it one (merged), when its activity came back (`resumed`, None: not within
    the window), and, once attributed, its cause, node and the evidence."""

    job: tuple[str, str]
    time: float
    kinds: tuple[str, ...]
    nodes: tuple[str, ...]
    resumed: float | None = None
    cause: str = UNATTRIBUTED
    node: str = ""
    evidence: tuple[Signal, ...] = field(default=())


def _stopped_before(active: Sequence[Span], when: float, slack: float) -> float:
    """When the job last stopped progressing at or before `when` (+ `slack`): the end of
    the active span that ends last by then, or `when` itself when it was still active."""
    ends = [s.end for s in active if s.end <= when + slack]
    # A restart seen as the job came back (a Slurm job's new restart count) falls at the
    # start of a span: the job stopped at the end of the span before.
    running = any(s.start + slack <= when < s.end for s in active)
    if running or not ends:
        return when
    return max(ends)


def _saved_until(saves: Sequence[Span], stopped: float, restart: float, slack: float) -> float:
    """When the job's work was last safe before a restart at `restart`: the end of a
    checkpoint save that began as the job stopped progressing (`stopped`, within `slack`)
    and ended by the restart, else `stopped`. A job that saves and then fails lost nothing
    of its work, and the save's time is the save's, not the interruption's."""
    ends = [s.end for s in saves if s.start >= stopped - slack and s.end <= restart + slack]
    return max([stopped, *ends])


def _resumed_after(active: Sequence[Span], when: float) -> float | None:
    """When the job was active again after `when`: the start of the first span that
    starts after it; None when none does within the window."""
    starts = [s.start for s in active if s.start > when]
    return min(starts) if starts else None


def find_interruptions(
    history: JobHistory, *, merge_seconds: float = 60.0, step: float = 60.0
) -> list[Interruption]:
    """Every interruption of one job, in time order.

    Scheduler restarts (`history.restarts`) are interruptions unless they fall in a
    planned stop; restarts within `merge_seconds` of the previous one are the same
    interruption. A gap in the job's activity (`active`) that no restart explains, inside
    the job's life, not overlapping a checkpoint save or a planned stop, and after which
    the job is active again, is an in-place restart. The interruption's time is when the
    job stopped progressing (the end of its activity before the restart, or of a checkpoint
    save it completed between that and the restart), `resumed` when it progressed again.
    `step` is the resolution the activity was read at (a gap must be longer than it)."""
    planned = history.planned
    restarts = sorted(
        (r for r in history.restarts if not any(p.overlaps(r.time, r.time + 1) for p in planned)),
        key=lambda r: r.time,
    )
    groups: list[list[Restart]] = []
    for restart in restarts:
        if groups and restart.time - groups[-1][-1].time <= merge_seconds:
            groups[-1].append(restart)
        else:
            groups.append([restart])
    found: list[Interruption] = []
    active = sorted(history.active, key=lambda s: s.start)
    for group in groups:
        first = group[0].time
        stopped = _saved_until(history.saves, _stopped_before(active, first, step), first, step)
        nodes = tuple(sorted({n for r in group for n in r.nodes}))
        found.append(
            Interruption(
                job=history.job,
                time=stopped,
                kinds=tuple(dict.fromkeys(r.kind for r in group)),
                nodes=nodes or history.nodes,
                resumed=_resumed_after(active, stopped),
            )
        )
    for before, after in itertools.pairwise(active):
        gap_start, gap_end = before.end, after.start
        if gap_end - gap_start < step:
            continue
        explained = any(
            gap_start - step <= i.time <= gap_end + step
            or (i.time <= gap_start and (i.resumed is None or i.resumed >= gap_end))
            for i in found
        )
        blocked = any(
            s.overlaps(gap_start - step, gap_end + step) for s in (*history.saves, *planned)
        )
        if explained or blocked:
            continue
        found.append(
            Interruption(
                job=history.job,
                time=gap_start,
                kinds=(IN_PLACE,),
                nodes=history.nodes,
                resumed=gap_end,
            )
        )
    return sorted(found, key=lambda i: i.time)


@dataclass(frozen=True, kw_only=True)
class AttributionWindow:
    """How far before and after an interruption a node signal counts (seconds)."""

    before: float = 600.0
    after: float = 300.0


def attribute(
    interruption: Interruption,
    signals: Iterable[Signal],
    *,
    window: AttributionWindow = AttributionWindow(),
) -> Interruption:
    """The interruption with its cause and node: of the signals on its nodes seen within
    the window (a lasting one counts while it overlaps it), the first in `PRECEDENCE`
    (ties: the one nearest the interruption); every such signal is kept as evidence. No
    signal: `UNATTRIBUTED`, no node."""
    nodes = set(interruption.nodes)
    t = interruption.time

    def seen(s: Signal) -> bool:
        end = s.time if s.until is None else s.until
        return s.node in nodes and s.time <= t + window.after and end >= t - window.before

    near = sorted(
        (s for s in signals if seen(s)),
        key=lambda s: (PRECEDENCE.index(s.cause), s.distance(t), s.node),
    )
    if not near:
        return _with(interruption, cause=UNATTRIBUTED, node="", evidence=())
    top = near[0]
    return _with(interruption, cause=top.cause, node=top.node, evidence=tuple(near))


def _with(
    interruption: Interruption, *, cause: str, node: str, evidence: tuple[Signal, ...]
) -> Interruption:
    return Interruption(
        job=interruption.job,
        time=interruption.time,
        kinds=interruption.kinds,
        nodes=interruption.nodes,
        resumed=interruption.resumed,
        cause=cause,
        node=node,
        evidence=evidence,
    )
