"""Training-job rules: which GPUs form a job, per-job activity and clocks (recording
rules), and the alerts on them: the GPU a job waits for, GPUs it leaves idle, a job that
slowed down, and jobs without identity.

What a training job, a straggler, an idle GPU in a job and a slowdown are is defined in
`fleetwatch.rules.definitions` (the report evaluates the same definitions). Thresholds are
`thresholds.<name>` in rules/config.yaml, read here as `p("<name>")`; each alert's severity
and `for` are `alerts.<AlertName>` there; the job's pod label keys are `training_jobs:`.
"""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.allocation import GPU_ALLOCATION_INFO
from fleetwatch.catalog.gpu import GPU_CLOCK_EVENT_SECONDS_TOTAL, GPU_CLOCK_HERTZ
from fleetwatch.rules.config import Config, Params
from fleetwatch.rules.definitions import (
    JOB_INFO,
    JOB_LABELS,
    JOB_SM_CLOCK,
    JOB_SM_CLOCK_MEDIAN,
    JOB_TENSOR,
    JOB_TENSOR_MEDIAN,
    JOB_TENSOR_RECENT_MAX,
    TENSOR_ACTIVE_RECORD,
    fabric_errors_record,
    idle_in_job,
    job_recent_max,
    job_slowdown,
    kube_state_metrics_label,
    pod_training_job,
    straggler,
    straggler_clock_events,
)
from fleetwatch.rules.promql import GPU, VALUE2, Alert, Promql, Record, lookup, match, union

JOB_NAME: Final = "{{ $labels.namespace }}/{{ $labels.training_job }}"


def _per_job(series: str) -> str:
    """`series` {uuid, ...} with the job labels of its GPU (node from fleetwatch's scrape)."""
    return f"{series}\n* on (uuid) group_left (node, namespace, pod, training_job)\n{JOB_INFO}"


def records(config: Config, p: Params) -> list[Record]:
    """Each allocated GPU's training job, per-job tensor activity and SM clocks, and
    whether the job was training recently."""
    q = Promql(config)
    allocated = q.exporter(GPU_ALLOCATION_INFO.name)
    pods = pod_training_job(
        config, q.kube_state_metrics, fallback=f"max by (namespace, pod) ({allocated})"
    )
    sm_clock = q.exporter(GPU_CLOCK_HERTZ.name, 'clock="sm"')
    return [
        Record(
            record=JOB_INFO,
            expr=(
                f"max by (node, gpu, uuid, namespace, pod, training_job) (\n"
                f"{allocated}\n"
                "* on (namespace, pod) group_left (training_job)\n"
                f"{pods}\n)"
            ),
        ),
        Record(record=JOB_TENSOR, expr=_per_job(TENSOR_ACTIVE_RECORD)),
        Record(record=JOB_TENSOR_MEDIAN, expr=f"quantile by ({JOB_LABELS}) (0.5, {JOB_TENSOR})"),
        Record(
            record=JOB_TENSOR_RECENT_MAX,
            expr=job_recent_max(baseline=p("job_slowdown_baseline")),
        ),
        Record(record=JOB_SM_CLOCK, expr=_per_job(f"max by (node, gpu, uuid) ({sm_clock})")),
        Record(
            record=JOB_SM_CLOCK_MEDIAN, expr=f"quantile by ({JOB_LABELS}) (0.5, {JOB_SM_CLOCK})"
        ),
    ]


def alerts(config: Config, p: Params) -> list[Alert]:
    """Per training job (namespace/training_job, any number of nodes): the GPU the job
    waits for, GPUs it leaves idle, a job that slowed down, and jobs without identity."""
    q = Promql(config)
    clock_window = p("clock_event_window")
    slowed = straggler_clock_events(
        lambda metric, matcher: f"rate({q.exporter(metric, matcher)}[{clock_window}])",
        reasons=p("straggler_clock_reasons"),
    )
    allocated = q.exporter(GPU_ALLOCATION_INFO.name)
    labelled = union(
        [
            q.kube_state_metrics("kube_pod_labels", match(kube_state_metrics_label(k), "!=", ""))
            for k in config.job_label_keys
        ]
    )
    job_filter = "namespace=%q,training_job=%q"
    median_now = lookup(
        f"{JOB_TENSOR_MEDIAN}{{{job_filter}}}",
        "namespace",
        "training_job",
        then='{{ .Value | printf "%.2f" }}',
    )
    return [
        Alert(
            name="GPUStraggler",
            expr=straggler(
                alert="GPUStraggler",
                clock_fraction=p("straggler_clock_fraction"),
                clock_slowed=slowed,
                event_fraction=p("clock_event_fraction"),
                busy_ratio=p("job_busy_ratio"),
            ),
            summary=f"Training job {JOB_NAME} waits for a slow GPU on node {{{{ $labels.node }}}}",
            description=(
                f"{GPU} is the GPU training job {JOB_NAME} waits for: its tensor cores are "
                f"active {VALUE2} of the time, at or above the job's median of {median_now}, "
                "while its SM clock runs at "
                + lookup(f"{JOB_SM_CLOCK}{{uuid=%q}}", "uuid", then="{{ .Value | humanize }}Hz")
                + " (job median "
                + lookup(
                    f"{JOB_SM_CLOCK_MEDIAN}{{{job_filter}}}",
                    "namespace",
                    "training_job",
                    then="{{ .Value | humanize }}Hz",
                )
                + f"); clock events in the last {clock_window}: "
                + lookup(
                    f"rate({GPU_CLOCK_EVENT_SECONDS_TOTAL}{{uuid=%q}}[{clock_window}]) > 0",
                    "uuid",
                    then="{{ .Labels.reason }} {{ .Value | humanizePercentage }}",
                    otherwise="none",
                    sort="reason",
                )
                + "."
            ),
        ),
        Alert(
            name="GPUIdleInJob",
            expr=idle_in_job(
                fraction=p("idle_in_job_fraction"),
                idle_ratio=p("tensor_idle_ratio"),
                busy_ratio=p("job_busy_ratio"),
            ),
            summary=f"Idle GPU in training job {JOB_NAME} on node {{{{ $labels.node }}}}",
            description=(
                f"{GPU}, allocated to training job {JOB_NAME} (pod {{{{ $labels.pod }}}}), has "
                f"tensor cores active {VALUE2} of the time while the job's median is "
                f"{median_now}: it is idle, misassigned or starved of data."
            ),
        ),
        Alert(
            name="TrainingJobSlowdown",
            expr=job_slowdown(
                fraction=p("job_slowdown_fraction"),
                baseline=p("job_slowdown_baseline"),
                busy_ratio=p("job_busy_ratio"),
            ),
            summary=f"Training job {JOB_NAME} slowed down",
            description=(
                f"The median tensor activity of training job {JOB_NAME} fell to {VALUE2} "
                "from "
                + lookup(
                    f"avg_over_time({JOB_TENSOR_MEDIAN}{{{job_filter}}}"
                    f"[{p('job_slowdown_baseline')}])",
                    "namespace",
                    "training_job",
                    then='{{ .Value | printf "%.2f" }}',
                )
                + f" on average over the last {p('job_slowdown_baseline')}. Straggler: "
                + lookup(
                    f'ALERTS{{alertname="GPUStraggler",{job_filter}}}',
                    "namespace",
                    "training_job",
                    then="GPU {{ .Labels.gpu }} on node {{ .Labels.node }}",
                    otherwise="none flagged",
                )
                + ". Fabric errors on its nodes: "
                + lookup(
                    f"{fabric_errors_record(config)} > 0 and on (node) {JOB_INFO}{{{job_filter}}}",
                    "namespace",
                    "training_job",
                    then="{{ .Labels.fabric }} on node {{ .Labels.node }} "
                    '({{ .Value | printf "%.1f" }}/s)',
                    otherwise="none",
                )
                + "."
            ),
        ),
        Alert(
            name="TrainingJobLabelsMissing",
            expr=f"count({allocated}) > 0\nunless on ()\n(\n{labelled}\n)",
            summary="Training jobs fall back to pods: kube_pod_labels has no job label",
            description=(
                "{{ $value }} GPUs are allocated to pods, but no kube_pod_labels series "
                "carries any of "
                + ", ".join(kube_state_metrics_label(k) for k in config.job_label_keys)
                + ": each pod counts as a training job of its own. Add the pod label keys "
                "to kube-state-metrics' --metric-labels-allowlist."
            ),
        ),
    ]
