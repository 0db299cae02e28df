"""The Goodput section's queries: job-level records and sparse events, never every GPU's
raw series over the window.

What crosses the network grows with the jobs, their restarts and the node signals, not
with the window's length:

- one row per pod incarnation (kube-state-metrics' `kube_pod_created`, `kube_pod_info`,
  the job and the JobSet restart attempt from `kube_pod_labels`), per Slurm restart count
  (`fleetwatch_slurm_job_restarts`, the first time each was seen);
- only the steps at which something changed: a job's activity starting or stopping (every
  GPU of the job idle, or the job gone; from the rules' `fleetwatch:gpu_job:info` and
  `fleetwatch:gpu_tensor_active:ratio`), a container restarted, an Xid counted, a node's
  exporter falling silent or coming back, an alert starting or ending to fire, a checkpoint
  save starting or ending.

Where the rules' job-level records cover the window (`fleetwatch.rules.interruptions`:
each job's busiest GPU, its GPUs, its GPUs per node), the job's activity, GPUs and nodes
read them, one series a job (or a job's node), instead of joining every GPU's activity to
its job; else the per-GPU series (`Query.recorded`, whose coverage check compares the jobs
each form holds at the window's start and end). The interruption records themselves (one
run of samples per interruption, per job and per node) are read wherever they have samples,
beside the scheduler's series.

A transition is read as `now unless before` at `--step`: each side looks back one step
only (`max_over_time(…[step])`), so a series that stopped is gone at the next step on
Prometheus and VictoriaMetrics alike, live or backfilled. Every query compares across the
fleet (a job spans nodes) or carries few series, so none is batched except the Xid counts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final

from fleetwatch.catalog.gpu import GPUS_VISIBLE
from fleetwatch.catalog.slurm import SLURM_JOB_INFO, SLURM_JOB_RESTARTS
from fleetwatch.catalog.xid import GPU_XID_ERRORS_TOTAL
from fleetwatch.report.query import GPU, JOB, Query, Recorded, Window
from fleetwatch.report.thresholds import shipped_config, shipped_policy
from fleetwatch.report.windowed_promql import duration, select
from fleetwatch.rules.definitions import (
    CHECKPOINT_JOB_BURST_BYTES_RECORD,
    CHECKPOINT_JOB_BURST_RECORD,
    JOB_INFO,
    POD_LABELS_METRIC,
    TENSOR_ACTIVE_RECORD,
    kube_state_metrics_label,
    pod_training_job,
)
from fleetwatch.rules.interruptions import (
    JOB_GPUS_RECORD,
    JOB_INTERRUPTION_RECORD,
    JOB_NODE_GPUS_RECORD,
    JOB_TENSOR_MAX_RECORD,
    JOBSET_RESTART_ATTEMPT_LABEL,
    KIND_LABEL,
    NODE_INTERRUPTION_RECORD,
)

fleet_query: Final = functools.partial(Query, scoped=False, batched=False)
"""A query over the whole fleet at once: not scoped to `--nodes`, not batched by node
(job- and pod-level series, which the section joins to nodes itself)."""


POD_CREATED: Final = "kube_pod_created"
POD_INFO: Final = "kube_pod_info"
CONTAINER_RESTARTS: Final = "kube_pod_container_status_restarts_total"
NO_RESTART_COUNT: Final = -1.0
"""The value of a Slurm job's row in `goodput_slurm_restarts` when it has no restart count."""
SLURM_INFO: Final = SLURM_JOB_INFO.name
SLURM_RESTARTS: Final = SLURM_JOB_RESTARTS.name
XIDS: Final = GPU_XID_ERRORS_TOTAL.name
NODE_PRESENT: Final = GPUS_VISIBLE.name
POD = ("namespace", "pod")
STARTED, STOPPED = 1.0, -1.0
"""The value of a transition: a span starting, or ending (at the step before)."""


def _ksm(w: Window, metric: str, matchers: str = "") -> str:
    extra = ",".join(m for m in (shipped_config().kube_state_metrics_selector, matchers) if m)
    return select(w, metric, extra, scoped=False)


def _over_window(w: Window, fn: str, selector: str) -> str:
    return f"{fn}({selector}[{duration(w.seconds)}])"


def _highest(by: str, metric: str) -> Callable[[Window], str]:
    """`metric`'s highest value over the window, per `by`."""
    return lambda w: (
        f"max by ({by}) ({_over_window(w, 'max_over_time', select(w, metric, scoped=False))})"
    )


def transitions(now: Callable[[str], str], by: tuple[str, ...]) -> Callable[[Window], str]:
    """Where the set `now(offset)` yields changed at each step: `STARTED` where a series is
    there now and was not one step before, `STOPPED` where it was and is not. `now` takes
    the PromQL offset modifier to add to its selectors (`""` or ` offset 60s`)."""

    def build(w: Window) -> str:
        ago = f" offset {duration(w.step)}"
        on = f"on ({','.join(by)})"
        started = f"(({now('')}) * 0 + 1 unless {on} ({now(ago)}))"
        stopped = f"(({now(ago)}) * 0 - 1 unless {on} ({now('')}))"
        return f"{started} or {stopped}"

    return build


def _job_active(w: Window) -> Callable[[str], str]:
    """Per job: present while some GPU of it is busy (tensor activity at or above the
    rules' `tensor_idle_ratio`): every GPU idle at once, or the job gone, is not."""
    idle = shipped_policy().tensor_idle_ratio
    step = duration(w.step)

    def now(offset: str) -> str:
        tensor = f"max by (node,gpu,uuid) (max_over_time({TENSOR_ACTIVE_RECORD}[{step}]{offset}))"
        owner = (
            f"max by (node,gpu,uuid,namespace,training_job) "
            f"(max_over_time({JOB_INFO}[{step}]{offset}))"
        )
        joined = f"{tensor} * on (node,gpu,uuid) group_right {owner}"
        return f"max by (namespace,training_job) ({joined}) >= {idle:g}"

    return now


def _job_activity(w: Window) -> str:
    return transitions(_job_active(w), JOB)(w)


def _job_activity_recorded(w: Window) -> str:
    """The same activity from the rules' per-job record of the busiest GPU's tensor
    activity (`JOB_TENSOR_MAX_RECORD`): one series a job instead of every GPU's two."""
    idle = shipped_policy().tensor_idle_ratio
    record = select(w, JOB_TENSOR_MAX_RECORD, scoped=False)

    def now(offset: str) -> str:
        busiest = f"max_over_time({record}[{duration(w.step)}]{offset})"
        return f"max by (namespace,training_job) ({busiest}) >= {idle:g}"

    return transitions(now, JOB)(w)


def _jobs_now(by: str, record: str) -> Callable[[Window], tuple[str, str]]:
    """`Recorded.covers` of the job-level records: the jobs (`by`) that `record` and the
    raw per-GPU job series (`fleetwatch:gpu_job:info`) each hold over the window's last
    `bucket`."""

    def covers(w: Window) -> tuple[str, str]:
        recent = duration(w.bucket)
        recorded = f"max by ({by}) (last_over_time({select(w, record, scoped=False)}[{recent}]))"
        raw = f"max by ({by}) (last_over_time({select(w, JOB_INFO, scoped=False)}[{recent}]))"
        return recorded, raw

    return covers


def _recorded_runs(record: str, by: tuple[str, ...]) -> Callable[[Window], str]:
    """Where a sparse interruption record's runs start (`STARTED`), by `by`: one row per
    interruption seen, nothing between them."""

    def build(w: Window) -> str:
        def now(offset: str) -> str:
            picked = select(w, record, scoped=False)
            return f"max by ({','.join(by)}) (max_over_time({picked}[{duration(w.step)}]{offset}))"

        on = f"on ({','.join(by)})"
        return f"({now('')}) * 0 + {STARTED:g} unless {on} ({now(f' offset {duration(w.step)}')})"

    return build


INTERRUPTION_KEYS: Final = (*JOB, KIND_LABEL)
NODE_INTERRUPTION_KEYS: Final = ("node", *JOB, KIND_LABEL)


def _present(metric: str, by: tuple[str, ...], matchers: str = "") -> Callable[[Window], str]:
    """Transitions of `metric`'s series (by `by`) on the selected nodes, each side looking
    back one step."""

    def build(w: Window) -> str:
        def now(offset: str) -> str:
            picked = select(w, metric, matchers)
            return f"max by ({','.join(by)}) (max_over_time({picked}[{duration(w.step)}]{offset}))"

        return transitions(now, by)(w)

    return build


def _saving(w: Window) -> str:
    """Transitions of each job's checkpoint saves (the burst record at 1)."""

    def now(offset: str) -> str:
        burst = select(w, CHECKPOINT_JOB_BURST_RECORD, scoped=False)
        saving = f"max_over_time({burst}[{duration(w.step)}]{offset})"
        return f"max by (namespace,training_job) ({saving}) == 1"

    return transitions(now, JOB)(w)


def _pod_jobs(w: Window) -> str:
    """Each pod's training job as the rules define it, valued with when its labels were
    last seen: a pod whose job label changed mid-run has a row per job, the latest last."""
    config = shipped_config()

    def seen(metric: str, matcher: str) -> str:
        picked = _ksm(w, metric, matcher)
        return f"last_over_time(timestamp({picked})[{duration(w.seconds)}:{duration(w.bucket)}])"

    return pod_training_job(config, seen, fallback=seen(POD_LABELS_METRIC, ""))


def _attempts(w: Window) -> str:
    label = kube_state_metrics_label(JOBSET_RESTART_ATTEMPT_LABEL)
    pods = _over_window(w, "last_over_time", _ksm(w, POD_LABELS_METRIC, f'{label}!=""'))
    named = f'label_replace({pods}, "attempt", "$1", "{label}", "(.*)")'
    return f"max by (namespace,pod,attempt) ({named})"


def _container_restarts(w: Window) -> str:
    """Restarts counted at each step, per pod: only the steps where the count grew."""
    now = f"max by (namespace,pod,uid) ({_ksm(w, CONTAINER_RESTARTS)})"
    ago = f"max by (namespace,pod,uid) ({_ksm(w, CONTAINER_RESTARTS)} offset {duration(w.step)})"
    return f"({now} - {ago}) > 0"


def _slurm_restarts(w: Window) -> str:
    """Each Slurm job's restart count (its `SLURM_RESTART_COUNT`,
    `fleetwatch_slurm_job_restarts`) per node, at the steps where it changed: where the job
    appeared on the node (first, or again after a requeue) and where the count rose while it
    stayed. A job listed by `fleetwatch_slurm_job_info` without a restart count (an exporter
    before it) appears with `NO_RESTART_COUNT`."""
    step = duration(w.step)
    by = "max by (job_id,node)"

    def count(offset: str) -> str:
        return f"{by} (max_over_time({select(w, SLURM_RESTARTS, scoped=False)}[{step}]{offset}))"

    def listed(offset: str) -> str:
        return f"{by} (max_over_time({select(w, SLURM_INFO, scoped=False)}[{step}]{offset}))"

    on = "on (job_id,node)"
    appeared = f"({count('')} unless {on} {count(f' offset {step}')})"
    rose = f"({count('')} > {on} {count(f' offset {step}')})"
    uncounted = (
        f"({listed('')} * 0 + {NO_RESTART_COUNT:g} unless {on} {listed(f' offset {step}')} "
        f"unless {on} {count('')})"
    )
    return f"{appeared} or {rose} or {uncounted}"


def _xid_events(w: Window) -> str:
    """Xids counted at each step per GPU and code, a series' birth included."""
    now = select(w, XIDS)
    ago = f"{now} offset {duration(w.step)}"
    by = "node,gpu,uuid,xid"
    return f"max by ({by}) (({now} - {ago}) > 0 or ({now} unless {ago}))"


GOODPUT: tuple[Query, ...] = (
    fleet_query(
        name="goodput_job_activity",
        shape="timeline",
        keys=JOB,
        required=(JOB_INFO, TENSOR_ACTIVE_RECORD),
        build=_job_activity,
        recorded=Recorded(
            record=JOB_TENSOR_MAX_RECORD,
            build=_job_activity_recorded,
            covers=_jobs_now("namespace,training_job", JOB_TENSOR_MAX_RECORD),
        ),
    ),
    fleet_query(
        name="goodput_job_gpus",
        shape="summary",
        keys=JOB,
        required=(JOB_INFO,),
        build=lambda w: (
            f"max_over_time(count by (namespace,training_job) ({select(w, JOB_INFO, scoped=False)})"
            f"[{duration(w.seconds)}:{duration(w.bucket)}])"
        ),
        recorded=Recorded(
            record=JOB_GPUS_RECORD,
            build=_highest("namespace,training_job", JOB_GPUS_RECORD),
            covers=_jobs_now("namespace,training_job", JOB_GPUS_RECORD),
        ),
    ),
    fleet_query(
        name="goodput_job_nodes",
        shape="summary",
        keys=(*JOB, "node"),
        required=(JOB_INFO,),
        build=_highest("namespace,training_job,node", JOB_INFO),
        recorded=Recorded(
            record=JOB_NODE_GPUS_RECORD,
            build=_highest("namespace,training_job,node", JOB_NODE_GPUS_RECORD),
            covers=_jobs_now("namespace,training_job,node", JOB_NODE_GPUS_RECORD),
        ),
    ),
    fleet_query(
        name="goodput_interruption_records",
        shape="timeline",
        keys=INTERRUPTION_KEYS,
        required=(),
        optional=(JOB_INTERRUPTION_RECORD,),
        build=_recorded_runs(JOB_INTERRUPTION_RECORD, INTERRUPTION_KEYS),
    ),
    fleet_query(
        name="goodput_node_interruption_records",
        shape="timeline",
        keys=NODE_INTERRUPTION_KEYS,
        required=(),
        optional=(NODE_INTERRUPTION_RECORD,),
        build=_recorded_runs(NODE_INTERRUPTION_RECORD, NODE_INTERRUPTION_KEYS),
    ),
    fleet_query(
        name="goodput_pod_created",
        shape="summary",
        keys=(*POD, "uid"),
        required=(POD_CREATED,),
        build=lambda w: (
            "max by (namespace,pod,uid) "
            f"({_over_window(w, 'last_over_time', _ksm(w, POD_CREATED))})"
        ),
    ),
    fleet_query(
        name="goodput_pod_nodes",
        shape="summary",
        keys=(*POD, "uid", "node"),
        required=(POD_INFO,),
        build=lambda w: (
            "max by (namespace,pod,uid,node) "
            f"({_over_window(w, 'last_over_time', _ksm(w, POD_INFO))})"
        ),
    ),
    fleet_query(
        name="goodput_pod_jobs",
        shape="summary",
        keys=(*POD, "training_job"),
        required=(POD_LABELS_METRIC,),
        build=_pod_jobs,
    ),
    fleet_query(
        name="goodput_pod_attempts",
        shape="summary",
        keys=(*POD, "attempt"),
        required=(POD_LABELS_METRIC,),
        build=_attempts,
    ),
    fleet_query(
        name="goodput_container_restarts",
        shape="timeline",
        keys=(*POD, "uid"),
        required=(),
        optional=(CONTAINER_RESTARTS,),
        build=_container_restarts,
    ),
    fleet_query(
        name="goodput_slurm_restarts",
        shape="timeline",
        keys=("job_id", "node"),
        required=(),
        optional=(SLURM_INFO, SLURM_RESTARTS),
        build=_slurm_restarts,
    ),
    fleet_query(
        name="goodput_saves",
        shape="timeline",
        keys=JOB,
        required=(),
        optional=(CHECKPOINT_JOB_BURST_RECORD,),
        build=_saving,
    ),
    fleet_query(
        name="goodput_checkpoint_bytes",
        shape="summary",
        keys=JOB,
        required=(),
        optional=(CHECKPOINT_JOB_BURST_BYTES_RECORD,),
        build=_highest("namespace,training_job", CHECKPOINT_JOB_BURST_BYTES_RECORD),
    ),
    fleet_query(
        name="goodput_alerts",
        shape="timeline",
        keys=("alertname", "node", "xid", "fleetwatch_taint"),
        required=(),
        optional=("ALERTS",),
        build=_present(
            "ALERTS", ("alertname", "node", "xid", "fleetwatch_taint"), 'alertstate="firing"'
        ),
    ),
    Query(
        name="goodput_xids",
        shape="timeline",
        keys=(*GPU, "xid"),
        required=(),
        optional=(XIDS,),
        build=_xid_events,
    ),
    fleet_query(
        name="goodput_nodes_present",
        shape="timeline",
        keys=("node",),
        required=(NODE_PRESENT,),
        build=_present(NODE_PRESENT, ("node",)),
    ),
)
"""The Goodput section's queries, in the order the section reads them."""
