"""What interruptions cost: the Goodput model's second half, pure functions.

- `price`: a job's lost GPU-hours by cause (GPUs held while not progressing, plus work
  redone since the last checkpoint: from the checkpoint records, else estimated as half the
  assumed interval, and said so) and its measured ETTR (time progressing less the work
  redone, over wall-clock).
- `predicted_ettr`, `young_daly_interval`: the closed form of Kokolis et al. (arXiv
  2410.21680), `E[ETTR] ≈ (1 - N·r_f·(u0 + Δ/2)) / (1 + w/Δ)`, and the interval that
  maximises it, `sqrt(2·w·MTTF)`, with `recommend` turning them into one sentence.
- `per_thousand_node_days`, `projected_mttf_hours`: the fleet's rate and what it means
  for a job of a given size (Meta: MTTF = 1 / (nodes * r_f)).
- `lemons`: nodes that keep interrupting jobs, from the interruptions attributed to them
  (multi-node and single-node jobs apart), their Xids, taints and time out of service,
  each node's interruptions judged against the rest of the fleet's rate (`poisson_tail`).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from fleetwatch.report.goodput_model import (
    CAUSES,
    UNATTRIBUTED,
    Interruption,
    JobHistory,
)

SECONDS_PER_DAY: Final = 86400.0
GPUS_PER_NODE: Final = 8


@dataclass(frozen=True, kw_only=True)
class JobCost:
    """One job's figures over the window (seconds unless named otherwise)."""

    job: tuple[str, str]
    gpus: int
    nodes: int
    wall_seconds: float
    progress_seconds: float
    """Time the job made progress (its activity spans), redone work included."""
    down_seconds: float
    redone_seconds: float
    saving_seconds: float
    interruptions: int
    lost_gpu_hours_by_cause: Mapping[str, float]
    redone_estimated: bool
    """True when the job had no checkpoint records: redone work is half the assumed
    checkpoint interval per interruption."""
    checkpoint_interval_seconds: float | None
    save_seconds: float | None
    restart_seconds: float | None
    """Median time from an interruption to progress again (the restart overhead u0)."""

    @property
    def ettr(self) -> float:
        """Measured ETTR: the share of wall-clock time the job made new progress (time
        progressing less the work it redid). Whatever kept it from progressing counts
        against it: interruptions, saves, a planned stop, a stall."""
        if self.wall_seconds <= 0:
            return 0.0
        return max(0.0, (self.progress_seconds - self.redone_seconds) / self.wall_seconds)

    @property
    def mtti_hours(self) -> float | None:
        """Mean time between interruptions over the window; None without any."""
        return self.wall_seconds / self.interruptions / 3600 if self.interruptions else None

    @property
    def lost_gpu_hours(self) -> float:
        return sum(self.lost_gpu_hours_by_cause.values())


def _last_save_end(history: JobHistory, before: float, since: float) -> float | None:
    ends = [s.end for s in history.saves if since <= s.end <= before]
    return max(ends) if ends else None


def price(
    history: JobHistory,
    interruptions: Sequence[Interruption],
    *,
    assumed_interval: float,
) -> JobCost:
    """The job's cost: per interruption, the time it held its GPUs without progress (from
    the interruption until its activity came back, or the window's end) and the work it
    redoes (since the end of its last save, else since it last resumed or started; without
    any checkpoint record, half `assumed_interval`, capped by the time it had run); the
    time it spent saving; GPU-hours at the job's GPU count."""
    by_cause: dict[str, float] = dict.fromkeys(CAUSES, 0.0)
    down = redone = 0.0
    estimated = not history.saves
    restarts: list[float] = []
    resumed_at = history.start
    for i in sorted(interruptions, key=lambda i: i.time):
        end = i.resumed if i.resumed is not None else history.end
        held = max(0.0, min(end, history.end) - i.time)
        if i.resumed is not None:
            restarts.append(held)
        ran = max(0.0, i.time - resumed_at)
        if estimated:
            lost = min(assumed_interval / 2, ran)
        else:
            since = _last_save_end(history, i.time, resumed_at)
            lost = i.time - (since if since is not None else resumed_at)
        down += held
        redone += lost
        by_cause[i.cause] += (held + lost) * history.gpus / 3600
        resumed_at = end
    saves = sorted(history.saves, key=lambda s: s.start)
    gaps = [b.start - a.start for a, b in itertools.pairwise(saves)]
    return JobCost(
        job=history.job,
        gpus=history.gpus,
        nodes=len(history.nodes),
        wall_seconds=history.end - history.start,
        progress_seconds=sum(
            max(0.0, min(s.end, history.end) - max(s.start, history.start)) for s in history.active
        ),
        down_seconds=down,
        redone_seconds=redone,
        saving_seconds=sum(s.seconds for s in saves),
        interruptions=len(interruptions),
        lost_gpu_hours_by_cause={c: v for c, v in by_cause.items() if v > 0},
        redone_estimated=estimated,
        checkpoint_interval_seconds=statistics.median(gaps) if gaps else None,
        save_seconds=statistics.median(s.seconds for s in saves) if saves else None,
        restart_seconds=statistics.median(restarts) if restarts else None,
    )


def predicted_ettr(
    *, nodes: int, rate_per_node_second: float, restart: float, interval: float, save: float
) -> float:
    """Kokolis et al.'s expected ETTR of a job on `nodes` nodes at a fleet failure rate,
    restart overhead `restart`, checkpoint `interval` and `save` time (seconds):
    `(1 - N·r_f·(u0 + Δ/2)) / (1 + w/Δ)`, floored at 0."""
    if interval <= 0:
        return 0.0
    lost = nodes * rate_per_node_second * (restart + interval / 2)
    return max(0.0, (1 - lost) / (1 + save / interval))


def young_daly_interval(*, save: float, mttf: float) -> float:
    """The checkpoint interval that maximises ETTR to first order: `sqrt(2·w·MTTF)`."""
    return math.sqrt(2 * save * mttf)


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """The job's checkpoint interval now and at the optimum, with the ETTR of each, and the
    write bandwidth the save time needs (None when the checkpoint's size is unknown)."""

    interval: float
    optimum: float
    ettr_now: float
    ettr_optimum: float
    bandwidth_bytes_per_second: float | None

    def sentence(self) -> str:
        """ "save every 14 min instead of 60: ETTR 0.86 → 0.93"."""
        words = (
            f"save every {self.optimum / 60:.0f} min instead of {self.interval / 60:.0f}: "
            f"ETTR {self.ettr_now:.2f} → {self.ettr_optimum:.2f}"
        )
        if self.bandwidth_bytes_per_second is not None:
            words += (
                f" (needs {self.bandwidth_bytes_per_second / 1e9:.1f} GB/s of checkpoint writes)"
            )
        return words


def recommend(
    cost: JobCost,
    *,
    rate_per_node_second: float,
    checkpoint_bytes: float | None = None,
    assumed_interval: float,
) -> Recommendation | None:
    """The Young/Daly recommendation for one job, from its own figures (nodes, checkpoint
    interval and save time, restart time) and the fleet's failure rate. None when the job
    never saved (no save time to weigh) or the fleet saw no failure (no MTTF)."""
    if cost.save_seconds is None or rate_per_node_second <= 0:
        return None
    interval = cost.checkpoint_interval_seconds or assumed_interval
    restart = cost.restart_seconds or 0.0
    mttf = 1 / (cost.nodes * rate_per_node_second)
    optimum = young_daly_interval(save=cost.save_seconds, mttf=mttf)
    return Recommendation(
        interval=interval,
        optimum=optimum,
        ettr_now=_ettr(cost, rate_per_node_second, restart, interval),
        ettr_optimum=_ettr(cost, rate_per_node_second, restart, optimum),
        bandwidth_bytes_per_second=(
            checkpoint_bytes / cost.save_seconds if checkpoint_bytes and cost.save_seconds else None
        ),
    )


def _ettr(cost: JobCost, rate: float, restart: float, interval: float) -> float:
    return predicted_ettr(
        nodes=cost.nodes,
        rate_per_node_second=rate,
        restart=restart,
        interval=interval,
        save=cost.save_seconds or 0.0,
    )


def per_thousand_node_days(count: float, node_seconds: float) -> float:
    """A count of interruptions as a rate per 1,000 node-days (Meta's unit)."""
    return count / (node_seconds / SECONDS_PER_DAY) * 1000 if node_seconds > 0 else 0.0


def projected_mttf_hours(gpus: int, rate_per_thousand_node_days: float) -> float | None:
    """Mean time to failure of a job of `gpus` GPUs (8 a node) at the fleet's rate:
    `1 / (nodes * r_f)`; None at a rate of 0."""
    if rate_per_thousand_node_days <= 0:
        return None
    nodes = max(1, gpus // GPUS_PER_NODE)
    per_node_day = rate_per_thousand_node_days / 1000
    return 24 / (nodes * per_node_day)


def cause_counts(interruptions: Iterable[Interruption]) -> Counter[str]:
    """Interruptions by cause."""
    return Counter(i.cause for i in interruptions)


@dataclass(frozen=True, kw_only=True)
class LemonThresholds:
    """When a node is a lemon (thresholds.goodput in the rules config)."""

    multi_node: int = 2
    single_node: int = 3
    xids: int = 10
    taints: int = 3
    hours_out: float = 24.0
    fleet_tail: float = 0.01
    """The most probable a node's interruption count may be, for a node at the rest of the
    fleet's rate, and still make it a lemon."""


@dataclass(frozen=True, kw_only=True)
class NodeRecord:
    """A node's own signals over the scoring window."""

    xids: int = 0
    taints: int = 0
    hours_out: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Lemon:
    """One node's score and why it is (or is not) a lemon."""

    node: str
    multi_node: int
    single_node: int
    jobs: int
    record: NodeRecord
    reasons: tuple[str, ...] = field(default=())
    expected: float = 0.0
    """Interruptions the rest of the fleet's rate expects of the node over its time."""
    tail: float = 1.0
    """The chance a node at that rate interrupts as many jobs (Poisson upper tail)."""
    lemon: bool = False

    @property
    def score(self) -> float:
        """Ranking within the same interruptions (multi-node jobs count twice, and rank
        first): the node's own signals."""
        r = self.record
        return (
            2 * self.multi_node + self.single_node + r.xids / 10 + r.taints / 2 + r.hours_out / 24
        )


def poisson_tail(count: int, mean: float) -> float:
    """P(X >= count) for X Poisson-distributed with `mean`."""
    if count <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    term, below = math.exp(-mean), 0.0
    for k in range(count):
        below += term
        term *= mean / (k + 1)
    return max(0.0, 1.0 - below)


def lemons(
    interruptions: Iterable[Interruption],
    job_nodes: Mapping[tuple[str, str], int],
    records: Mapping[str, NodeRecord],
    thresholds: LemonThresholds,
    node_seconds: Mapping[str, float],
) -> list[Lemon]:
    """Every node with an attributed interruption or a signal, scored, lemons first.

    The floor: a lemon interrupted at least `multi_node` jobs spanning several nodes or
    `single_node` single-node jobs, or combines two of: an interruption, `xids` Xids,
    `taints` taints, `hours_out` hours out of service. Against the fleet: a node with
    interruptions is a lemon only when so many are improbable (at most `fleet_tail`) for a
    node at the rate of the rest of the fleet (its other nodes' attributed interruptions
    per second present, `node_seconds`, times this node's seconds), so a fleet that fails
    often does not make every node a lemon. `job_nodes` gives each job's node count."""
    multi: Counter[str] = Counter()
    single: Counter[str] = Counter()
    jobs: dict[str, set[tuple[str, str]]] = {}
    for i in interruptions:
        if i.cause == UNATTRIBUTED or not i.node:
            continue
        (multi if job_nodes.get(i.job, 1) > 1 else single)[i.node] += 1
        jobs.setdefault(i.node, set()).add(i.job)
    total = sum(multi.values()) + sum(single.values())
    fleet_seconds = sum(node_seconds.values())
    window = max(node_seconds.values(), default=0.0)
    out = []
    for node in sorted(set(multi) | set(single) | set(records)):
        record = records.get(node, NodeRecord())
        own = multi[node] + single[node]
        seconds = node_seconds.get(node, window)
        rest = fleet_seconds - node_seconds.get(node, 0.0)
        expected = (total - own) / rest * seconds if rest > 0 else 0.0
        tail = poisson_tail(own, expected)
        reasons = []
        if multi[node] >= thresholds.multi_node:
            reasons.append(f"interrupted {multi[node]} multi-node jobs")
        if single[node] >= thresholds.single_node:
            reasons.append(f"interrupted {single[node]} single-node jobs")
        own_signals = [
            f"{record.xids} Xids" if record.xids >= thresholds.xids else "",
            f"{record.taints} taints" if record.taints >= thresholds.taints else "",
            f"{record.hours_out:.1f} h out of service"
            if record.hours_out >= thresholds.hours_out
            else "",
        ]
        own_signals = [o for o in own_signals if o]
        if not reasons and len(own_signals) + (own > 0) >= 2:
            reasons.append("repeat signals")
        stands_out = own == 0 or tail <= thresholds.fleet_tail
        if reasons:
            reasons += own_signals
            if own:
                reasons.append(
                    f"{'' if stands_out else 'within the fleet: '}{own} interruptions where "
                    f"the rest of the fleet's rate expects {expected:.2g} (p={tail:.2g})"
                )
        out.append(
            Lemon(
                node=node,
                multi_node=multi[node],
                single_node=single[node],
                jobs=len(jobs.get(node, ())),
                record=record,
                reasons=tuple(reasons),
                expected=expected,
                tail=tail,
                lemon=bool(reasons) and stands_out,
            )
        )
    return sorted(
        out,
        key=lambda lemon: (
            not lemon.lemon,
            -(2 * lemon.multi_node + lemon.single_node),
            -lemon.score,
            lemon.node,
        ),
    )
