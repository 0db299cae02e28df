"""What the report pulls from Prometheus, as typed pandas frames, and Parquet snapshots.

Aggregation that Prometheus does well (quantiles over time, increases, time spent in a
state at `--step` resolution) is pushed into PromQL, so a 1,000-node day arrives as a
few hundred thousand points instead of tens of millions. Three query shapes:

- `summary`: one value per series over the whole window (evaluated once, at `until`);
- `bucketed`: one value per series per `--bucket` (e.g. hourly mean tensor activity);
- `timeline`: a few low-cardinality series at full `--step` (alerts, tainter state).

Every frame is long-format: the query's label columns (categorical), `timestamp`
(int64 epoch seconds) and `value` (float64), sorted, so a snapshot written with
`save_snapshot` and read back with `load_snapshot` yields identical frames.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
from fleetwatch.report.policy import shipped_config, shipped_policy
from fleetwatch.report.promapi import PrometheusClient, QueryError, Series
from fleetwatch.rules.definitions import (
    POD_LABELS_METRIC,
    TENSOR_METRIC,
    Selector,
    pod_training_job,
    straggler_clock_events,
    tensor_active,
)

from fleetwatch import metric_names as names

GPU = ("node", "gpu", "uuid")
PORT = ("node", "device", "port")
POD_JOB = ("namespace", "pod", "training_job")
LOST_AFTER_SECONDS = 600.0


@dataclass(frozen=True, kw_only=True)
class Window:
    """The time range analysed and the resolutions used (all in seconds)."""

    start: float
    end: float
    step: float
    bucket: float
    threshold_celsius: float
    selector: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start


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


def _sel(window: Window, name: str, matchers: str = "", *, scoped: bool = True) -> str:
    parts = [m for m in (matchers, window.selector if scoped else "") if m]
    return f"{name}{{{','.join(parts)}}}"


def _d(seconds: float) -> str:
    return f"{round(seconds)}s"


def _time_in_state(window: Window, expr: str) -> str:
    """Seconds (at `step` resolution) during which the 0/1 expression was 1."""
    w = window
    return f"sum_over_time(({expr})[{_d(w.seconds)}:{_d(w.step)}]) * {w.step:g}"


def _window_delta(window: Window, selector: str) -> str:
    """Counter growth in the window, counting series that first appeared inside it."""
    w = _d(window.seconds)
    last = f"last_over_time({selector}[{w}])"
    return f"{last} - (last_over_time({selector}[{w}] offset {w}) or {last} * 0)"


TEMP = names.TEMPERATURE
POWER = names.POWER
TENSOR = TENSOR_METRIC
UTIL = names.UTILIZATION
CLOCK = names.CLOCK
CLOCK_EVENTS = names.CLOCK_EVENT_SECONDS
POD_LABELS = POD_LABELS_METRIC
ALLOC = names.ALLOCATION_INFO
IB_ERRORS = names.IB_PORT_ERRORS
IB_CHANGES = names.IB_PORT_STATE_CHANGES
IB_UP = names.IB_PORT_UP
IB_RATE = names.IB_PORT_RATE
IB_SATURATED = names.IB_PORT_ERROR_SATURATED
NVLINK_ERRORS = names.NVLINK_ERRORS
XID = names.XID_ERRORS
ECC = names.ECC_ERRORS
REMAPPED = names.REMAPPED_ROWS
REMAP_FAILED = names.ROW_REMAP_FAILED
GPU_COUNT = names.COUNT
GPU_EXPECTED = names.EXPECTED
TAINT_OPS = "fleetwatch_tainter_taint_operations_total"
TAINTED_NODES = "fleetwatch_tainter_tainted_nodes"
BREAKER = "fleetwatch_tainter_breaker_open"


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
    """A `Selector` reading `fn(metric{matcher, ...}[bucket])` (for the rules' builders)."""

    def select(metric: str, matcher: str) -> str:
        matchers = ",".join(m for m in (extra, matcher) if m)
        return f"{fn}({_sel(w, metric, matchers, scoped=scoped)}[{_d(w.bucket)}])"

    return select


def _tensor(w: Window) -> str:
    """Tensor activity per bucket, fleetwatch's GPM else dcgm-exporter's: the rules'
    definition (`fleetwatch:gpu_tensor_active:ratio`) over bucket means."""
    mean = _over_bucket(w, "avg_over_time")
    return tensor_active(shipped_config(), own=mean, dcgm=mean)


def _slowed(w: Window) -> str:
    """Share of each bucket a straggler clock-event reason (thermal, power brake) held, from
    its cumulative time (the rules judge clock events the same way)."""
    reasons = "|".join(shipped_policy().straggler_clock_reasons)
    events = straggler_clock_events(_over_bucket(w, "rate"), reasons=reasons)
    return f"max by ({','.join(GPU)}) ({events})"


def _pod_jobs(w: Window) -> str:
    """Each pod's training job as the rules define it: the first configured kube_pod_labels
    label present, else the pod name (of every pod kube-state-metrics lists)."""
    config = shipped_config()
    pods = _over_bucket(w, "max_over_time", scoped=False, extra=config.kube_state_metrics_selector)
    return pod_training_job(config, pods, fallback=pods(POD_LABELS, ""))


def _lost(w: Window) -> str:
    """GPUs with samples in the window but none in the last LOST_AFTER_SECONDS."""
    return (
        f"max by (node,gpu,uuid) (count_over_time({_temp(w)}[{_d(w.seconds)}]) "
        f"unless on(node,gpu,uuid) count_over_time({_temp(w)}[{_d(LOST_AFTER_SECONDS)}]))"
    )


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
            + _time_in_state(w, f"{_temp(w)} > bool {w.threshold_celsius:g}")
            + ")"
        ),
    ),
    Query(
        "thermal_slowdown_seconds",
        "summary",
        GPU,
        (CLOCK_EVENTS,),
        lambda w: (
            "sum by (node,gpu,uuid) (increase("
            + _sel(w, CLOCK_EVENTS, 'reason=~"sw_thermal_slowdown|hw_thermal_slowdown"')
            + f"[{_d(w.seconds)}]))"
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
    ),
    Query(
        "sm_clock",
        "bucketed",
        GPU,
        (CLOCK,),
        _bucket("avg_over_time", lambda w: _sel(w, CLOCK, 'clock="sm"'), GPU),
    ),
    Query("clock_slowed", "bucketed", GPU, (CLOCK_EVENTS,), _slowed),
    Query("pod_jobs", "bucketed", POD_JOB, (POD_LABELS,), _pod_jobs, scoped=False),
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
        lambda w: (
            f"sum by (node,device,port,error) (increase({_sel(w, IB_ERRORS)}[{_d(w.seconds)}])) > 0"
        ),
    ),
    Query(
        "ib_state_changes",
        "summary",
        PORT,
        (IB_CHANGES,),
        lambda w: (
            f"sum by (node,device,port) (increase({_sel(w, IB_CHANGES)}[{_d(w.seconds)}])) > 0"
        ),
    ),
    Query(
        "ib_down_seconds",
        "summary",
        PORT,
        (IB_UP,),
        lambda w: _time_in_state(w, f"{_sel(w, IB_UP)} == bool 0") + " > 0",
    ),
    Query("ib_degraded_seconds", "summary", PORT, (IB_RATE,), _degraded),
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
        lambda w: (
            f"sum by (node,gpu,uuid,link,error) "
            f"(increase({_sel(w, NVLINK_ERRORS)}[{_d(w.seconds)}])) > 0"
        ),
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
        lambda w: (
            f"sum by (node,gpu,uuid,severity) (increase({_sel(w, ECC)}[{_d(w.seconds)}])) > 0"
        ),
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
        build=lambda w: f"max({_sel(w, TAINTED_NODES, scoped=False)})",
    ),
    Query(
        "breaker_open",
        "timeline",
        (),
        (BREAKER,),
        scoped=False,
        build=lambda w: f"max({_sel(w, BREAKER, scoped=False)})",
    ),
)


@dataclass
class Dataset:
    """Frames by query name, plus why each absent frame is absent."""

    window: Window
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)

    def frame(self, name: str) -> pd.DataFrame | None:
        """The frame, or None when its query could not run (see `problems`)."""
        return self.frames.get(name)


def to_frame(series: list[Series], keys: tuple[str, ...]) -> pd.DataFrame:
    """Long-format frame: categorical `keys`, int64 `timestamp`, float64 `value`, sorted."""
    columns: dict[str, list[object]] = {k: [] for k in (*keys, "timestamp", "value")}
    for s in series:
        n = len(s.values)
        for k in keys:
            columns[k].extend([s.labels.get(k, "")] * n)
        columns["timestamp"].extend(s.timestamps)
        columns["value"].extend(s.values)
    frame = pd.DataFrame(columns)
    frame = frame.astype(dict.fromkeys(keys, "string") | {"timestamp": "int64", "value": "float64"})
    frame = frame.sort_values([*keys, "timestamp"], ignore_index=True)
    return frame.astype(dict.fromkeys(keys, "category"))


def _range_for(query: Query, window: Window) -> tuple[float, float, float]:
    if query.shape == "summary":
        return window.end, window.end, window.step
    if query.shape == "bucketed":
        return window.start + window.bucket, window.end, window.bucket
    return window.start, window.end, window.step


async def fetch(client: PrometheusClient, window: Window) -> Dataset:
    """Run every query whose required metrics exist in the window; record the rest.

    Raises `PrometheusUnreachable`/`PrometheusAuthError` when nothing can be read at all;
    a single query's error only marks that query as failed.
    """
    present = await client.metric_names(start=window.start, end=window.end, match=None)
    dataset = Dataset(window=window)
    runnable: list[Query] = []
    for query in QUERIES:
        missing = [m for m in query.required if m not in present]
        if query.any_of is not None and not present.intersection(query.any_of()):
            missing.append(" or ".join(query.any_of()))
        if not present:
            dataset.problems[query.name] = (
                "Prometheus has no samples at all in the window: check --since/--until "
                "and that this is the Prometheus that scrapes the fleet"
            )
        elif missing:
            dataset.problems[query.name] = (
                f"metric {', '.join(missing)} has no samples in the window "
                "(is its collector off, or the component not deployed?)"
            )
        else:
            runnable.append(query)

    async def run(query: Query) -> tuple[Query, list[Series] | QueryError]:
        start, end, step = _range_for(query, window)
        try:
            expr = query.build(window)
            return query, await client.query_range(expr, start=start, end=end, step=step)
        except QueryError as exc:
            return query, exc

    for query, result in await asyncio.gather(*(run(q) for q in runnable)):
        if isinstance(result, QueryError):
            dataset.problems[query.name] = str(result)
        else:
            dataset.frames[query.name] = to_frame(result, query.keys)
    return dataset


def planned_requests(window: Window) -> int:
    """How many HTTP range requests `fetch` makes at most (for the progress bar)."""
    from fleetwatch.report.promapi import chunks

    return sum(len(chunks(*_range_for(q, window))) for q in QUERIES)


def save_snapshot(dataset: Dataset, directory: Path) -> None:
    """Write every frame as Parquet plus a manifest (window, problems) to `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, frame in dataset.frames.items():
        frame.to_parquet(directory / f"{name}.parquet", index=False)
    manifest = {
        "window": asdict(dataset.window),
        "problems": dataset.problems,
        "frames": sorted(dataset.frames),
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


def load_snapshot(directory: Path) -> Dataset:
    """Read a snapshot written by `save_snapshot`; raises ValueError naming what is wrong."""
    manifest_path = directory / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
        window = Window(**manifest["window"])
        names = [str(n) for n in manifest["frames"]]
        problems = {str(k): str(v) for k, v in manifest["problems"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{manifest_path}: not a fleetwatch report snapshot ({exc})") from exc
    frames = {}
    for name in names:
        path = directory / f"{name}.parquet"
        try:
            frames[name] = pd.read_parquet(path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read snapshot frame ({exc})") from exc
    return Dataset(window=window, frames=frames, problems=problems)
