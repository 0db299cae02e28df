"""Training-job definitions shared by the rules, the dashboards and the report.

A GPU's training job, its tensor activity (fleetwatch's GPM, else dcgm-exporter's), and
what a straggler, an idle GPU in a job and a job slowdown are: each is written here once.
The rule generator renders them over the recording rules; the report renders the same
builders over its bucketed history (it has no recording rules) and evaluates the same
conditions element-wise on its frames, so the report and the alerts cannot drift apart.

The thresholds come from rules/config.yaml (`thresholds.*`). The PromQL builders take them
as rendered text (the Helm chart substitutes `{{ .Values... }}`); the element-wise
predicates take numbers from an object with the same names (`JobThresholds`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from fleetwatch.catalog.gpu import (
    GPU_CLOCK_EVENT_SECONDS_TOTAL,
    GPU_INFO,
    GPU_TEMPERATURE_CELSIUS,
    GPU_TEMPERATURE_MARGIN_CELSIUS,
    GPU_TENSOR_ACTIVE_RATIO,
)
from fleetwatch.rules.config import Config, ListedPolicies, ModelPolicy, PolicyList
from fleetwatch.rules.promql import match

Selector = Callable[[str, str], str]
"""(metric, one label matcher) -> PromQL reading that metric; it may wrap the selector (for
example in avg_over_time) and add matchers of its own (the scrape job, a node scope)."""

POD_LABELS_METRIC: Final = "kube_pod_labels"

# Recording rules (`level:metric:operation`), the names dashboards and alerts read.
TENSOR_ACTIVE_RECORD: Final = "fleetwatch:gpu_tensor_active:ratio"
"""Tensor activity per GPU {node, gpu, uuid}: fleetwatch's GPM, else dcgm-exporter's."""
JOB_INFO: Final = "fleetwatch:gpu_job:info"
"""One series per allocated GPU: {node, gpu, uuid, namespace, pod, training_job}."""
JOB_TENSOR: Final = "fleetwatch:gpu_job_tensor_active:ratio"
JOB_TENSOR_MEDIAN: Final = "namespace_training_job:fleetwatch_gpu_tensor_active:median"
JOB_TENSOR_RECENT_MAX: Final = (
    "namespace_training_job:fleetwatch_gpu_tensor_active:median_max_over_time"
)
"""The job median's highest value within `job_slowdown_baseline`: whether the job was
training recently, which a straggler (that lowers the median now) cannot hide."""
JOB_SM_CLOCK: Final = "fleetwatch:gpu_job_sm_clock:hertz"
JOB_SM_CLOCK_MEDIAN: Final = "namespace_training_job:fleetwatch_gpu_sm_clock:median"
JOB_LABELS: Final = "namespace, training_job"

# NVLink domains (NVL72): a domain is a fabric cluster UUID and clique ID.
DOMAIN_LABELS: Final = "cluster_uuid, clique_id"
DOMAIN_GPU_INFO: Final = "fleetwatch:gpu_nvlink_domain:info"
"""One series per GPU on an NVLink fabric: {node, gpu, uuid, cluster_uuid, clique_id}."""
DOMAIN_GPUS: Final = "fleetwatch:nvlink_domain_gpus:count"
DOMAIN_NODES: Final = "fleetwatch:nvlink_domain_nodes:count"
DOMAIN_DEGRADED: Final = "fleetwatch:nvlink_domain_gpus_degraded:count"
"""GPUs of the domain whose fabric reports degraded (0 when none)."""
DOMAIN_UNREGISTERED: Final = "fleetwatch:nvlink_domain_gpus_unregistered:count"
"""GPUs of the domain whose fabric registration has not completed (0 when none)."""
DOMAIN_JOB_GPUS: Final = "fleetwatch:nvlink_domain_job_gpus:count"
"""GPUs each training job holds in each domain: {cluster_uuid, clique_id, namespace,
training_job}; a job with GPUs in a domain spans it."""

# Checkpoint storage (rules/alerts/storage.py): written bytes per second to the watched
# mounts (`storage` collector) over `intervals.rate_window`, per node and per training job
# (a job's nodes are the nodes holding its GPUs), and whether the job is saving now.
CHECKPOINT_NODE_WRITE_RATE_RECORD: Final = "fleetwatch:node_checkpoint_write_bytes:rate1m"
"""Bytes per second a node writes to its watched mounts {node}."""
CHECKPOINT_JOB_NODE_WRITE_RATE_RECORD: Final = "fleetwatch:job_node_checkpoint_write_bytes:rate1m"
"""`CHECKPOINT_NODE_WRITE_RATE_RECORD` of each node of a training job
{node, namespace, training_job}."""
CHECKPOINT_JOB_WRITE_RATE_RECORD: Final = "fleetwatch:job_checkpoint_write_bytes:rate1m"
"""Bytes per second a training job writes to its checkpoint mounts, summed over its nodes
{namespace, training_job}."""
CHECKPOINT_JOB_PEAK_RECORD: Final = "fleetwatch:job_checkpoint_write_bytes:peak"
"""The job's highest write rate within `checkpoint.peak_window`."""
CHECKPOINT_JOB_BURST_RECORD: Final = "fleetwatch:job_checkpoint_burst:active"
"""1 while the job is saving a checkpoint (a burst), else 0 {namespace, training_job}."""
CHECKPOINT_JOB_BURST_START_RECORD: Final = "fleetwatch:job_checkpoint_burst:start_timestamp_seconds"
"""When the job's current burst started (Unix seconds); present only during a burst."""
CHECKPOINT_JOB_BURST_DURATION_RECORD: Final = "fleetwatch:job_checkpoint_burst:duration_seconds"
"""How long the job's current burst has lasted; present only during a burst."""
CHECKPOINT_JOB_BURST_BYTES_RECORD: Final = "fleetwatch:job_checkpoint_burst:bytes"
"""Bytes the job wrote in its current burst so far; present only during a burst."""
CHECKPOINT_READ_ONLY_REMOUNT_RECORD: Final = "fleetwatch:storage_read_only_remount:bool"
"""1 for a watched mount that is read-only now and was writable within `presence_history`
(a remount after errors), 0 for the node's other mounts {node, mountpoint, ...}."""
CHECKPOINT_NODE_LAG_RECORD: Final = "fleetwatch:job_node_checkpoint_write:lag_ratio"
"""During a burst, how far each node of the job writes below the job's median node:
1 - node rate / median node rate {node, namespace, training_job} (0 at or above it)."""


def fabric_errors_record(config: Config) -> str:
    """Errors per second on each node's NVLinks and InfiniBand ports, by `fabric`."""
    return f"node_fabric:fleetwatch_errors:rate{config.rate_window}"


def kube_state_metrics_label(key: str) -> str:
    """The label kube-state-metrics gives pod label `key` on kube_pod_labels.

    `jobset.sigs.k8s.io/jobset-name` -> `label_jobset_sigs_k8s_io_jobset_name`.
    """
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def pod_training_job(config: Config, pod_labels: Selector, *, fallback: str) -> str:
    """{namespace, pod, training_job} per pod: the first configured pod label that
    kube-state-metrics exports, else the pod's own name.

    `pod_labels` reads kube_pod_labels; `fallback` lists the pods ({namespace, pod}) that
    are jobs of their own when they carry none of the labels.
    """
    steps = []
    for key in config.job_label_keys:
        label = kube_state_metrics_label(key)
        pods = pod_labels(POD_LABELS_METRIC, match(label, "!=", ""))
        steps.append(f'label_replace({pods}, "training_job", "$1", "{label}", "(.+)")')
    steps.append(f'label_replace({fallback}, "training_job", "$1", "pod", "(.+)")')
    chain = "\n  or on (namespace, pod)\n  ".join(steps)
    return f"max by (namespace, pod, training_job) (\n  {chain}\n)"


def job_of_pod(
    labels: Mapping[str, str], pod: str, job_label_keys: Sequence[str]
) -> tuple[str | None, str]:
    """`pod_training_job` for one pod, element-wise (the tainter's eviction reads it): the
    first of `job_label_keys` the pod carries non-empty and its value, else (None, the pod
    name)."""
    for key in job_label_keys:
        if labels.get(key):
            return key, labels[key]
    return None, pod


def tensor_active(config: Config, *, own: Selector, dcgm: Selector) -> str:
    """Tensor activity per {node, gpu, uuid}: fleetwatch's GPM ratio where it exists, else
    dcgm-exporter's (A100/L40S fleets), its `UUID` becoming `uuid` and its `Hostname`
    becoming `node` where Prometheus added no `node` label."""
    metric = config.dcgm_tensor_active_metric
    without_node = (
        f'label_replace({dcgm(metric, match("node", "=", ""))}, "node", "$1", "Hostname", "(.+)")'
    )
    any_pipe = own(GPU_TENSOR_ACTIVE_RATIO.name, match("pipe", "=", "any"))
    return (
        f"max by (node, gpu, uuid) ({any_pipe})\n"
        "or on (uuid)\n"
        "max by (node, gpu, uuid) (\n"
        f'  label_replace({without_node}, "uuid", "$1", "UUID", "(.+)")\n'
        "  or\n"
        f'  label_replace({dcgm(metric, match("node", "!=", ""))}, "uuid", "$1", "UUID", "(.+)")\n'
        ")"
    )


Reading = Callable[[str, str, str], str]
"""(metric, one label matcher or "", its worst: "max" or "min") -> PromQL reading that
metric, as `Selector`, told which way the series gets worse (for a worst-over-window)."""


def policy_list(policies: Sequence[ModelPolicy] | PolicyList) -> PolicyList:
    """Per-model policies as a `PolicyList` (a config's entries are listed as they are)."""
    return ListedPolicies(tuple(policies)) if isinstance(policies, Sequence) else policies


def overheat_headroom(
    read: Reading,
    info: Selector,
    policies: Sequence[ModelPolicy] | PolicyList,
    *,
    default_celsius: str,
) -> str:
    """Per GPU {node, gpu, uuid}, °C left before its model's overheat policy (negative:
    past it): `default_celsius` (`thresholds.gpu_temperature_celsius`) minus the temperature
    for a model with no policy, the policy's temperature minus it, or the margin to the
    slowdown limit minus the policy's margin. The model is fleetwatch_gpu_info's `name`
    (`info`), joined on (node, uuid).

    The one comparison with the per-model policy: the rules (GPUOverheating, its clear
    condition, GPUOverheatingSoon, the over-threshold counts) and the report's time past
    the policy read it; `read` says how each series is read (now, its worst over a window,
    its trend, a batch's nodes). The parts are joined as `promql.union` joins them."""
    listed = policy_list(policies)
    temp = read(GPU_TEMPERATURE_CELSIUS.name, 'sensor="gpu"', "max")
    margin = read(GPU_TEMPERATURE_MARGIN_CELSIUS.name, "", "min")
    unlisted = listed.if_any(
        f"\nunless on (node, uuid)\n{info(GPU_INFO.name, match('name', '=~', listed.models()))}"
    )

    def part(value: str, model: str) -> str:
        return (
            f"\n  or\n({value}\nand on (node, uuid)\n"
            f"{info(GPU_INFO.name, match('name', '=', model))})"
        )

    return f"({default_celsius} - {temp}{unlisted})" + listed.each(
        margin=lambda model, value: part(f"{margin} - {value}", model),
        absolute=lambda model, value: part(f"{value} - {temp}", model),
    )


def overheat_policy_text(policies: Sequence[ModelPolicy] | PolicyList, default_celsius: str) -> str:
    """The overheat policy in words: alerts' descriptions, the report's findings."""
    return f"above {default_celsius} °C" + policy_list(policies).each(
        margin=lambda model, value: f"; {model}: within {value} °C of its slowdown limit",
        absolute=lambda model, value: f"; {model}: above {value} °C",
    )


def straggler_clock_events(select: Selector, *, reasons: str) -> str:
    """The clock-event time of the reasons (`thresholds.straggler_clock_reasons`, regex
    alternatives) that make a GPU at or above its job's median a straggler; `select` turns
    the seconds counter into the share of time they held (rate over a window)."""
    return select(GPU_CLOCK_EVENT_SECONDS_TOTAL.name, match("reason", "=~", reasons))


class JobThresholds(Protocol):
    """The training-job thresholds of rules/config.yaml as numbers (same names)."""

    @property
    def tensor_idle_ratio(self) -> float: ...
    @property
    def job_busy_ratio(self) -> float: ...
    @property
    def idle_in_job_fraction(self) -> float: ...
    @property
    def straggler_clock_fraction(self) -> float: ...
    @property
    def clock_event_fraction(self) -> float: ...
    @property
    def job_slowdown_fraction(self) -> float: ...


# Each definition below in two renderings, kept side by side: PromQL over the recording
# rules (the alerts), and element-wise over numbers, numpy arrays or pandas Series (the
# report's per-bucket frames). Change one, change the other.


def training(*, busy_ratio: str) -> str:
    """PromQL filter: the GPU's job is training (its median tensor activity is busy)."""
    return f"and on ({JOB_LABELS})\n({JOB_TENSOR_MEDIAN} > {busy_ratio})"


def is_training(t: JobThresholds, *, job_median_tensor: Any) -> Any:
    """Element-wise `training`."""
    return job_median_tensor > t.job_busy_ratio


def job_recent_max(*, baseline: str) -> str:
    """PromQL for `JOB_TENSOR_RECENT_MAX`: the job median's highest value in `baseline`."""
    return f"max_over_time({JOB_TENSOR_MEDIAN}[{baseline}])"


def straggler(
    *, alert: str, clock_fraction: str, clock_slowed: str, event_fraction: str, busy_ratio: str
) -> str:
    """PromQL: the GPU a training job waits for. Synchronous training waits for its slowest
    GPU at every collective, so that GPU is busy longest: its tensor activity is at or above
    the job's median, while its SM clock is below the job's median by `clock_fraction` or
    a clock-event reason held its clocks more than `event_fraction` of the time
    (`clock_slowed`: that share per reason). Every other GPU of the job waits, so the job's
    median falls (0.55 to 0.2): the job counts as training when its median was busy at any
    time within the baseline (`JOB_TENSOR_RECENT_MAX`), not only now, or while `alert` (this
    expression's alert) is pending or firing for the job: after a whole baseline of
    straggling the baseline is the straggling level, and a straggler that persists must not
    fall silent for it."""
    return (
        f"{JOB_TENSOR}\n>= on ({JOB_LABELS}) group_left ()\n{JOB_TENSOR_MEDIAN}\n"
        "and on (uuid)\n(\n"
        f"  {JOB_SM_CLOCK}\n  < on ({JOB_LABELS}) group_left ()\n"
        f"  ((1 - {clock_fraction}) * {JOB_SM_CLOCK_MEDIAN})\n"
        f"  or on (uuid)\n  {clock_slowed} > {event_fraction}\n)\n"
        f"and on ({JOB_LABELS})\n(\n  {JOB_TENSOR_RECENT_MAX} > {busy_ratio}\n"
        f'  or on ({JOB_LABELS})\n  count by ({JOB_LABELS}) (ALERTS{{alertname="{alert}"}})\n)\n'
        f"and on ({JOB_LABELS})\n(count by ({JOB_LABELS}) ({JOB_TENSOR}) > 1)"
    )


def is_straggler_candidate(
    t: JobThresholds,
    *,
    tensor: Any,
    job_median_tensor: Any,
    sm_clock: Any,
    job_median_sm_clock: Any,
    clock_slowed: Any,
    job_gpus: Any,
) -> Any:
    """Element-wise `straggler` without its training gate (`clock_slowed`: the share of
    time a straggler clock-event reason held the GPU's clocks); `straggler_gate` says
    whether the job counts as training."""
    clock_low = sm_clock < (1 - t.straggler_clock_fraction) * job_median_sm_clock
    return (
        (tensor >= job_median_tensor)
        & (clock_low | (clock_slowed > t.clock_event_fraction))
        & (job_gpus > 1)
    )


def straggler_gate(
    t: JobThresholds, *, job_recent_max_tensor: Sequence[float], straggled: Sequence[bool]
) -> list[bool]:
    """`straggler`'s training gate over one job's buckets in time order: the job's median
    was busy within the baseline (`job_recent_max_tensor`), or the bucket before had a
    straggler that passed the gate (`straggled`: any GPU a candidate in that bucket), as
    the alert pending or firing keeps the job training while the straggler persists."""
    gate: list[bool] = []
    for recent, candidate_before in zip(job_recent_max_tensor, [False, *straggled], strict=False):
        persisting = bool(gate) and gate[-1] and bool(candidate_before)
        gate.append(bool(is_training(t, job_median_tensor=recent)) or persisting)
    return gate


def idle_in_job(*, fraction: str, idle_ratio: str, busy_ratio: str) -> str:
    """PromQL: a GPU far below its training job's median activity (idle, misassigned or
    starved), or below the idle ratio whatever its job does."""
    return (
        f"(\n{JOB_TENSOR}\n< on ({JOB_LABELS}) group_left ()\n"
        f"({fraction} * {JOB_TENSOR_MEDIAN})\n{training(busy_ratio=busy_ratio)}\n)\n"
        f"or\n{JOB_TENSOR} < {idle_ratio}"
    )


def is_idle_in_job(t: JobThresholds, *, tensor: Any, job_median_tensor: Any) -> Any:
    """Element-wise `idle_in_job`."""
    below_job = tensor < t.idle_in_job_fraction * job_median_tensor
    busy = is_training(t, job_median_tensor=job_median_tensor)
    return (below_job & busy) | (tensor < t.tensor_idle_ratio)


def job_slowdown(*, fraction: str, baseline: str, busy_ratio: str) -> str:
    """PromQL: a training job whose median activity fell by `fraction` below its own
    average over the `baseline` window, which was a training job's."""
    average = f"avg_over_time({JOB_TENSOR_MEDIAN}[{baseline}])"
    return f"{JOB_TENSOR_MEDIAN}\n< (1 - {fraction}) * {average}\nand\n{average} > {busy_ratio}"


def is_job_slowdown(t: JobThresholds, *, job_median_tensor: Any, baseline: Any) -> Any:
    """Element-wise `job_slowdown` (`baseline`: the job median's preceding average)."""
    return (baseline > t.job_busy_ratio) & (
        job_median_tensor < (1 - t.job_slowdown_fraction) * baseline
    )
