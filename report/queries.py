"""The report's PromQL: the `Query` table and the expressions each query builds.

Aggregation that Prometheus does well (quantiles over time, increases, time spent in a
state at `--step` resolution) is pushed into PromQL, so a 1,000-node day arrives as a
few hundred thousand points instead of tens of millions. Three query shapes:

- `summary`: one value per series over the whole window (evaluated once, at `until`);
- `bucketed`: one value per series per `--bucket` (e.g. hourly mean tensor activity);
- `timeline`: a few low-cardinality series at full `--step` (alerts, tainter state).

Per-GPU and per-port queries ask for one value per series over the window (or per
bucket) and finding queries keep only the rows above zero (`> 0`), so what crosses the
network grows with the nodes and the findings, not with raw samples. Each expression
takes a `Window`, whose `nodes` regex scopes it to one node batch. The training-job,
straggler and idle definitions come from the rules (`fleetwatch.rules.definitions`).
Running the queries is `fleetwatch.report.dataset`.

Where a recording rule's series answers a query (`Query.recorded`: tensor activity per
GPU, `fleetwatch:gpu_tensor_active:ratio`), the query reads it when the store holds it
over the window, and falls back to its raw expression when it does not (a store without
the rules, such as a long-term store fed raw series only, or rules deployed within the
window): `coverage` is the one cheap query that tells which.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from fleetwatch.catalog.allocation import GPU_ALLOCATION_INFO
from fleetwatch.catalog.gpu import (
    GPU_CLOCK_EVENT_SECONDS_TOTAL,
    GPU_CLOCK_HERTZ,
    GPU_ECC_ERRORS_TOTAL,
    GPU_FABRIC_DEGRADED,
    GPU_FABRIC_INFO,
    GPU_FABRIC_STATE_ID,
    GPU_INFO,
    GPU_POWER_WATTS,
    GPU_REMAPPED_ROWS,
    GPU_ROW_REMAP_FAILED,
    GPU_TEMPERATURE_CELSIUS,
    GPU_TEMPERATURE_MARGIN_CELSIUS,
    GPU_TENSOR_ACTIVE_RATIO,
    GPU_UTILIZATION_RATIO,
    GPUS_EXPECTED,
    GPUS_VISIBLE,
)
from fleetwatch.catalog.infiniband import (
    INFINIBAND_PORT_ERROR_SATURATED,
    INFINIBAND_PORT_ERRORS_TOTAL,
    INFINIBAND_PORT_RATE_BYTES_PER_SECOND,
    INFINIBAND_PORT_STATE_CHANGES_TOTAL,
    INFINIBAND_PORT_UP,
)
from fleetwatch.catalog.nvlink import NVLINK_ERRORS_TOTAL
from fleetwatch.catalog.storage import (
    STORAGE_AVAILABLE_BYTES,
    STORAGE_HUNG,
    STORAGE_READ_ONLY,
    STORAGE_SIZE_BYTES,
)
from fleetwatch.catalog.tainter import (
    TAINTER_BREAKER_OPEN,
    TAINTER_TAINT_OPERATIONS_TOTAL,
    TAINTER_TAINTED_NODES,
)
from fleetwatch.catalog.xid import GPU_XID_ERRORS_TOTAL
from fleetwatch.report.thresholds import shipped_config, shipped_policy
from fleetwatch.rules.config import ModelPolicy
from fleetwatch.rules.definitions import (
    CHECKPOINT_JOB_BURST_RECORD,
    CHECKPOINT_JOB_WRITE_RATE_RECORD,
    CHECKPOINT_NODE_WRITE_RATE_RECORD,
    POD_LABELS_METRIC,
    TENSOR_ACTIVE_RECORD,
    Selector,
    overheat_headroom,
    pod_training_job,
    straggler_clock_events,
    tensor_active,
)

GPU = ("node", "gpu", "uuid")
PORT = ("node", "device", "port")
MOUNT = ("node", "mountpoint")
JOB = ("namespace", "training_job")
POD_JOB = ("namespace", "pod", "training_job")
LOST_AFTER_SECONDS = 600.0
# A mount whose free space, at the window's trend, runs out within this many hours is
# filling up (a week: time for a person to clean up or grow it).
FULL_WITHIN_HOURS = 168.0
# The checkpoint recording rules (rules/alerts/storage.py). Per training job (namespace,
# training_job): bytes/s written and 1 while it saves; per node: bytes/s written.
JOB_CHECKPOINT_WRITE = CHECKPOINT_JOB_WRITE_RATE_RECORD
NODE_CHECKPOINT_WRITE = CHECKPOINT_NODE_WRITE_RATE_RECORD
JOB_CHECKPOINT_BURST = CHECKPOINT_JOB_BURST_RECORD


@dataclass(frozen=True, kw_only=True)
class Window:
    """The time range analysed and the resolutions used (all in seconds)."""

    start: float
    end: float
    step: float
    bucket: float
    threshold_celsius: float
    """The overheat policy's default (`thresholds.gpu_temperature_celsius`, or the report's
    --thermal.threshold-celsius)."""
    overheat_policy: tuple[ModelPolicy, ...] = ()
    """The models judged by a policy of their own (`thresholds.overheat_policy`)."""
    selector: str = ""
    nodes: str = ""
    """A regex of the nodes of one batch (empty: every node the selector matches)."""

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Recorded:
    """A recording rule's series that answer a query: `record`, the rule's name (from
    `fleetwatch.rules.definitions`), and `build`, the query over it, which yields what the
    query's raw expression yields (the same keys, the value the rule computes the same way)
    while the store reads one series a key instead of evaluating the rule's expression."""

    record: str
    build: Callable[[Window], str]


@dataclass(frozen=True)
class Query:
    """One PromQL query: the metrics it needs and the label columns it yields.

    `required` metrics missing from the window mean a collector is off; `optional` ones
    are counters that only exist once something happened (an Xid, a taint); of `any_of`
    (two sources of one value) one is enough.
    """

    name: str
    shape: str
    keys: tuple[str, ...]
    required: tuple[str, ...]
    build: Callable[[Window], str]
    optional: tuple[str, ...] = ()
    scoped: bool = True
    any_of: Callable[[], tuple[str, ...]] | None = None
    """Metrics that stand in for each other: at least one must have samples."""
    batched: bool = True
    """Read in node batches; False for queries that compare across the fleet or carry no
    node label (their answers hold findings only, or a handful of series)."""
    recorded: Recorded | None = None
    """The recorded series that answer this query where the store holds them."""


def _sel(
    window: Window, name: str, matchers: str = "", *, scoped: bool = True, node: str = "node"
) -> str:
    """`name{matchers, selector, batch}`; the batch's node regex goes on label `node`."""
    batch = f'{node}=~"{window.nodes}"' if scoped and window.nodes else ""
    parts = [m for m in (matchers, window.selector if scoped else "", batch) if m]
    return f"{name}{{{','.join(parts)}}}"


def _d(seconds: float) -> str:
    return f"{round(seconds)}s"


def _time_in_state(window: Window, expr: str) -> str:
    """Seconds (at `step` resolution) during which the 0/1 expression was 1."""
    w = window
    return f"sum_over_time(({expr})[{_d(w.seconds)}:{_d(w.step)}]) * {w.step:g}"


def _growth(window: Window, selector: str) -> str:
    """A hardware counter's growth within the window, exactly: its last sample minus its
    lowest. `increase()` extrapolates to the window's edges in Prometheus and not in
    VictoriaMetrics, so a count read with it differs between engines (5 flaps read as 5.02);
    this reads the samples only. After a reset (the exporter restarted) it counts the growth
    since the reset."""
    w = _d(window.seconds)
    return f"(last_over_time({selector}[{w}]) - min_over_time({selector}[{w}]))"


def _window_delta(window: Window, selector: str) -> str:
    """Counter growth in the window, counting series that first appeared inside it."""
    w = _d(window.seconds)
    last = f"last_over_time({selector}[{w}])"
    return f"{last} - (last_over_time({selector}[{w}] offset {w}) or {last} * 0)"


TEMP = GPU_TEMPERATURE_CELSIUS.name
POWER = GPU_POWER_WATTS.name
TENSOR = GPU_TENSOR_ACTIVE_RATIO.name
UTIL = GPU_UTILIZATION_RATIO.name
CLOCK = GPU_CLOCK_HERTZ.name
CLOCK_EVENTS = GPU_CLOCK_EVENT_SECONDS_TOTAL.name
POD_LABELS = POD_LABELS_METRIC
ALLOC = GPU_ALLOCATION_INFO.name
IB_ERRORS = INFINIBAND_PORT_ERRORS_TOTAL.name
IB_CHANGES = INFINIBAND_PORT_STATE_CHANGES_TOTAL.name
IB_UP = INFINIBAND_PORT_UP.name
IB_RATE = INFINIBAND_PORT_RATE_BYTES_PER_SECOND.name
IB_SATURATED = INFINIBAND_PORT_ERROR_SATURATED.name
NVLINK_ERRORS = NVLINK_ERRORS_TOTAL.name
XID = GPU_XID_ERRORS_TOTAL.name
ECC = GPU_ECC_ERRORS_TOTAL.name
REMAPPED = GPU_REMAPPED_ROWS.name
REMAP_FAILED = GPU_ROW_REMAP_FAILED.name
GPU_COUNT = GPUS_VISIBLE.name
GPU_EXPECTED = GPUS_EXPECTED.name
TAINT_OPS = TAINTER_TAINT_OPERATIONS_TOTAL.name
TAINTED_NODES = TAINTER_TAINTED_NODES.name
BREAKER = TAINTER_BREAKER_OPEN.name
HUNG = STORAGE_HUNG.name
READ_ONLY = STORAGE_READ_ONLY.name
AVAILABLE = STORAGE_AVAILABLE_BYTES.name
SIZE = STORAGE_SIZE_BYTES.name
FABRIC_INFO = GPU_FABRIC_INFO.name
FABRIC_DEGRADED = GPU_FABRIC_DEGRADED.name
FABRIC_STATE = GPU_FABRIC_STATE_ID.name
DOMAIN = ("cluster_uuid", "clique_id")


def _headroom(w: Window) -> str:
    """Per GPU, °C left before its model's overheat policy, as the rules read it."""

    def select(metric: str, matcher: str) -> str:
        return _sel(w, metric, matcher)

    return overheat_headroom(
        lambda metric, matcher, worst: select(metric, matcher),
        select,
        w.overheat_policy,
        default_celsius=f"{w.threshold_celsius:g}",
    )


def _temp(w: Window) -> str:
    return _sel(w, TEMP, 'sensor="gpu"')


def _over(fn: str, metric: str) -> Callable[[Window], str]:
    """`fn(metric{selector}[window])`."""
    return lambda w: f"{fn}({_sel(w, metric)}[{_d(w.seconds)}])"


def _bucket(
    fn: str, selector: Callable[[Window], str], by: tuple[str, ...]
) -> Callable[[Window], str]:
    return lambda w: f"max by ({','.join(by)}) ({fn}({selector(w)}[{_d(w.bucket)}]))"


def _degraded(w: Window) -> str:
    """Time a port ran below the fleet's fastest port (scalar comparison: cheap per step)."""
    rate = _sel(w, IB_RATE)
    return _time_in_state(w, f"{rate} < bool scalar(max({rate}))") + " > 0"


def _over_bucket(w: Window, fn: str, *, scoped: bool = True, extra: str = "") -> Selector:
    """A `Selector` reading `fn(metric{matcher, ...}[bucket])` (for the rules' builders).

    A series without a `node` label (dcgm-exporter's, `node=""`) is batched by the
    `Hostname` that stands in for it."""

    def select(metric: str, matcher: str) -> str:
        matchers = ",".join(m for m in (extra, matcher) if m)
        node = "Hostname" if matcher == 'node=""' else "node"
        return f"{fn}({_sel(w, metric, matchers, scoped=scoped, node=node)}[{_d(w.bucket)}])"

    return select


COVERAGE_LOOKBACK_SECONDS = 300.0
"""How far back `coverage` looks for a series' latest sample (Prometheus' lookback)."""


def coverage(window: Window, query: Query) -> str:
    """Whether `query`'s recorded series answer for every key its raw expression does:
    1 where the recorded form yields at least as many series as the raw one over the last
    `COVERAGE_LOOKBACK_SECONDS` (a store holding the recorded series only counts too),
    nothing where it yields fewer (rules that ran on only part of the fleet, or not then).
    Asked at the start of the window and at its end, it tells whether the store holds them
    over the whole window. Whole fleet, one lookback of samples a series: cheap."""
    if query.recorded is None:
        raise ValueError(f"query {query.name} has no recorded form")
    recent = dataclasses.replace(window, bucket=COVERAGE_LOOKBACK_SECONDS, nodes="")
    return (
        f"count({query.recorded.build(recent)}) >= bool (count({query.build(recent)}) or vector(0))"
    )


def _tensor(w: Window) -> str:
    """Tensor activity per bucket, fleetwatch's GPM else dcgm-exporter's: the rules'
    definition (`fleetwatch:gpu_tensor_active:ratio`) over bucket means."""
    mean = _over_bucket(w, "avg_over_time")
    return tensor_active(shipped_config(), own=mean, dcgm=mean)


DCGM_NODE_LABEL = "Hostname"
"""What names the node on dcgm-exporter series that Prometheus gave no `node` label."""


def _slowed(w: Window) -> str:
    """Share of each bucket a straggler clock-event reason (thermal, power brake) held, from
    its cumulative time (the rules judge clock events the same way)."""
    reasons = "|".join(shipped_policy().straggler_clock_reasons)
    # The seconds counted within the bucket, from its own samples: rate() extrapolates to the
    # bucket's edges in Prometheus and not in VictoriaMetrics, and a GPU near the threshold
    # would be a straggler on one engine only. A bucket in which the counter reset (the
    # exporter restarted) is left out rather than read as the counter's whole value.
    top, bottom = _over_bucket(w, "max_over_time"), _over_bucket(w, "min_over_time")
    resets = _over_bucket(w, "resets")

    def held(metric: str, matcher: str) -> str:
        share = f"({top(metric, matcher)} - {bottom(metric, matcher)}) / {w.bucket:g}"
        return f"({share} unless {resets(metric, matcher)} > 0)"

    events = straggler_clock_events(held, reasons=reasons)
    return f"max by ({','.join(GPU)}) ({events})"


def _pod_jobs(w: Window) -> str:
    """Each pod's training job as the rules define it: the first configured kube_pod_labels
    label present, else the pod name (of every pod kube-state-metrics lists)."""
    config = shipped_config()
    pods = _over_bucket(w, "max_over_time", scoped=False, extra=config.kube_state_metrics_selector)
    return pod_training_job(config, pods, fallback=pods(POD_LABELS, ""))


def _fabric_unhealthy(w: Window) -> str:
    """Seconds each GPU's NVLink fabric was degraded or not registered (state not 3)."""
    by = "max by (node,gpu,uuid)"
    unhealthy = (
        f"clamp_max({by} ({_sel(w, FABRIC_DEGRADED)}) + ({by} ({_sel(w, FABRIC_STATE)}) "
        "!= bool 3), 1)"
    )
    return f"{by} ({_time_in_state(w, unhealthy)}) > 0"


def _lost(w: Window) -> str:
    """GPUs with samples in the window but none in the last LOST_AFTER_SECONDS."""
    return (
        f"max by (node,gpu,uuid) (count_over_time({_temp(w)}[{_d(w.seconds)}]) "
        f"unless on(node,gpu,uuid) count_over_time({_temp(w)}[{_d(LOST_AFTER_SECONDS)}]))"
    )


def _mount_time(metric: str) -> Callable[[Window], str]:
    """Seconds each mount's 0/1 `metric` (hung, read-only) was 1, mounts that never were
    left out."""
    return lambda w: (
        f"max by (node,mountpoint) ({_time_in_state(w, f'{_sel(w, metric)} == bool 1')}) > 0"
    )


def _hours_to_full(w: Window) -> str:
    """Hours until a mount's available space runs out at the window's trend (a least-squares
    slope), of the mounts that run out within FULL_WITHIN_HOURS."""
    available = f"{_sel(w, AVAILABLE)}[{_d(w.seconds)}]"
    falling = f"(-deriv({available}) > 0)"
    return (
        f"max by (node,mountpoint) (last_over_time({available}) / {falling}) / 3600 "
        f"< {FULL_WITHIN_HOURS:g}"
    )


def _saves(w: Window) -> str:
    """Checkpoint saves each job started in the window: steps where it saves and did not a
    step before (whether the record is 0 or absent between saves)."""
    burst = _sel(w, JOB_CHECKPOINT_BURST, scoped=False)
    started = f"({burst} == 1) unless ({burst} offset {_d(w.step)} == 1)"
    steps = f"[{_d(w.seconds)}:{_d(w.step)}]"
    return f"max by (namespace,training_job) (count_over_time(({started}){steps}))"


def _node_write_while_saving(w: Window) -> str:
    """Each node's mean checkpoint write rate over the steps it wrote at all."""
    writing = f"{_sel(w, NODE_CHECKPOINT_WRITE)} > 0"
    return f"max by (node) (avg_over_time(({writing})[{_d(w.seconds)}:{_d(w.step)}]))"


QUERIES: tuple[Query, ...] = (
    Query(
        "temp_p99",
        "summary",
        GPU,
        (TEMP,),
        lambda w: f"max by (node,gpu,uuid) (quantile_over_time(0.99, {_temp(w)}[{_d(w.seconds)}]))",
    ),
    Query(
        "temp_max",
        "summary",
        GPU,
        (TEMP,),
        lambda w: f"max by (node,gpu,uuid) (max_over_time({_temp(w)}[{_d(w.seconds)}]))",
    ),
    Query(
        "temp_median",
        "summary",
        GPU,
        (TEMP,),
        lambda w: f"max by (node,gpu,uuid) (quantile_over_time(0.5, {_temp(w)}[{_d(w.seconds)}]))",
    ),
    Query(
        "power_median",
        "summary",
        GPU,
        (POWER,),
        lambda w: (
            f"max by (node,gpu,uuid) (quantile_over_time(0.5, {_sel(w, POWER)}[{_d(w.seconds)}]))"
        ),
    ),
    Query(
        "temp_above_seconds",
        "summary",
        GPU,
        (TEMP,),
        lambda w: (
            "max by (node,gpu,uuid) ("
            + _time_in_state(w, f"(\n{_headroom(w)}\n) < bool 0")
            + ") > 0"
        ),
        optional=(GPU_INFO.name, GPU_TEMPERATURE_MARGIN_CELSIUS.name),
    ),
    Query(
        "thermal_slowdown_seconds",
        "summary",
        GPU,
        (CLOCK_EVENTS,),
        lambda w: (
            "sum by (node,gpu,uuid) ("
            + _growth(w, _sel(w, CLOCK_EVENTS, 'reason=~"sw_thermal_slowdown|hw_thermal_slowdown"'))
            + ") > 0"
        ),
    ),
    Query(
        "gpu_lost_samples",
        "summary",
        GPU,
        (TEMP,),
        _lost,
    ),
    Query(
        "gpu_samples_max",
        "summary",
        (),
        (TEMP,),
        lambda w: f"max(count_over_time({_temp(w)}[{_d(w.seconds)}]))",
    ),
    Query(
        "tensor_active",
        "bucketed",
        GPU,
        (),
        _tensor,
        any_of=lambda: (TENSOR, shipped_config().dcgm_tensor_active_metric),
        # The rule's series, fleetwatch's GPM else dcgm-exporter's, already {node, gpu, uuid}.
        recorded=Recorded(
            TENSOR_ACTIVE_RECORD,
            _bucket("avg_over_time", lambda w: _sel(w, TENSOR_ACTIVE_RECORD), GPU),
        ),
    ),
    Query(
        "sm_clock",
        "bucketed",
        GPU,
        (CLOCK,),
        _bucket("avg_over_time", lambda w: _sel(w, CLOCK, 'clock="sm"'), GPU),
    ),
    Query("clock_slowed", "bucketed", GPU, (CLOCK_EVENTS,), _slowed),
    Query("pod_jobs", "bucketed", POD_JOB, (POD_LABELS,), _pod_jobs, scoped=False, batched=False),
    Query(
        "gpu_utilization",
        "bucketed",
        GPU,
        (UTIL,),
        _bucket("avg_over_time", lambda w: _sel(w, UTIL), GPU),
    ),
    Query(
        "allocation",
        "bucketed",
        (*GPU, "namespace", "pod"),
        (ALLOC,),
        _bucket("max_over_time", lambda w: _sel(w, ALLOC), (*GPU, "namespace", "pod")),
    ),
    Query(
        "ib_errors",
        "summary",
        (*PORT, "error"),
        (IB_ERRORS,),
        lambda w: f"sum by (node,device,port,error) ({_growth(w, _sel(w, IB_ERRORS))}) > 0",
    ),
    Query(
        "ib_state_changes",
        "summary",
        PORT,
        (IB_CHANGES,),
        lambda w: f"sum by (node,device,port) ({_window_delta(w, _sel(w, IB_CHANGES))}) > 0",
    ),
    Query(
        "ib_down_seconds",
        "summary",
        PORT,
        (IB_UP,),
        lambda w: _time_in_state(w, f"{_sel(w, IB_UP)} == bool 0") + " > 0",
    ),
    Query("ib_degraded_seconds", "summary", PORT, (IB_RATE,), _degraded, batched=False),
    Query(
        "ib_saturated_seconds",
        "summary",
        (*PORT, "error"),
        (IB_SATURATED,),
        lambda w: _time_in_state(w, _sel(w, IB_SATURATED)) + " > 0",
    ),
    Query(
        "nvlink_errors",
        "summary",
        (*GPU, "link", "error"),
        (NVLINK_ERRORS,),
        lambda w: f"sum by (node,gpu,uuid,link,error) ({_growth(w, _sel(w, NVLINK_ERRORS))}) > 0",
    ),
    Query(
        "domain_gpus",
        "summary",
        (*GPU, *DOMAIN),
        (),
        optional=(FABRIC_INFO,),
        build=lambda w: (
            f"max by (node,gpu,uuid,cluster_uuid,clique_id) "
            f"(max_over_time({_sel(w, FABRIC_INFO)}[{_d(w.seconds)}]))"
        ),
    ),
    Query(
        "fabric_unhealthy_seconds",
        "summary",
        GPU,
        (),
        optional=(FABRIC_DEGRADED, FABRIC_STATE),
        build=_fabric_unhealthy,
    ),
    Query(
        "xid_events",
        "summary",
        (*GPU, "xid"),
        (),
        optional=(XID,),
        build=lambda w: f"max by (node,gpu,uuid,xid) ({_window_delta(w, _sel(w, XID))}) > 0",
    ),
    Query(
        "ecc_errors",
        "summary",
        (*GPU, "severity"),
        (ECC,),
        lambda w: f"sum by (node,gpu,uuid,severity) ({_growth(w, _sel(w, ECC))}) > 0",
    ),
    Query(
        "remapped_rows",
        "summary",
        (*GPU, "cause"),
        (REMAPPED,),
        lambda w: (
            f"max by (node,gpu,uuid,cause) ({_over('max_over_time', REMAPPED)(w)}"
            f" - {_over('min_over_time', REMAPPED)(w)}) > 0"
        ),
    ),
    Query(
        "remap_failed",
        "summary",
        GPU,
        (REMAP_FAILED,),
        lambda w: f"max by (node,gpu,uuid) ({_over('max_over_time', REMAP_FAILED)(w)}) > 0",
    ),
    Query(
        "gpu_count_min",
        "summary",
        ("node",),
        (GPU_COUNT,),
        lambda w: f"min by (node) ({_over('min_over_time', GPU_COUNT)(w)})",
    ),
    Query(
        "gpu_expected",
        "summary",
        ("node",),
        (GPU_EXPECTED,),
        lambda w: f"max by (node) ({_over('max_over_time', GPU_EXPECTED)(w)})",
    ),
    Query(
        "taint_alerts",
        "timeline",
        ("node", "alertname", "fleetwatch_taint"),
        (),
        optional=("ALERTS",),
        batched=False,
        build=lambda w: (
            "max by (node,alertname,fleetwatch_taint) ("
            + _sel(w, "ALERTS", 'alertstate="firing",fleetwatch_taint!=""')
            + ")"
        ),
    ),
    Query(
        "taint_operations",
        "summary",
        ("op", "result"),
        (TAINT_OPS,),
        scoped=False,
        batched=False,
        build=lambda w: (
            "sum by (op,result) (" + _window_delta(w, _sel(w, TAINT_OPS, scoped=False)) + ")"
        ),
    ),
    Query(
        "tainted_nodes",
        "timeline",
        (),
        (TAINTED_NODES,),
        scoped=False,
        batched=False,
        build=lambda w: f"max({_sel(w, TAINTED_NODES, scoped=False)})",
    ),
    Query("mount_hung_seconds", "summary", MOUNT, (HUNG,), _mount_time(HUNG)),
    Query("mount_read_only_seconds", "summary", MOUNT, (READ_ONLY,), _mount_time(READ_ONLY)),
    Query(
        "mount_available_ratio",
        "summary",
        MOUNT,
        (AVAILABLE, SIZE),
        lambda w: (
            f"max by (node,mountpoint) (last_over_time({_sel(w, AVAILABLE)}[{_d(w.seconds)}]) "
            f"/ last_over_time({_sel(w, SIZE)}[{_d(w.seconds)}]))"
        ),
    ),
    Query("mount_hours_to_full", "summary", MOUNT, (AVAILABLE,), _hours_to_full),
    # The checkpoint records exist only where a job saved: absent, the section says so.
    Query(
        "job_checkpoint_saving_seconds",
        "summary",
        JOB,
        (),
        optional=(JOB_CHECKPOINT_BURST,),
        scoped=False,
        batched=False,
        build=lambda w: (
            "max by (namespace,training_job) ("
            + _time_in_state(w, f"{_sel(w, JOB_CHECKPOINT_BURST, scoped=False)} == bool 1")
            + ")"
        ),
    ),
    Query(
        "job_checkpoint_saves",
        "summary",
        JOB,
        (),
        optional=(JOB_CHECKPOINT_BURST,),
        scoped=False,
        batched=False,
        build=_saves,
    ),
    Query(
        "job_checkpoint_peak_bytes",
        "summary",
        JOB,
        (),
        optional=(JOB_CHECKPOINT_WRITE,),
        scoped=False,
        batched=False,
        build=lambda w: (
            "max by (namespace,training_job) (max_over_time("
            f"{_sel(w, JOB_CHECKPOINT_WRITE, scoped=False)}[{_d(w.seconds)}]))"
        ),
    ),
    Query(
        "node_checkpoint_write_while_saving",
        "summary",
        ("node",),
        (),
        optional=(NODE_CHECKPOINT_WRITE,),
        build=_node_write_while_saving,
    ),
    Query(
        "breaker_open",
        "timeline",
        (),
        (BREAKER,),
        scoped=False,
        batched=False,
        build=lambda w: f"max({_sel(w, BREAKER, scoped=False)})",
    ),
)


NODE_LISTS = (GPU_COUNT, IB_UP)
"""Metrics the node list is read from: few series a node (one; one a port), so listing
10,000 nodes stays under a store's series limit for one lookup (VictoriaMetrics refuses
more than 300,000 by default, and the whole fleetwatch family is 130 a node)."""


def node_list_lookups(window: Window, present: set[str]) -> list[tuple[str, str]]:
    """The (label, series selector) pairs the fleet's node list is read from: the
    `NODE_LISTS` metrics with samples in the window (label `node`), and dcgm-exporter's
    series naming the node by `Hostname` where only dcgm-exporter runs on it."""
    lookups = [("node", _sel(window, name)) for name in NODE_LISTS if name in present]
    dcgm = shipped_config().dcgm_tensor_active_metric
    if dcgm in present:
        lookups.append((DCGM_NODE_LABEL, _sel(window, dcgm, 'node=""', scoped=False)))
    return lookups
