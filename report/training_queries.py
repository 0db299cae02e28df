"""The Activity and Training jobs sections' queries: what each GPU did, for which job.

Tensor activity per bucket (fleetwatch's GPM, else dcgm-exporter's) reads the recording
rule's series where the store holds them; a training job is what the rules call one (the
first configured pod label, else the pod name); a straggler's clock events are judged as
the rules judge them. Every definition comes from `fleetwatch.rules.definitions` with the
shipped rules config.
"""

from __future__ import annotations

from fleetwatch.catalog.allocation import GPU_ALLOCATION_INFO
from fleetwatch.catalog.gpu import (
    GPU_CLOCK_EVENT_SECONDS_TOTAL,
    GPU_CLOCK_HERTZ,
    GPU_TENSOR_ACTIVE_RATIO,
    GPU_UTILIZATION_RATIO,
)
from fleetwatch.report.query import GPU, POD_JOB, Query, Recorded, Window
from fleetwatch.report.thresholds import shipped_config, shipped_policy
from fleetwatch.report.windowed_promql import over_bucket, per_bucket, select
from fleetwatch.rules.definitions import (
    POD_LABELS_METRIC,
    TENSOR_ACTIVE_RECORD,
    pod_training_job,
    straggler_clock_events,
    tensor_active,
)

TENSOR = GPU_TENSOR_ACTIVE_RATIO.name
UTIL = GPU_UTILIZATION_RATIO.name
CLOCK = GPU_CLOCK_HERTZ.name
CLOCK_EVENTS = GPU_CLOCK_EVENT_SECONDS_TOTAL.name
POD_LABELS = POD_LABELS_METRIC
ALLOC = GPU_ALLOCATION_INFO.name


def _tensor(w: Window) -> str:
    """Tensor activity per bucket, fleetwatch's GPM else dcgm-exporter's: the rules'
    definition (`fleetwatch:gpu_tensor_active:ratio`) over bucket means."""
    mean = over_bucket(w, "avg_over_time")
    return tensor_active(shipped_config(), own=mean, dcgm=mean)


def _slowed(w: Window) -> str:
    """Share of each bucket a straggler clock-event reason (thermal, power brake) held, from
    its cumulative time (the rules judge clock events the same way)."""
    reasons = "|".join(shipped_policy().straggler_clock_reasons)
    # The seconds counted within the bucket, from its own samples: rate() extrapolates to the
    # bucket's edges in Prometheus and not in VictoriaMetrics, and a GPU near the threshold
    # would be a straggler on one engine only. A bucket in which the counter reset (the
    # exporter restarted) is left out rather than read as the counter's whole value.
    top, bottom = over_bucket(w, "max_over_time"), over_bucket(w, "min_over_time")
    resets = over_bucket(w, "resets")

    def held(metric: str, matcher: str) -> str:
        share = f"({top(metric, matcher)} - {bottom(metric, matcher)}) / {w.bucket:g}"
        return f"({share} unless {resets(metric, matcher)} > 0)"

    events = straggler_clock_events(held, reasons=reasons)
    return f"max by ({','.join(GPU)}) ({events})"


def _pod_jobs(w: Window) -> str:
    """Each pod's training job as the rules define it: the first configured kube_pod_labels
    label present, else the pod name (of every pod kube-state-metrics lists)."""
    config = shipped_config()
    pods = over_bucket(w, "max_over_time", scoped=False, extra=config.kube_state_metrics_selector)
    return pod_training_job(config, pods, fallback=pods(POD_LABELS, ""))


TRAINING: tuple[Query, ...] = (
    Query(
        name="tensor_active",
        shape="bucketed",
        keys=GPU,
        required=(),
        build=_tensor,
        any_of=lambda: (TENSOR, shipped_config().dcgm_tensor_active_metric),
        # The rule's series, fleetwatch's GPM else dcgm-exporter's, already {node, gpu, uuid}.
        recorded=Recorded(
            record=TENSOR_ACTIVE_RECORD,
            build=per_bucket("avg_over_time", lambda w: select(w, TENSOR_ACTIVE_RECORD), GPU),
        ),
    ),
    Query(
        name="sm_clock",
        shape="bucketed",
        keys=GPU,
        required=(CLOCK,),
        build=per_bucket("avg_over_time", lambda w: select(w, CLOCK, 'clock="sm"'), GPU),
    ),
    Query(
        name="clock_slowed",
        shape="bucketed",
        keys=GPU,
        required=(CLOCK_EVENTS,),
        build=_slowed,
    ),
    Query(
        name="pod_jobs",
        shape="bucketed",
        keys=POD_JOB,
        required=(POD_LABELS,),
        build=_pod_jobs,
        scoped=False,
        batched=False,
    ),
    Query(
        name="gpu_utilization",
        shape="bucketed",
        keys=GPU,
        required=(UTIL,),
        build=per_bucket("avg_over_time", lambda w: select(w, UTIL), GPU),
    ),
    Query(
        name="allocation",
        shape="bucketed",
        keys=(*GPU, "namespace", "pod"),
        required=(ALLOC,),
        build=per_bucket("max_over_time", lambda w: select(w, ALLOC), (*GPU, "namespace", "pod")),
    ),
)
