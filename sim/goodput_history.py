"""Long training runs with interruptions injected by cause, and the truth about them.

The Goodput section's tests (and its bench) backfill this history into a real Prometheus or
VictoriaMetrics and check that the report finds what was injected: every interruption, its
cause and node, each job's ETTR, and nothing for a checkpoint save, a planned stop or a
job's end.

Jobs of one or `nodes_per_job` nodes (`gpus_per_node` GPUs each) train for the whole
history; JobSet jobs (pods on Kubernetes, kube-state-metrics' series) and Slurm jobs
(`fleetwatch_slurm_job_info`, and `fleetwatch_slurm_job_restarts` with its restart count).
Each job saves a checkpoint every `checkpoint_minutes` of progress (its GPUs
idle while it saves, the checkpoint record at 1) and is interrupted by its nodes: each node
at the fleet's rate (`node_per_1000_node_days`, Llama 3's by default), a cause drawn from a
mix shaped like Llama 3's Table 5 (a sixth of it software that leaves no signal), except
the `lemons` injected lemon nodes, which interrupt their jobs far more often
(`lemon_per_1000_node_days`) and always with a signal of their own, and stay in service
(they pass every check). Before an interruption, its node's signal fires a few minutes
(an alert, an Xid counted, the node's exporter silent), then the job restarts as its kind
makes one: a JobSet restart (every pod
recreated with the next restart attempt, after a container restart of a pod), a container
restarted in place, torchrun restarting its workers in place (no scheduler event), or a
Slurm requeue (restart count + 1). Once resumed, the job redoes the work since its last
checkpoint. One JobSet is suspended and resumed (a planned stop), one job ends early.

What the rules would record is written as recorded: `fleetwatch:gpu_tensor_active:ratio`,
`fleetwatch:gpu_job:info`, `fleetwatch:job_checkpoint_burst:active`, `ALERTS`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Final

import numpy as np

from fleetwatch.catalog.gpu import GPUS_VISIBLE
from fleetwatch.catalog.slurm import SLURM_JOB_INFO, SLURM_JOB_RESTARTS
from fleetwatch.catalog.xid import GPU_XID_ERRORS_TOTAL
from fleetwatch.rules.definitions import (
    CHECKPOINT_JOB_BURST_RECORD,
    JOB_INFO,
    TENSOR_ACTIVE_RECORD,
)
from fleetwatch.sim.goodput_records import RecordedJob, job_records

KSM: Final = 'job="kube-state-metrics"'
EXPORTER: Final = 'job="fleetwatch"'
NAMESPACE: Final = "training"
UNATTRIBUTED: Final = "unattributed"

# Causes as the report names them (fleetwatch.report.goodput_model), with their weight in
# the mix: Llama 3's Table 5 counts (419 unexpected interruptions) grouped by the signal
# fleetwatch would see.
MIX: Final[dict[str, int]] = {
    "gpu_lost_from_bus": 60,
    "gpu_other": 68,
    "nvlink_fabric": 20,
    "gpu_memory": 81,
    "row_remap_failure": 10,
    "gpu_system_processor": 17,
    "infiniband": 42,
    "thermal": 6,
    "checkpoint_storage": 3,
    "node_lost": 11,
    "taken_out_by_fleetwatch": 32,
    UNATTRIBUTED: 69,
}
ALERT_OF: Final[dict[str, tuple[str, str, str]]] = {
    # cause: (alertname, xid, fleetwatch_taint)
    "gpu_lost_from_bus": ("GPUFallenOffBus", "", "gpu-lost"),
    "gpu_memory": ("GPUXidCritical", "48", "xid-critical"),
    "gpu_system_processor": ("GPUXidCritical", "119", "xid-critical"),
    "gpu_other": ("GPUXidCritical", "62", "xid-critical"),
    "row_remap_failure": ("GPURowRemapFailed", "", "row-remap-failed"),
    "nvlink_fabric": ("NVLinkDown", "", "nvlink-down"),
    "infiniband": ("InfiniBandLinkFlapping", "", ""),
    "thermal": ("GPUOverheating", "", "gpu-overheat"),
    "checkpoint_storage": ("CheckpointMountHung", "", "checkpoint-mount-hung"),
    "taken_out_by_fleetwatch": ("GoodputLemonNode", "", "lemon-node"),
}
XID_OF: Final = {
    "gpu_lost_from_bus": "79",
    "gpu_memory": "48",
    "gpu_system_processor": "119",
    "gpu_other": "62",
}


@dataclass(frozen=True, kw_only=True)
class GoodputSpec:
    """The simulated runs: `jobs` of `nodes_per_job` nodes (as many JobSet as Slurm jobs,
    the last JobSet single-node), `hours` of history at `step_seconds`; `end` is the last
    sample. The bad-input switches plant what the report must survive."""

    jobs: int = 6
    nodes_per_job: int = 3
    gpus_per_node: int = 8
    hours: float = 48.0
    step_seconds: int = 60
    end: int = 1_700_000_000
    seed: int = 11
    checkpoint_minutes: int = 30
    save_minutes: int = 2
    node_per_1000_node_days: float = 3.8
    """Interruptions each ordinary node causes (Llama 3: 419 in 54 days of 2,048 nodes)."""
    lemons: int = 2
    """Injected lemon nodes, spread evenly over the nodes."""
    lemon_per_1000_node_days: float = 500.0
    """Interruptions each lemon causes (one every two days by default)."""
    rename_job: bool = False
    """The first JobSet's pods carry a new job name from half-way (its label changed)."""
    nodeless_pod: bool = False
    """One pod of the second JobSet has no node in kube_pod_info."""
    slurm_without_restart_count: bool = False
    """The last Slurm job's mapping has no restart count."""
    records: bool = False
    """Also the live interruption rules' records (`fleetwatch.sim.goodput_records`), from
    `records_from_hours` into the history on (the rules loaded then)."""
    records_from_hours: float = 0.0
    gpu_series: bool = True
    """Each GPU's activity and job records; False: the store holds the job-level ones only."""

    @property
    def steps(self) -> int:
        return int(self.hours * 3600) // self.step_seconds

    @property
    def start(self) -> int:
        return self.end - (self.steps - 1) * self.step_seconds

    @property
    def timestamps(self) -> np.ndarray:
        return self.start + self.step_seconds * np.arange(self.steps, dtype=np.int64)


@dataclass(frozen=True, kw_only=True)
class TrueInterruption:
    """An injected interruption: the job, when it stopped progressing, how it restarted,
    its cause and the node behind it ("" when none)."""

    job: tuple[str, str]
    time: int
    kind: str
    cause: str
    node: str


@dataclass
class Truth:
    """What the history holds: every interruption, each job's ETTR (productive steps over
    wall-clock steps), the planned stop, the injected lemon nodes."""

    interruptions: list[TrueInterruption] = field(default_factory=list)
    ettr: dict[tuple[str, str], float] = field(default_factory=dict)
    planned_job: tuple[str, str] = ("", "")
    ended_job: tuple[str, str] = ("", "")
    lemons: tuple[str, ...] = ()
    renamed: tuple[tuple[str, str], tuple[str, str]] | None = None


def node_name(index: int) -> str:
    """`gpu-0007`."""
    return f"gpu-{index:04d}"


@dataclass
class Generation:
    """One generation of a job's pods (or one Slurm run): from `start` (the step its pods
    were created) to `end` (exclusive, when they were deleted), its restart `attempt`."""

    start: int
    end: int
    attempt: int


@dataclass
class Job:
    """One simulated job: per step its state (2 progressing, 1 holding its GPUs idle, 0
    not holding them), whether it saves, whether the step's work survives (productive),
    its container restart count; its generations."""

    key: tuple[str, str]
    slurm: bool
    nodes: list[int]
    state: np.ndarray
    saving: np.ndarray
    productive: np.ndarray
    container_restarts: np.ndarray
    generations: list[Generation] = field(default_factory=list)


Signal = tuple[str, str, int, int]
"""(cause, node, first step, last step) of an injected node signal."""


def _kind(rng: np.random.Generator, slurm: bool, cause: str) -> str:
    if slurm:
        return "slurm_restart"
    if cause == "node_lost":
        return "pods_recreated"
    roll = float(rng.random())
    if roll < 0.55:
        return "pods_recreated"
    if roll < 0.8:
        return "container_restarted"
    return "in_place"


def lemon_nodes(spec: GoodputSpec, nodes: int) -> frozenset[int]:
    """The injected lemons among `nodes` nodes: `spec.lemons` of them, evenly spread."""
    return frozenset(int((k + 0.5) * nodes / spec.lemons) for k in range(spec.lemons))


@dataclass(frozen=True)
class _Rates:
    """Interruptions per step each node of the history causes."""

    per_step: dict[int, float]
    lemons: frozenset[int]

    def of(self, nodes: list[int]) -> float:
        return sum(self.per_step[n] for n in nodes)

    def gap(self, rng: np.random.Generator, nodes: list[int]) -> float:
        """Steps to the job's next interruption (infinite when its nodes never fail)."""
        rate = self.of(nodes)
        return float(rng.exponential(1 / rate)) if rate > 0 else float("inf")

    def blamed(self, rng: np.random.Generator, nodes: list[int], p: np.ndarray) -> tuple[int, str]:
        """The node behind the job's interruption (by its rate) and the cause: a lemon's
        always leaves a signal; an ordinary node's is drawn from the whole mix."""
        weights = np.array([self.per_step[n] for n in nodes])
        node = int(nodes[int(rng.choice(len(nodes), p=weights / weights.sum()))])
        if node in self.lemons:
            p = np.where([cause != UNATTRIBUTED for cause in MIX], p, 0.0)
            p /= p.sum()
        return node, str(rng.choice(list(MIX), p=p))


def _rates(spec: GoodputSpec, nodes: int) -> _Rates:
    per_step = spec.step_seconds / 86_400 / 1000
    lemons = lemon_nodes(spec, nodes)
    return _Rates(
        per_step={
            n: (spec.lemon_per_1000_node_days if n in lemons else spec.node_per_1000_node_days)
            * per_step
            for n in range(nodes)
        },
        lemons=lemons,
    )


def _new_job(spec: GoodputSpec, index: int, nodes: list[int]) -> Job:
    slurm = index % 2 == 1
    n = spec.steps
    return Job(
        key=("slurm", str(1000 + index)) if slurm else (NAMESPACE, f"run-{index}"),
        slurm=slurm,
        nodes=nodes,
        state=np.full(n, 2, dtype=np.int8),
        saving=np.zeros(n, dtype=bool),
        productive=np.zeros(n, dtype=bool),
        container_restarts=np.zeros(n),
    )


def simulate(spec: GoodputSpec) -> tuple[list[Job], list[Signal], Truth]:
    """The jobs' timelines, the node signals and the truth."""
    rng = np.random.default_rng(spec.seed)
    n = spec.steps
    hour = 3600 // spec.step_seconds
    p = np.array(list(MIX.values()), dtype=float)
    p /= p.sum()
    jobs: list[Job] = []
    signals: list[Signal] = []
    last_jobset = max(i for i in range(spec.jobs) if i % 2 == 0)
    sizes = [
        1 if index == last_jobset and index > 0 else spec.nodes_per_job
        for index in range(spec.jobs)
    ]
    rates = _rates(spec, sum(sizes))
    truth = Truth(lemons=tuple(node_name(n) for n in sorted(rates.lemons)))
    first = 0
    for index, count in enumerate(sizes):
        job = _new_job(spec, index, list(range(first, first + count)))
        first += count
        jobs.append(job)
        ends = n - 5 * hour if index == 2 else n
        job.state[ends:] = 0
        planned = n // 2 if index == 0 else -1
        truth.planned_job = jobs[0].key
        if index == 2:
            truth.ended_job = job.key
        attempt, started, restarts = 0, 0, 0.0
        at = hour + rates.gap(rng, job.nodes)
        pending: list[int] = []
        since = 0
        i = 0
        while i < ends:
            if i == planned:
                # A planned stop: the JobSet suspended 40 minutes, resumed at the same attempt.
                job.generations.append(Generation(start=started, end=i, attempt=attempt))
                job.state[i : i + 43] = 0
                started, pending, since = i + 40, [], 0
                at = max(at, i + 43 + hour)
                i += 43
                continue
            if i >= at and i + 30 < ends:
                node, cause = rates.blamed(rng, job.nodes, p)
                kind = _kind(rng, job.slurm, cause)
                lead = int(rng.integers(1, 8))
                if cause != UNATTRIBUTED:
                    signals.append((cause, node_name(node), i - lead, i - lead + 5))
                when = spec.start + i * spec.step_seconds
                blamed = node_name(node) if cause != UNATTRIBUTED else ""
                truth.interruptions.append(
                    TrueInterruption(job=job.key, time=when, kind=kind, cause=cause, node=blamed)
                )
                down = int(rng.integers(6, 15))
                recreated = kind in ("pods_recreated", "slurm_restart")
                job.state[i : i + down] = 0 if recreated else 1
                if kind == "pods_recreated":
                    restarts += 1  # a container crashed, then the JobSet recreated every pod
                    job.container_restarts[i + 1 :] = restarts
                if recreated:
                    job.generations.append(Generation(start=started, end=i + 2, attempt=attempt))
                    attempt, started, restarts = attempt + 1, i + 2, 0.0
                    job.container_restarts[i + 2 :] = 0
                elif kind == "container_restarted":
                    restarts += 1
                    job.container_restarts[i + 1 :] = restarts
                job.productive[pending] = False
                pending, since = [], 0
                i += down
                at = i + max(hour, rates.gap(rng, job.nodes))
                continue
            if job.state[i] == 2 and since >= spec.checkpoint_minutes:
                stop = min(ends, i + spec.save_minutes)
                job.state[i:stop] = 1
                job.saving[i:stop] = True
                pending, since = [], 0
                i = stop
                continue
            if job.state[i] == 2:
                job.productive[i] = True
                pending.append(i)
                since += 1
            i += 1
        job.generations.append(Generation(start=started, end=ends, attempt=attempt))
        held = np.flatnonzero(job.state > 0)
        wall = int(held[-1] - held[0] + 1) if held.size else 0
        truth.ettr[job.key] = float(job.productive.sum()) / wall if wall else 0.0
    if spec.rename_job:
        truth.renamed = (jobs[0].key, (NAMESPACE, jobs[0].key[1] + "-v2"))
    return jobs, signals, truth


Series = tuple[str, str, str, np.ndarray]
"""(family, OpenMetrics type, label text, values per step; NaN: no sample)."""


def series(spec: GoodputSpec) -> tuple[list[Series], Truth]:
    """Every series of the history, and the truth."""
    rows, truth = streamed(spec)
    return list(rows), truth


def streamed(spec: GoodputSpec) -> tuple[Iterator[Series], Truth]:
    """The series one job at a time (a 54-day fleet's do not fit in memory at once), and
    the truth."""
    jobs, signals, truth = simulate(spec)
    return _rows(spec, jobs, signals, truth), truth


def _rows(
    spec: GoodputSpec, jobs: list[Job], signals: list[Signal], truth: Truth
) -> Iterator[Series]:
    rng = np.random.default_rng(spec.seed + 1)
    n = spec.steps
    lost: dict[str, np.ndarray] = {}
    for cause, node, first, _ in signals:
        if cause == "node_lost":
            gone = lost.setdefault(node, np.zeros(n, dtype=bool))
            gone[max(0, first) : first + 12] = True
    for index in range(sum(len(j.nodes) for j in jobs)):
        name = node_name(index)
        gone = lost.get(name, np.zeros(n, dtype=bool))
        present = np.where(gone, np.nan, float(spec.gpus_per_node))
        yield (GPUS_VISIBLE.name, "gauge", f'{EXPORTER},node="{name}"', present)
    for job in jobs:
        yield from _gpus(spec, job, rng, lost) if spec.gpu_series else []
        if spec.records:
            since = int(spec.records_from_hours * 3600) // spec.step_seconds
            yield from job_records(_recorded(spec, job, truth, lost), since=since)
        yield from _slurm(spec, job) if job.slurm else _pods(spec, job)
        burst = np.where(job.saving, 1.0, np.where(job.state > 0, 0.0, np.nan))
        labels = f'namespace="{job.key[0]}",training_job="{job.key[1]}"'
        yield (CHECKPOINT_JOB_BURST_RECORD, "gauge", labels, burst)
    yield from _signals(spec, signals)


def _recorded(
    spec: GoodputSpec, job: Job, truth: Truth, lost: dict[str, np.ndarray]
) -> RecordedJob:
    n = spec.steps
    return RecordedJob(
        namespace=job.key[0],
        name=job.key[1],
        renamed=_job_name(spec, job, n - 1),
        cut=n * 3 // 4 if _job_name(spec, job, n - 1) != job.key[1] else n,
        state=job.state,
        nodes={node_name(i): ~lost.get(node_name(i), np.zeros(n, dtype=bool)) for i in job.nodes},
        gpus_per_node=spec.gpus_per_node,
        restarts=[
            ((t.time - spec.start) // spec.step_seconds, t.kind)
            for t in truth.interruptions
            if t.job == job.key
        ],
    )


def _job_name(spec: GoodputSpec, job: Job, step: int) -> str:
    """The job's name at `step`: the renamed job's label changes three quarters in."""
    if spec.rename_job and job.key == (NAMESPACE, "run-0") and step >= spec.steps * 3 // 4:
        return job.key[1] + "-v2"
    return job.key[1]


def _pod(job: Job, generation: Generation, node: int) -> str:
    return f"{job.key[1]}-{generation.start}-{node}"


def _gpus(
    spec: GoodputSpec, job: Job, rng: np.random.Generator, lost: dict[str, np.ndarray]
) -> list[Series]:
    """Each GPU's tensor activity and which job's pod holds it (the rules' records)."""
    n = spec.steps
    out: list[Series] = []
    held = job.state > 0
    tensor = np.where(job.state == 2, 0.6, 0.002)
    cut = spec.steps * 3 // 4 if spec.rename_job and job.key == (NAMESPACE, "run-0") else n
    for node in job.nodes:
        name = node_name(node)
        here = held & ~lost.get(name, np.zeros(n, dtype=bool))
        for gpu in range(spec.gpus_per_node):
            gpu_labels = f'node="{name}",gpu="{gpu}",uuid="GPU-{node:06x}-{gpu:02x}"'
            noise = rng.normal(0, 0.01, n).clip(-0.002, 0.03)
            out.append(
                (TENSOR_ACTIVE_RECORD, "gauge", gpu_labels, np.where(here, tensor + noise, np.nan))
            )
            owners: dict[str, np.ndarray] = {}  # a Slurm job's runs are one series
            for generation in job.generations:
                pod = job.key[1] if job.slurm else _pod(job, generation, node)
                for first, last in ((0, cut), (cut, n)):
                    part = np.zeros(n, dtype=bool)
                    part[max(first, generation.start) : min(last, generation.end)] = True
                    if not part.any():
                        continue
                    training_job = _job_name(spec, job, first)
                    owner = f'namespace="{job.key[0]}",pod="{pod}",training_job="{training_job}"'
                    key = f"{gpu_labels},{owner}"
                    owners[key] = owners.get(key, np.zeros(n, dtype=bool)) | part
            out += [
                (JOB_INFO, "gauge", labels, np.where(mask & here, 1.0, np.nan))
                for labels, mask in owners.items()
            ]
    return out


def _pods(spec: GoodputSpec, job: Job) -> list[Series]:
    """kube-state-metrics' series of the JobSet's pods, generation by generation."""
    n = spec.steps
    out: list[Series] = []
    cut = spec.steps * 3 // 4 if spec.rename_job and job.key == (NAMESPACE, "run-0") else n
    for generation in job.generations:
        for node in job.nodes:
            pod = _pod(job, generation, node)
            uid = f"{pod}-uid"
            alive = np.zeros(n)
            alive[generation.start : generation.end] = 1.0
            alive[alive == 0] = np.nan
            ident = f'{KSM},namespace="{job.key[0]}",pod="{pod}",uid="{uid}"'
            created = spec.start + generation.start * spec.step_seconds - 30
            out.append(("kube_pod_created", "gauge", ident, alive * created))
            where = (
                ""
                if spec.nodeless_pod and job.key[1] == "run-2" and node == job.nodes[0]
                else node_name(node)
            )
            out.append(("kube_pod_info", "gauge", f'{ident},node="{where}"', alive))
            for first, last in ((0, cut), (cut, n)):
                part = alive.copy()
                part[:first] = np.nan
                part[last:] = np.nan
                if np.isnan(part).all():
                    continue
                labels = (
                    f'{ident},label_jobset_sigs_k8s_io_jobset_name="{_job_name(spec, job, first)}",'
                    f'label_jobset_sigs_k8s_io_restart_attempt="{generation.attempt}"'
                )
                out.append(("kube_pod_labels", "gauge", labels, part))
            restarts = job.container_restarts * alive
            out.append(
                (
                    "kube_pod_container_status_restarts",
                    "counter",
                    f'{ident},container="trainer"',
                    restarts,
                )
            )
    return out


def _slurm(spec: GoodputSpec, job: Job) -> list[Series]:
    """`fleetwatch_slurm_job_info` on each node of the Slurm job, run by run (the restart
    count grows at each requeue), while it holds its GPUs."""
    n = spec.steps
    out: list[Series] = []
    last = max(i for i in range(spec.jobs) if i % 2 == 1)
    without = spec.slurm_without_restart_count and job.key[1] == str(1000 + last)
    held = np.where(job.state > 0, 1.0, np.nan)
    count = np.full(n, np.nan)
    for generation in job.generations:
        count[generation.start : generation.end] = generation.attempt
    for node in job.nodes:
        labels = (
            f'{EXPORTER},node="{node_name(node)}",job_id="{job.key[1]}",user="ml",'
            f'partition="gpu",nodes="{len(job.nodes)}"'
        )
        out.append((SLURM_JOB_INFO.name, "gauge", labels, held))
        if not without:
            restarts = f'{EXPORTER},node="{node_name(node)}",job_id="{job.key[1]}"'
            out.append((SLURM_JOB_RESTARTS.name, "gauge", restarts, held * count))
    return out


def _signals(spec: GoodputSpec, signals: list[Signal]) -> list[Series]:
    """The alerts that fired and the Xids counted (a node's silence is in its series)."""
    n = spec.steps
    out: list[Series] = []
    xids: dict[tuple[str, str], np.ndarray] = {}
    for cause, node, first, last in signals:
        if cause in ALERT_OF:
            alertname, xid, taint = ALERT_OF[cause]
            firing = np.full(n, np.nan)
            firing[max(0, first) : last + 1] = 1.0
            labels = f'alertname="{alertname}",alertstate="firing",node="{node}"'
            labels += f',xid="{xid}"' if xid else ""
            labels += f',fleetwatch_taint="{taint}"' if taint else ""
            out.append(("ALERTS", "gauge", labels, firing))
        if cause in XID_OF:
            counter = xids.setdefault((node, XID_OF[cause]), np.full(n, np.nan))
            counter[max(0, first) :] = np.nan_to_num(counter[max(0, first) :]) + 1
    for (node, xid), counter in xids.items():
        labels = f'{EXPORTER},node="{node}",gpu="0",uuid="GPU-{node}-0",xid="{xid}"'
        out.append((GPU_XID_ERRORS_TOTAL.family_name, "counter", labels, counter))
    return out


def write_openmetrics(spec: GoodputSpec, path: Path) -> Truth:
    """The history as OpenMetrics (for `promtool tsdb create-blocks-from openmetrics`)."""
    rows, truth = series(spec)
    ts = [str(int(t)) for t in spec.timestamps]
    families: dict[str, list[Series]] = {}
    for row in rows:
        families.setdefault(row[0], []).append(row)
    with path.open("w") as out:
        for name, members in families.items():
            out.write(f"# TYPE {name} {members[0][1]}\n")
            sample = f"{name}_total" if members[0][1] == "counter" else name
            for _, _, labels, values in members:
                present = np.flatnonzero(~np.isnan(values))
                out.write(
                    "".join(f"{sample}{{{labels}}} {values[i]:.12g} {ts[i]}\n" for i in present)
                )
        out.write("# EOF\n")
    return truth


def _import_item(
    name: str, kind: str, labels: str, values: np.ndarray, ms: list[int]
) -> dict[str, object]:
    present = np.flatnonzero(~np.isnan(values))
    sample = f"{name}_total" if kind == "counter" else name
    return {
        "metric": {"__name__": sample, **dict(re.findall(r'(\w+)="([^"]*)"', labels))},
        "values": [float(values[i]) for i in present],
        "timestamps": [ms[i] for i in present],
    }


def victoria_lines(spec: GoodputSpec) -> tuple[list[dict[str, object]], Truth]:
    """The history as VictoriaMetrics `/api/v1/import` items (one per series)."""
    rows, truth = series(spec)
    ms = (spec.timestamps * 1000).tolist()
    return [_import_item(*row, ms) for row in rows], truth


def write_victoria_import(spec: GoodputSpec, out: BinaryIO) -> Truth:
    """The history as import JSON lines, written to `out` one series at a time."""
    rows, truth = streamed(spec)
    ms = (spec.timestamps * 1000).tolist()
    for row in rows:
        out.write((json.dumps(_import_item(*row, ms)) + "\n").encode())
    return truth
