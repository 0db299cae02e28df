"""The Goodput section: every interruption of every training job found, attributed and
priced, the fleet's rates beside published ones, and lemon nodes (docs/goodput.md).

It reads job-level records and sparse events (`fleetwatch.report.goodput_queries`), builds
one `JobHistory` per job (its activity, restarts, saves and planned stops), and runs the
model (`fleetwatch.report.goodput_model`, `fleetwatch.report.goodput_pricing`) on it. What
it cannot read it says in its notes, and computes the rest: a job label that changed
mid-run (the job is the latest name), a pod without a node, Slurm jobs without a restart
count, a window shorter than the attribution window.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Final

import pandas as pd

from fleetwatch.catalog.nvidia_xids import shipped_catalog
from fleetwatch.catalog.slurm import SLURM_NAMESPACE
from fleetwatch.durations import format_duration, parse_duration
from fleetwatch.report.dataset import RAW, Dataset
from fleetwatch.report.goodput_model import (
    CONTAINER_RESTARTED,
    IN_PLACE,
    LLAMA3,
    POD_RECREATED,
    SLURM_RESTART,
    AttributionWindow,
    Interruption,
    JobHistory,
    Restart,
    Span,
    attribute,
    find_interruptions,
)
from fleetwatch.report.goodput_pricing import (
    JobCost,
    LemonThresholds,
    NodeRecord,
    lemons,
    per_thousand_node_days,
    predicted_ettr,
    price,
    projected_mttf_hours,
    recommend,
)
from fleetwatch.report.goodput_queries import NO_RESTART_COUNT, SLURM_RESTARTS
from fleetwatch.report.goodput_signals import (
    node_seconds,
    node_signals,
    seconds_by_node,
    spans,
)
from fleetwatch.report.query import JOB
from fleetwatch.report.section import Section, ranked
from fleetwatch.report.thresholds import shipped_config
from fleetwatch.rules.interruptions import JOB_GPUS_RECORD, JOB_TENSOR_MAX_RECORD

TITLE = "Goodput"
PROJECTED_GPUS = (8, 1024, 16384)
SLURM = SLURM_NAMESPACE
RECORD_KINDS: Final[dict[str, str]] = {
    "container_restart": CONTAINER_RESTARTED,
    "jobset_restart": POD_RECREATED,
    "pod_recreated": POD_RECREATED,
    "slurm_requeue": SLURM_RESTART,
    "in_place": IN_PLACE,
}
"""The report's restart kind for each live record kind (`fleetwatch.rules.interruptions`)
that names what the scheduler's series show; the others (a pod evicted or lost with its
node, a Slurm node failed) keep the record's name: only the rules see them."""


@dataclass(frozen=True, kw_only=True)
class GoodputSettings:
    """`thresholds.goodput` of the rules config, in seconds."""

    window: AttributionWindow
    merge_seconds: float
    assumed_interval: float
    lemon_window: float
    lemon: LemonThresholds

    @classmethod
    def from_config(cls) -> GoodputSettings:
        g = shipped_config().thresholds["goodput"]
        return cls(
            window=AttributionWindow(
                before=parse_duration(str(g["attribution_before"])),
                after=parse_duration(str(g["attribution_after"])),
            ),
            merge_seconds=parse_duration(str(g["restart_merge"])),
            assumed_interval=parse_duration(str(g["assumed_checkpoint_interval"])),
            lemon_window=parse_duration(str(g["lemon_window"])),
            lemon=LemonThresholds(
                multi_node=int(g["lemon_multi_node_interruptions"]),
                single_node=int(g["lemon_single_node_interruptions"]),
                xids=int(g["lemon_xids"]),
                taints=int(g["lemon_taints"]),
                hours_out=float(g["lemon_hours_out"]),
                fleet_tail=float(g["lemon_fleet_tail_ratio"]),
            ),
        )


@dataclass
class Pods:
    """Pod incarnations: creation time, node, job and JobSet attempt, by (ns, pod, uid)."""

    created: dict[tuple[str, str, str], float] = field(default_factory=dict)
    nodes: dict[tuple[str, str, str], str] = field(default_factory=dict)
    job: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    attempt: dict[tuple[str, str], int] = field(default_factory=dict)
    renamed: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    """Jobs whose pods later carried another job name: old -> latest."""


def _rows(ds: Dataset, name: str) -> pd.DataFrame | None:
    frame = ds.frame(name)
    return None if frame is None else frame.astype({"timestamp": "float64"})


def _pods(ds: Dataset, notes: list[str]) -> Pods:
    """The pods the store knows, with the notes their bad input calls for."""
    pods = Pods()
    created, where = ds.frame("goodput_pod_created"), ds.frame("goodput_pod_nodes")
    for row in () if created is None else created.itertuples(index=False):
        pods.created[(str(row.namespace), str(row.pod), str(row.uid))] = float(row.value)
    nodeless = []
    for row in () if where is None else where.itertuples(index=False):
        key = (str(row.namespace), str(row.pod), str(row.uid))
        if str(row.node):
            pods.nodes[key] = str(row.node)
        elif key not in pods.nodes:
            nodeless.append(f"{key[0]}/{key[1]}")
    nodeless = sorted(set(nodeless) - {f"{k[0]}/{k[1]}" for k in pods.nodes})
    if nodeless:
        notes.append(
            f"pods without a node in kube_pod_info: {', '.join(nodeless[:10])}: their "
            "restarts count, attributed on their job's other nodes only"
        )
    jobs = ds.frame("goodput_pod_jobs")
    seen: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
    for row in () if jobs is None else jobs.itertuples(index=False):
        seen[(str(row.namespace), str(row.pod))].append((float(row.value), str(row.training_job)))
    for pod, names in seen.items():
        latest = max(names)[1]
        pods.job[pod] = (pod[0], latest)
        for _, old in names:
            if old != latest:
                pods.renamed[(pod[0], old)] = (pod[0], latest)
    if pods.renamed:
        changed = ", ".join(f"{a[0]}/{a[1]} → {b[1]}" for a, b in sorted(pods.renamed.items()))
        notes.append(
            f"a job label changed mid-run ({changed}): counted as one job under its latest name"
        )
    attempts = ds.frame("goodput_pod_attempts")
    for row in () if attempts is None else attempts.itertuples(index=False):
        if str(row.attempt).isdigit():
            pods.attempt[(str(row.namespace), str(row.pod))] = int(row.attempt)
    return pods


def _job(pods: Pods, namespace: str, name: str) -> tuple[str, str]:
    job = (namespace, name)
    return pods.renamed.get(job, job)


@dataclass
class Parts:
    """What one job's history is built from, gathered across the queries."""

    active: list[Span] = field(default_factory=list)
    saves: list[Span] = field(default_factory=list)
    planned: list[Span] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    nodes: set[str] = field(default_factory=set)
    gpus: int = 0


def _pod_restarts(pods: Pods, parts: dict[tuple[str, str], Parts], merge: float) -> None:
    """Pods recreated: per job, pod creations in clusters (within `merge`); every cluster
    after the first is a restart, unless the JobSet restart attempt is known on both sides
    and did not grow (a planned stop: a suspend and resume)."""
    by_job: dict[tuple[str, str], list[tuple[float, tuple[str, str, str]]]] = defaultdict(list)
    for key, when in pods.created.items():
        job = pods.job.get((key[0], key[1]))
        if job is not None:
            by_job[job].append((when, key))
    for job, created in by_job.items():
        created.sort()
        clusters: list[list[tuple[float, tuple[str, str, str]]]] = []
        for item in created:
            if clusters and item[0] - clusters[-1][-1][0] <= merge:
                clusters[-1].append(item)
            else:
                clusters.append([item])
        part = parts.setdefault(job, Parts())
        part.nodes |= {pods.nodes[k] for _, k in created if k in pods.nodes}
        for before, cluster in itertools.pairwise(clusters):
            old = [pods.attempt.get((k[0], k[1]), -1) for _, k in before]
            new = [pods.attempt.get((k[0], k[1]), -1) for _, k in cluster]
            when = cluster[0][0]
            if min(old + new) >= 0 and max(new) <= max(old):
                part.planned.append(Span(start=_stop_before(part.active, when), end=when + merge))
                continue
            nodes = tuple(sorted({pods.nodes[k] for _, k in before if k in pods.nodes}))
            part.restarts.append(Restart(time=when, kind=POD_RECREATED, nodes=nodes))


def _stop_before(active: list[Span], when: float) -> float:
    ends = [s.end for s in active if s.end <= when]
    return max(ends) if ends else when


def _container_restarts(ds: Dataset, pods: Pods, parts: dict[tuple[str, str], Parts]) -> None:
    frame = ds.frame("goodput_container_restarts")
    for row in () if frame is None else frame.itertuples(index=False):
        job = pods.job.get((str(row.namespace), str(row.pod)))
        if job is None:
            continue
        node = pods.nodes.get((str(row.namespace), str(row.pod), str(row.uid)))
        restart = Restart(
            time=float(row.timestamp), kind=CONTAINER_RESTARTED, nodes=(node,) if node else ()
        )
        parts.setdefault(job, Parts()).restarts.append(restart)


def _slurm_restarts(ds: Dataset, parts: dict[tuple[str, str], Parts], notes: list[str]) -> None:
    """Slurm jobs' restart counts: a count above the highest one the job had before is a
    restart, when it was first seen; a job without a restart count is said."""
    frame = ds.frame("goodput_slurm_restarts")
    if frame is None or frame.empty:
        return
    first: dict[str, dict[int, float]] = defaultdict(dict)
    uncounted: set[str] = set()
    for row in frame.itertuples(index=False):
        job_id = str(row.job_id)
        parts.setdefault((SLURM, job_id), Parts()).nodes.add(str(row.node))
        if row.value == NO_RESTART_COUNT:
            uncounted.add(job_id)
            continue
        seen = first[job_id]
        seen[int(row.value)] = min(seen.get(int(row.value), row.timestamp), float(row.timestamp))
    for job_id, counts in first.items():
        part = parts[(SLURM, job_id)]
        highest = None
        for number, when in sorted(counts.items(), key=lambda item: item[1]):
            if highest is not None and number > highest:
                restart = Restart(time=when, kind=SLURM_RESTART, nodes=tuple(sorted(part.nodes)))
                part.restarts.append(restart)
            highest = number if highest is None else max(highest, number)
    if uncounted:
        notes.append(
            f"Slurm jobs without a restart count ({', '.join(sorted(uncounted)[:10])}): "
            f"{SLURM_RESTARTS} has no series for them (an exporter before it); their "
            "requeues show only as gaps in their activity (in-place restarts)"
        )


def _recorded_restarts(
    ds: Dataset, pods: Pods, parts: dict[tuple[str, str], Parts], merge: float
) -> None:
    """The live rules' interruption records: each run's start is a restart of its kind,
    on the nodes the per-node record names for the job and kind within `merge` of it. They
    stand beside the restarts the scheduler's series show (one interruption when within
    `merge`) and add what only the rules see (evictions, nodes lost or failed)."""
    frame = ds.frame("goodput_interruption_records")
    if frame is None:
        return
    named: dict[tuple[str, str, str], list[tuple[float, str]]] = defaultdict(list)
    by_node = ds.frame("goodput_node_interruption_records")
    for row in () if by_node is None else by_node.itertuples(index=False):
        key = (str(row.namespace), str(row.training_job), str(row.kind))
        named[key].append((float(row.timestamp), str(row.node)))
    for row in frame.itertuples(index=False):
        key = (str(row.namespace), str(row.training_job), str(row.kind))
        when = float(row.timestamp)
        nodes = tuple(sorted({n for t, n in named[key] if abs(t - when) <= merge}))
        restart = Restart(time=when, kind=RECORD_KINDS.get(key[2], key[2]), nodes=nodes)
        parts.setdefault(_job(pods, key[0], key[1]), Parts()).restarts.append(restart)


def histories(ds: Dataset, settings: GoodputSettings, notes: list[str]) -> list[JobHistory]:
    """One history per training job with activity in the window."""
    w = ds.window
    pods = _pods(ds, notes)
    parts: dict[tuple[str, str], Parts] = {}
    for (namespace, name), runs in spans(
        _rows(ds, "goodput_job_activity"), JOB, start=w.start, end=w.end
    ).items():
        parts.setdefault(_job(pods, namespace, name), Parts()).active += runs
    for (namespace, name), runs in spans(
        _rows(ds, "goodput_saves"), JOB, start=w.start, end=w.end
    ).items():
        parts.setdefault(_job(pods, namespace, name), Parts()).saves += runs
    gpus = ds.frame("goodput_job_gpus")
    for row in () if gpus is None else gpus.itertuples(index=False):
        part = parts.setdefault(_job(pods, str(row.namespace), str(row.training_job)), Parts())
        part.gpus = max(part.gpus, int(row.value))
    nodes = ds.frame("goodput_job_nodes")
    for row in () if nodes is None else nodes.itertuples(index=False):
        part = parts.setdefault(_job(pods, str(row.namespace), str(row.training_job)), Parts())
        part.nodes.add(str(row.node))
    _pod_restarts(pods, parts, settings.merge_seconds)
    _container_restarts(ds, pods, parts)
    _slurm_restarts(ds, parts, notes)
    _recorded_restarts(ds, pods, parts, settings.merge_seconds)
    out = []
    for job, part in sorted(parts.items()):
        if not part.active:
            continue
        active = _merged(part.active)
        out.append(
            JobHistory(
                job=job,
                nodes=tuple(sorted(part.nodes)),
                gpus=part.gpus,
                start=active[0].start,
                end=active[-1].end,
                restarts=tuple(part.restarts),
                active=tuple(active),
                saves=tuple(part.saves),
                planned=tuple(part.planned),
            )
        )
    return out


def _merged(runs: list[Span]) -> list[Span]:
    """Spans sorted, those that touch or overlap joined (a renamed job's two halves)."""
    out: list[Span] = []
    for run in sorted(runs, key=lambda s: s.start):
        if out and run.start <= out[-1].end:
            out[-1] = Span(start=out[-1].start, end=max(out[-1].end, run.end))
        else:
            out.append(run)
    return out


def goodput(ds: Dataset) -> Section:
    """The Goodput section: interruptions, jobs, causes, nodes, projections, lemons."""
    section = Section(TITLE)
    if ds.frame("goodput_job_activity") is None:
        section.notes.append(f"goodput_job_activity: {ds.problems.get('goodput_job_activity')}")
        return section
    settings = GoodputSettings.from_config()
    w = ds.window
    if ds.sources.get("goodput_job_activity") == RAW:
        section.caveats.append(
            f"the rules' job records ({JOB_TENSOR_MAX_RECORD}, {JOB_GPUS_RECORD}, ...) do not "
            "cover the window (rules not loaded, or loaded after its start): each job's "
            "activity, GPUs and nodes were read from every GPU's series instead"
        )
    attribution = settings.window.before + settings.window.after
    if w.seconds < attribution:
        section.caveats.append(
            f"the window ({format_duration(w.seconds)}) is shorter than the attribution window "
            f"({format_duration(settings.window.before)} before to "
            f"{format_duration(settings.window.after)} after): signals of interruptions near "
            "its edges may be out of it"
        )
    jobs = histories(ds, settings, section.caveats)
    found = node_signals(
        alerts=_rows(ds, "goodput_alerts"),
        xids=_rows(ds, "goodput_xids"),
        present=_rows(ds, "goodput_nodes_present"),
        catalog=shipped_catalog(),
        start=w.start,
        end=w.end,
    )
    interruptions: list[Interruption] = []
    costs: list[JobCost] = []
    for job in jobs:
        mine = [
            attribute(i, found.signals, window=settings.window)
            for i in find_interruptions(job, merge_seconds=settings.merge_seconds, step=w.step)
        ]
        interruptions += mine
        costs.append(price(job, mine, assumed_interval=settings.assumed_interval))
    seconds = node_seconds(_rows(ds, "goodput_nodes_present"), start=w.start, end=w.end)
    rate = per_thousand_node_days(len(interruptions), seconds)
    section.tables["goodput_interruptions"] = _interruptions(interruptions)
    section.tables["goodput_jobs"] = _jobs(ds, costs, rate, settings)
    section.tables["goodput_causes"] = _causes(interruptions, costs, seconds)
    section.tables["goodput_nodes"] = _nodes(interruptions, costs)
    section.tables["goodput_projected_mttf"] = pd.DataFrame(
        [(g, projected_mttf_hours(g, rate)) for g in PROJECTED_GPUS],
        columns=["gpus", "mttf_hours"],
    )
    if w.seconds < settings.lemon_window:
        section.caveats.append(
            f"lemon scores cover the report's window ({format_duration(w.seconds)}), shorter "
            f"than thresholds.goodput.lemon_window ({format_duration(settings.lemon_window)})"
        )
    present = seconds_by_node(_rows(ds, "goodput_nodes_present"), start=w.start, end=w.end)
    section.tables["goodput_lemons"] = _lemons(
        interruptions, jobs, found.records, settings, present
    )
    section.tables["goodput_activity"] = pd.DataFrame(
        [(*j.job, s.start, s.end) for j in jobs for s in j.active],
        columns=["namespace", "training_job", "start", "end"],
    )
    return section


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return str(pd.Timestamp(ts, unit="s", tz="UTC").strftime("%Y-%m-%dT%H:%M:%SZ"))


def _interruptions(found: list[Interruption]) -> pd.DataFrame:
    rows = [
        {
            "namespace": i.job[0],
            "training_job": i.job[1],
            "time": _when(i.time),
            "timestamp": i.time,
            "kinds": " ".join(i.kinds),
            "cause": i.cause,
            "llama3_component": LLAMA3[i.cause][0],
            "node": i.node,
            "down_minutes": (i.resumed - i.time) / 60 if i.resumed is not None else None,
            "evidence": "; ".join(f"{s.node} {s.detail}" for s in i.evidence),
        }
        for i in sorted(found, key=lambda i: (i.time, i.job))
    ]
    columns = ["namespace", "training_job", "time", "timestamp", "kinds", "cause"]
    columns += ["llama3_component", "node", "down_minutes", "evidence"]
    return pd.DataFrame(rows, columns=columns)


def _jobs(
    ds: Dataset, costs: list[JobCost], rate: float, settings: GoodputSettings
) -> pd.DataFrame:
    per_second = rate / 1000 / 86400
    sizes = ds.frame("goodput_checkpoint_bytes")
    size = (
        {}
        if sizes is None
        else {(str(r.namespace), str(r.training_job)): float(r.value) for r in sizes.itertuples()}
    )
    rows = []
    for c in costs:
        advice = recommend(
            c,
            rate_per_node_second=per_second,
            checkpoint_bytes=size.get(c.job),
            assumed_interval=settings.assumed_interval,
        )
        interval = c.checkpoint_interval_seconds or settings.assumed_interval
        rows.append(
            {
                "namespace": c.job[0],
                "training_job": c.job[1],
                "gpus": c.gpus,
                "nodes": c.nodes,
                "hours": c.wall_seconds / 3600,
                "interruptions": c.interruptions,
                "mtti_hours": c.mtti_hours,
                "ettr": c.ettr,
                "ettr_predicted": predicted_ettr(
                    nodes=max(1, c.nodes),
                    rate_per_node_second=per_second,
                    restart=c.restart_seconds or 0.0,
                    interval=interval,
                    save=c.save_seconds or 0.0,
                ),
                "lost_gpu_hours": c.lost_gpu_hours,
                "redone": (
                    f"estimated: half of {format_duration(settings.assumed_interval)} "
                    "per interruption (no checkpoint records)"
                    if c.redone_estimated
                    else "since the last save (checkpoint records)"
                ),
                "checkpoint_interval_minutes": (
                    c.checkpoint_interval_seconds / 60 if c.checkpoint_interval_seconds else None
                ),
                "save_seconds": c.save_seconds,
                "recommendation": advice.sentence() if advice is not None else "",
            }
        )
    frame = pd.DataFrame(rows)
    return ranked(frame, ["lost_gpu_hours"]) if not frame.empty else frame


def _pareto(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    frame = ranked(frame, [column])
    total = float(frame[column].sum())
    frame["cumulative_share"] = frame[column].cumsum() / total if total else 0.0
    return frame


def _causes(found: list[Interruption], costs: list[JobCost], node_seconds: float) -> pd.DataFrame:
    count: dict[str, int] = defaultdict(int)
    for i in found:
        count[i.cause] += 1
    lost: dict[str, float] = defaultdict(float)
    for c in costs:
        for cause, hours in c.lost_gpu_hours_by_cause.items():
            lost[cause] += hours
    rows = [
        {
            "cause": cause,
            "llama3_component": LLAMA3[cause][0],
            "llama3_category": LLAMA3[cause][1],
            "interruptions": n,
            "share": n / len(found),
            "per_1000_node_days": per_thousand_node_days(n, node_seconds),
            "lost_gpu_hours": lost[cause],
        }
        for cause, n in count.items()
    ]
    columns = ["cause", "llama3_component", "llama3_category", "interruptions", "share"]
    frame = pd.DataFrame(rows, columns=[*columns, "per_1000_node_days", "lost_gpu_hours"])
    return _pareto(frame, "lost_gpu_hours")


def _nodes(found: list[Interruption], costs: list[JobCost]) -> pd.DataFrame:
    gpus = {c.job: c.gpus for c in costs}
    lost: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for i in found:
        if not i.node:
            continue
        count[i.node] += 1
        if i.resumed is not None:
            lost[i.node] += (i.resumed - i.time) * gpus.get(i.job, 0) / 3600
    frame = pd.DataFrame(
        [(n, count[n], lost[n]) for n in count],
        columns=["node", "interruptions", "gpu_hours_held"],
    )
    return _pareto(frame, "gpu_hours_held")


def _lemons(
    found: list[Interruption],
    jobs: list[JobHistory],
    records: dict[str, NodeRecord],
    settings: GoodputSettings,
    present: dict[str, float],
) -> pd.DataFrame:
    scored = lemons(found, {j.job: len(j.nodes) for j in jobs}, records, settings.lemon, present)
    columns = ["node", "lemon", "score", "multi_node_interruptions", "single_node_interruptions"]
    columns += ["fleet_expects", "fleet_tail", "jobs", "xids", "taints", "hours_out", "evidence"]
    rows = [
        (
            s.node,
            s.lemon,
            s.score,
            s.multi_node,
            s.single_node,
            s.expected,
            s.tail,
            s.jobs,
            s.record.xids,
            s.record.taints,
            s.record.hours_out,
            "; ".join(s.reasons),
        )
        for s in scored
    ]
    return pd.DataFrame(rows, columns=columns)
