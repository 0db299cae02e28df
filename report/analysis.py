"""Findings: turn a Dataset into ranked tables, each row carrying its evidence.

Every finding table holds only rows that call for attention, ranked worst first;
distribution tables (activity by node, by allocation) describe the whole fleet. A
section whose inputs are missing says so in `notes` instead of showing an empty table
as if the fleet were healthy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from fleetwatch.report.dataset import GPU, PORT, Dataset
from fleetwatch.report.policy import (
    OUTLIER_MIN_EXCESS_CELSIUS,
    OUTLIER_Z,
    Policy,
    shipped_policy,
)
from fleetwatch.rules.xids import FALLEN_OFF_BUS, shipped_catalog

RMA_XIDS = frozenset(str(code) for code in shipped_catalog().rma())
FELL_OFF_BUS_XID = str(FALLEN_OFF_BUS)


@dataclass
class Section:
    """One report section: named tables in display order, and what could not be computed."""

    title: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    """The action list plus every section."""

    dataset: Dataset
    actions: pd.DataFrame
    sections: list[Section]

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table by its (unique) name, the action list first."""
        out = {"actions": self.actions}
        for section in self.sections:
            out.update(section.tables)
        return out


def _values(ds: Dataset, name: str, keys: tuple[str, ...], column: str) -> pd.DataFrame | None:
    """A summary frame as `keys + [column]`, or None when its query did not run."""
    frame = ds.frame(name)
    if frame is None:
        return None
    out = frame[[*keys, "value"]].rename(columns={"value": column})
    return out.astype(dict.fromkeys(keys, "string"))


def _require(section: Section, ds: Dataset, *names: str) -> bool:
    """True when every named query ran; otherwise note why and return False."""
    missing = [n for n in names if ds.frame(n) is None]
    for name in missing:
        section.notes.append(f"{name}: {ds.problems.get(name, 'not available')}")
    return not missing


def _ranked(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return frame.sort_values(by, ascending=False, kind="stable", ignore_index=True)


def thermal(ds: Dataset) -> Section:
    """Time above the taint threshold, p99/max, slowdown, and cooling/seating outliers."""
    section = Section("Thermal")
    if not _require(section, ds, "temp_p99", "temp_max", "temp_above_seconds"):
        return section
    gpus = _values(ds, "temp_p99", GPU, "p99_celsius")
    assert gpus is not None
    for name, column in (
        ("temp_max", "max_celsius"),
        ("temp_median", "median_celsius"),
        ("power_median", "median_watts"),
        ("temp_above_seconds", "above_s"),
        ("thermal_slowdown_seconds", "slowdown_s"),
    ):
        values = _values(ds, name, GPU, column)
        if values is None:
            section.notes.append(f"{name}: {ds.problems.get(name)}")
            values = pd.DataFrame(
                {**{k: pd.Series(dtype="string") for k in GPU}, column: pd.Series(dtype="float64")}
            )
        gpus = gpus.merge(values, on=list(GPU), how="left")
    gpus["minutes_above"] = gpus.pop("above_s").fillna(0) / 60
    gpus["slowdown_minutes"] = gpus.pop("slowdown_s").fillna(0) / 60
    section.tables["gpu_temperatures"] = gpus.sort_values(list(GPU), ignore_index=True)
    hot = gpus[(gpus["minutes_above"] > 0) | (gpus["slowdown_minutes"] > 0)]
    section.tables["thermal_hot_gpus"] = _ranked(
        hot[[*GPU, "minutes_above", "slowdown_minutes", "p99_celsius", "max_celsius"]],
        ["minutes_above", "slowdown_minutes", "max_celsius"],
    )
    section.tables["thermal_outliers"] = thermal_outliers(gpus)
    return section


def thermal_outliers(gpus: pd.DataFrame) -> pd.DataFrame:
    """GPUs much hotter than peers at similar power: robust z-score of the residual.

    Peers are the k GPUs nearest in median power draw; the residual is a GPU's median
    temperature minus its peers' median, scaled by the fleet-wide MAD of residuals.
    """
    columns = [
        *GPU,
        "median_celsius",
        "median_watts",
        "peer_median_celsius",
        "excess_celsius",
        "robust_z",
    ]
    data = gpus.dropna(subset=["median_celsius", "median_watts"])
    if len(data) < 5:
        return pd.DataFrame(columns=columns)
    data = data.sort_values(["median_watts", *GPU], ignore_index=True)
    k = max(5, min(51, len(data) // 4)) | 1
    peers = data["median_celsius"].rolling(k, center=True, min_periods=1).median()
    residual = data["median_celsius"] - peers
    mad = float((residual - residual.median()).abs().median())
    scale = max(mad / 0.6745, 0.5)
    data = data.assign(
        peer_median_celsius=peers,
        excess_celsius=residual,
        robust_z=(residual - residual.median()) / scale,
    )
    flagged = data[
        (data["robust_z"] > OUTLIER_Z) & (data["excess_celsius"] >= OUTLIER_MIN_EXCESS_CELSIUS)
    ]
    return _ranked(flagged[columns], ["robust_z"])


def activity(ds: Dataset, p: Policy) -> tuple[Section, pd.DataFrame | None]:
    """Tensor activity by node and allocation, and idle allocated GPUs.

    Also returns the allocated GPUs' buckets (`owned`: GPU, namespace, pod, timestamp,
    tensor, utilization) for the training-job findings, or None without allocations.
    """
    section = Section("Activity")
    if not _require(section, ds, "tensor_active"):
        return section, None
    tensor = ds.frames["tensor_active"]
    keys = [*GPU, "timestamp"]
    frame = tensor[[*keys, "value"]].rename(columns={"value": "tensor"})
    frame = frame.astype(dict.fromkeys(GPU, "string"))
    util = ds.frame("gpu_utilization")
    if util is None:
        section.notes.append(f"gpu_utilization: {ds.problems.get('gpu_utilization')}")
        frame["utilization"] = np.nan
    else:
        util = util.astype(dict.fromkeys(GPU, "string")).rename(columns={"value": "utilization"})
        frame = frame.merge(util[[*keys, "utilization"]], on=keys, how="left")
    bucket_hours = ds.window.bucket / 3600
    per_gpu = (
        frame.groupby(list(GPU), observed=True)
        .agg(tensor=("tensor", "mean"), utilization=("utilization", "mean"))
        .reset_index()
    )
    section.tables["gpu_activity"] = per_gpu
    section.tables["activity_by_node"] = (
        frame.groupby("node", observed=True)
        .agg(
            gpus=("gpu", "nunique"),
            tensor_mean=("tensor", "mean"),
            tensor_p10=("tensor", lambda s: s.quantile(0.1)),
            tensor_p50=("tensor", "median"),
            tensor_p90=("tensor", lambda s: s.quantile(0.9)),
            utilization_mean=("utilization", "mean"),
        )
        .reset_index()
    )
    alloc = ds.frame("allocation")
    if alloc is None:
        section.notes.append(
            f"allocation: {ds.problems.get('allocation')}; "
            "no per-pod activity, idle allocations or training jobs"
        )
        return section, None
    alloc = alloc.astype(dict.fromkeys((*GPU, "namespace", "pod"), "string"))
    owned = frame.merge(alloc[[*keys, "namespace", "pod"]], on=keys, how="inner")
    section.tables["activity_by_allocation"] = (
        owned.groupby(["namespace", "pod"], observed=True)
        .agg(
            gpus=("uuid", "nunique"),
            gpu_hours=("tensor", lambda s: len(s) * bucket_hours),
            tensor_mean=("tensor", "mean"),
            tensor_p50=("tensor", "median"),
            utilization_mean=("utilization", "mean"),
        )
        .reset_index()
    )
    idle = owned[owned["tensor"] < p.tensor_idle_ratio]
    idle_gpus = (
        idle.groupby([*GPU, "namespace", "pod"], observed=True)
        .agg(
            idle_gpu_hours=("tensor", lambda s: len(s) * bucket_hours),
            tensor_mean=("tensor", "mean"),
            utilization_mean=("utilization", "mean"),
        )
        .reset_index()
    )
    section.tables["idle_allocated_gpus"] = _ranked(idle_gpus, ["idle_gpu_hours"])
    return section, owned


def _gpu_values(ds: Dataset, section: Section, name: str, column: str) -> pd.DataFrame:
    """A bucketed per-GPU frame as GPU + timestamp + `column` (empty, noted, when absent)."""
    frame = ds.frame(name)
    keys = [*GPU, "timestamp"]
    if frame is None:
        section.notes.append(f"{name}: {ds.problems.get(name, 'not available')}")
        return pd.DataFrame(
            {k: pd.Series(dtype="string") for k in GPU}
            | {
                "timestamp": pd.Series(dtype="int64"),
                column: pd.Series(dtype="float64"),
            }
        )
    out = frame[[*keys, "value"]].rename(columns={"value": column})
    return out.astype(dict.fromkeys(GPU, "string"))


def _job_members(ds: Dataset, owned: pd.DataFrame, section: Section) -> pd.DataFrame:
    """`owned` plus `training_job` (kube_pod_labels, else the pod), SM clock and slowdown."""
    keys = [*GPU, "timestamp"]
    jobs = ds.frame("pod_jobs")
    pod_keys = ["namespace", "pod", "timestamp"]
    if jobs is None or jobs.empty:
        why = (
            ds.problems.get("pod_jobs")
            if jobs is None
            else "kube_pod_labels has no series from the configured kube-state-metrics job"
        )
        section.notes.append(
            f"pod_jobs: {why}; each pod counts as its own training job (kube-state-metrics "
            "must export kube_pod_labels with the job label keys allowed in "
            "--metric-labels-allowlist)"
        )
        data = owned.assign(training_job=owned["pod"])
    else:
        jobs = jobs.astype(dict.fromkeys(("namespace", "pod", "training_job"), "string"))
        data = owned.merge(
            jobs[[*pod_keys, "training_job"]].drop_duplicates(pod_keys),
            on=pod_keys,
            how="left",
        )
        data["training_job"] = data["training_job"].fillna(data["pod"])
    for name, column, scale in (
        ("sm_clock", "sm_clock_mhz", 1e-6),
        ("clock_slowed", "slowed", 1.0),
    ):
        values = _gpu_values(ds, section, name, column)
        values[column] = values[column] * scale
        data = data.merge(values, on=keys, how="left")
    return data


def training_jobs(
    ds: Dataset, owned: pd.DataFrame | None, fabric_section: Section, p: Policy
) -> Section:
    """Per training job: the GPU the job waits for, GPUs idle in a busy job, job slowdowns.

    The rules' definitions, per `--bucket` (GPUs of one namespace/training_job on any
    number of nodes, compared within each bucket while the job is busy):
    straggler = tensor activity at or above the job median and an SM clock below the job
    median by `straggler_clock_fraction`, or a straggler clock-event reason active most of
    the bucket; idle in job = activity below `idle_in_job_fraction` of the job median, or
    below `tensor_idle_ratio` whatever the job does (those also get a reclaim action);
    slowdown = the job median fell by `job_slowdown_fraction` below its mean over the
    preceding `job_slowdown_baseline`, which was itself busy.
    """
    section = Section("Training jobs")
    if owned is None:
        section.notes.append("no allocated GPUs (see Activity): no training jobs")
        return section
    data = _job_members(ds, owned, section)
    hours = ds.window.bucket / 3600
    group = ["namespace", "training_job", "timestamp"]
    by_bucket = data.groupby(group, observed=True)
    data["job_median_tensor"] = by_bucket["tensor"].transform("median")
    data["job_median_sm_clock_mhz"] = by_bucket["sm_clock_mhz"].transform("median")
    data["job_gpus"] = by_bucket["uuid"].transform("nunique")
    busy = (data["job_gpus"] >= 2) & (data["job_median_tensor"] > p.job_busy_ratio)
    clock_low = (
        data["sm_clock_mhz"] < (1 - p.straggler_clock_fraction) * data["job_median_sm_clock_mhz"]
    )
    waited_for = data["tensor"] >= data["job_median_tensor"]
    data["straggling"] = busy & waited_for & (clock_low | (data["slowed"] >= 0.5))
    below_job = busy & (data["tensor"] < p.idle_in_job_fraction * data["job_median_tensor"])
    data["idle_in_job"] = below_job | (data["tensor"] < p.tensor_idle_ratio)
    data["busy"] = busy
    per_gpu = (
        data.groupby([*GPU, "namespace", "training_job"], observed=True)
        .agg(
            tensor_mean=("tensor", "mean"),
            job_median_tensor=("job_median_tensor", "median"),
            sm_clock_mhz=("sm_clock_mhz", "mean"),
            job_median_sm_clock_mhz=("job_median_sm_clock_mhz", "median"),
            clock_slowed_share=("slowed", "mean"),
            straggling_hours=("straggling", lambda s: s.sum() * hours),
            idle_hours=("idle_in_job", lambda s: s.sum() * hours),
            busy_hours=("busy", lambda s: s.sum() * hours),
        )
        .reset_index()
    )
    section.tables["job_gpus"] = per_gpu.sort_values(
        ["namespace", "training_job", "tensor_mean"],
        ascending=[True, True, False],
        kind="stable",
        ignore_index=True,
    )
    stragglers = per_gpu[per_gpu["straggling_hours"] > 0]
    section.tables["stragglers"] = _ranked(
        stragglers.assign(
            clock_deficit_mhz=stragglers["job_median_sm_clock_mhz"] - stragglers["sm_clock_mhz"]
        ),
        ["straggling_hours", "clock_deficit_mhz"],
    )
    idle = per_gpu[per_gpu["idle_hours"] > 0]
    section.tables["idle_in_job"] = _ranked(
        idle.assign(deficit=idle["job_median_tensor"] - idle["tensor_mean"]),
        ["idle_hours", "deficit"],
    )
    timeline = (
        data.groupby(group, observed=True)
        .agg(
            median_tensor=("tensor", "median"),
            gpus=("uuid", "nunique"),
            nodes=("node", "nunique"),
            stragglers=("straggling", "sum"),
        )
        .reset_index()
    )
    section.tables["jobs"] = _ranked(
        timeline.groupby(["namespace", "training_job"], observed=True)
        .agg(
            gpus=("gpus", "max"),
            nodes=("nodes", "max"),
            hours=("timestamp", lambda s: len(s) * hours),
            median_tensor=("median_tensor", "median"),
        )
        .reset_index(),
        ["gpus", "hours"],
    )
    section.tables["job_timeline"] = timeline
    section.tables["job_slowdowns"] = job_slowdowns(ds, timeline, data, fabric_section, p)
    return section


def job_slowdowns(
    ds: Dataset,
    timeline: pd.DataFrame,
    members: pd.DataFrame,
    fabric_section: Section,
    p: Policy,
) -> pd.DataFrame:
    """Jobs whose median activity fell well below their own preceding baseline, with suspects."""
    columns = [
        "namespace",
        "training_job",
        "first_slow_bucket",
        "slow_hours",
        "median_tensor",
        "baseline_tensor",
        "drop",
        "suspects",
    ]
    buckets = max(1, round(p.job_slowdown_baseline_seconds / ds.window.bucket))
    rows = []
    for (namespace, job), group in timeline.groupby(["namespace", "training_job"], observed=True):
        baseline = group["median_tensor"].shift(1).rolling(buckets, min_periods=buckets).mean()
        slow = (baseline > p.job_busy_ratio) & (
            group["median_tensor"] < (1 - p.job_slowdown_fraction) * baseline
        )
        if not slow.any():
            continue
        slow_stamps = group.loc[slow, "timestamp"]
        in_job = members[(members["namespace"] == namespace) & (members["training_job"] == job)]
        rows.append(
            (
                namespace,
                job,
                pd.to_datetime(
                    int(slow_stamps.iloc[0]) - ds.window.bucket, unit="s", utc=True
                ).strftime("%Y-%m-%dT%H:%M:%SZ"),
                len(slow_stamps) * ds.window.bucket / 3600,
                float(group.loc[slow, "median_tensor"].mean()),
                float(baseline[slow].mean()),
                float(1 - group.loc[slow, "median_tensor"].mean() / baseline[slow].mean()),
                _suspects(in_job, fabric_section),
            )
        )
    return _ranked(pd.DataFrame(rows, columns=columns), ["drop"])


def _suspects(job: pd.DataFrame, fabric_section: Section) -> str:
    """The job's stragglers and the fabric errors on its nodes, as one short line."""
    found = [
        f"straggler {r.node} GPU {r.gpu}"
        for r in job[job["straggling"]][list(GPU)].drop_duplicates().itertuples()
    ]
    nodes = set(job["node"])
    ib = fabric_section.tables.get("ib_port_errors")
    if ib is not None:
        found += [
            f"IB {r.node} {r.device}/{r.port} {r.error} {r.errors:.0f}"
            for r in ib[ib["node"].isin(nodes)].itertuples()
        ]
    nvlink = fabric_section.tables.get("nvlink_errors")
    if nvlink is not None:
        found += [
            f"NVLink {r.node} GPU {r.gpu} link {r.link} {r.error} {r.errors:.0f}"
            for r in nvlink[nvlink["node"].isin(nodes)].itertuples()
        ]
    return "; ".join(found)


def fabric(ds: Dataset) -> Section:
    """InfiniBand errors per type, flaps, degraded rate, saturated counters; NVLink errors."""
    section = Section("Fabric")
    hours = ds.window.seconds / 3600
    errors = _values(ds, "ib_errors", (*PORT, "error"), "errors")
    if errors is None:
        section.notes.append(f"ib_errors: {ds.problems.get('ib_errors')}")
    else:
        errors["errors_per_hour"] = errors["errors"] / hours
        errors["rank_in_type"] = (
            errors.groupby("error")["errors_per_hour"]
            .rank(ascending=False, method="min")
            .astype("int64")
        )
        section.tables["ib_port_errors"] = _ranked(errors, ["errors_per_hour"])
    section.tables["ib_flaps"] = flaps(ds, section, errors)
    for name, column, table in (
        ("ib_degraded_seconds", "degraded_minutes", "ib_degraded_ports"),
        ("ib_saturated_seconds", "saturated_minutes", "ib_saturated_counters"),
    ):
        frame = ds.frame(name)
        if frame is None:
            section.notes.append(f"{name}: {ds.problems.get(name)}")
            continue
        keys = [c for c in frame.columns if c not in ("timestamp", "value")]
        out = frame[keys].astype("string").assign(**{column: frame["value"] / 60})
        section.tables[table] = _ranked(out, [column])
    nvlink = _values(ds, "nvlink_errors", (*GPU, "link", "error"), "errors")
    if nvlink is None:
        section.notes.append(f"nvlink_errors: {ds.problems.get('nvlink_errors')}")
    else:
        nvlink["errors_per_hour"] = nvlink["errors"] / hours
        section.tables["nvlink_errors"] = _ranked(nvlink, ["errors_per_hour"])
    return section


def flaps(ds: Dataset, section: Section, errors: pd.DataFrame | None) -> pd.DataFrame:
    """Ports that went down: `link_downed` growth, or the exporter's state changes / 2.

    Either source alone is enough: a history without the exporter's state-change counter
    (or a flap shorter than a scrape, which it cannot see) still shows `link_downed`.
    """
    parts = []
    for name, column in (("ib_state_changes", "state_changes"), ("ib_down_seconds", "down_s")):
        values = _values(ds, name, PORT, column)
        if values is None:
            section.notes.append(f"{name}: {ds.problems.get(name)}")
        else:
            parts.append(values)
    if errors is not None:
        downed = errors[errors["error"] == "link_downed"][[*PORT, "errors"]]
        parts.append(downed.rename(columns={"errors": "link_downed"}))
    table = pd.DataFrame({k: pd.Series(dtype="string") for k in PORT})
    for part in parts:
        table = table.merge(part, on=list(PORT), how="outer")
    for column in ("state_changes", "down_s", "link_downed"):
        table[column] = table[column].fillna(0.0) if column in table else 0.0
    table["flaps"] = np.maximum(table["link_downed"], np.floor(table["state_changes"] / 2))
    table["down_minutes"] = table.pop("down_s") / 60
    table = table[(table["flaps"] > 0) | (table["down_minutes"] > 0)]
    return _ranked(
        table[[*PORT, "state_changes", "link_downed", "flaps", "down_minutes"]],
        ["flaps", "down_minutes"],
    )


def reliability(ds: Dataset) -> Section:
    """Xid events by code and GPU, ECC and row-remap growth, GPUs that fell off the bus."""
    section = Section("Reliability")
    xid = _values(ds, "xid_events", (*GPU, "xid"), "events")
    if xid is None:
        section.notes.append(f"xid_events: {ds.problems.get('xid_events')}")
    else:
        section.tables["xid_events"] = _ranked(xid, ["events"])
        section.tables["xid_by_code"] = _ranked(
            xid.groupby("xid")
            .agg(events=("events", "sum"), gpus=("uuid", "nunique"))
            .reset_index(),
            ["events"],
        )
    for name, keys, column in (
        ("ecc_errors", (*GPU, "severity"), "errors"),
        ("remapped_rows", (*GPU, "cause"), "new_remapped_rows"),
        ("remap_failed", GPU, "remap_failed"),
    ):
        values = _values(ds, name, keys, column)
        if values is None:
            section.notes.append(f"{name}: {ds.problems.get(name)}")
        else:
            section.tables[name] = _ranked(values, [column])
    lost = _values(ds, "gpu_lost_samples", GPU, "samples")
    reference = ds.frame("gpu_samples_max")
    if lost is None or reference is None or reference.empty:
        _require(section, ds, "gpu_lost_samples", "gpu_samples_max")
    else:
        # A healthy GPU has the fleet's full sample count; the shortfall is time missing.
        full = float(reference["value"].iloc[0])
        lost["minutes_missing"] = (full - lost.pop("samples")) / full * ds.window.seconds / 60
        last_seen = ds.window.end - lost["minutes_missing"] * 60
        lost["last_seen_approx"] = pd.to_datetime(last_seen, unit="s", utc=True).dt.strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
        xids = (
            xid.groupby(list(GPU))["xid"].agg(lambda s: " ".join(sorted(s))).rename("xids")
            if xid is not None
            else pd.Series(name="xids", dtype="string")
        )
        lost = lost.merge(
            xids.reset_index() if xid is not None else pd.DataFrame(columns=[*GPU, "xids"]),
            on=list(GPU),
            how="left",
        )
        lost["xids"] = lost["xids"].fillna("")
        section.tables["gpus_lost"] = _ranked(lost, ["minutes_missing"])
    count = _values(ds, "gpu_count_min", ("node",), "min_visible")
    expected = _values(ds, "gpu_expected", ("node",), "expected")
    if count is not None and expected is not None:
        nodes = count.merge(expected, on="node")
        short = nodes[nodes["min_visible"] < nodes["expected"]]
        section.tables["nodes_missing_gpus"] = short.sort_values("node", ignore_index=True)
    else:
        _require(section, ds, "gpu_count_min", "gpu_expected")
    return section


def _intervals(timeline: pd.DataFrame, keys: list[str], step: float) -> pd.DataFrame:
    """Contiguous runs of samples (gap <= step) per key as start/end/minutes rows."""
    rows = []
    for key, group in timeline.groupby(keys, observed=True):
        stamps = np.sort(group["timestamp"].to_numpy())
        breaks = np.flatnonzero(np.diff(stamps) > step) + 1
        for run in np.split(stamps, breaks):
            rows.append(
                (
                    *(key if isinstance(key, tuple) else (key,)),
                    int(run[0]),
                    int(run[-1] + step),
                    (run[-1] + step - run[0]) / 60,
                )
            )
    return pd.DataFrame(rows, columns=[*keys, "start", "end", "minutes"])


def remediation(ds: Dataset) -> Section:
    """Taints applied and removed, time each node spent tainted, breaker trips."""
    section = Section("Remediation")
    step = ds.window.step
    alerts = ds.frame("taint_alerts")
    if alerts is None:
        section.notes.append(f"taint_alerts: {ds.problems.get('taint_alerts')}")
    else:
        keys = ["node", "alertname", "fleetwatch_taint"]
        windows = _intervals(alerts.astype(dict.fromkeys(keys, "string")), keys, step)
        section.tables["taint_windows"] = windows.sort_values(["start", "node"], ignore_index=True)
        section.tables["node_tainted_time"] = _ranked(
            windows.groupby("node")
            .agg(windows=("start", "size"), minutes=("minutes", "sum"))
            .reset_index(),
            ["minutes"],
        )
    summary: list[tuple[str, float]] = []
    ops = _values(ds, "taint_operations", ("op", "result"), "count")
    if ops is None:
        section.notes.append(f"taint_operations: {ds.problems.get('taint_operations')}")
    else:
        summary += [(f"taint {r.op} ({r.result})", float(r.count)) for r in ops.itertuples()]
    for name, label in (("breaker_open", "breaker trips"), ("tainted_nodes", "max tainted nodes")):
        frame = ds.frame(name)
        if frame is None:
            section.notes.append(f"{name}: {ds.problems.get(name)}")
            continue
        values = frame["value"].to_numpy()
        if name == "breaker_open":
            opened = values > 0.5
            summary.append((label, float(np.sum(opened[1:] & ~opened[:-1]) + opened[:1].sum())))
        else:
            summary.append((label, float(values.max(initial=0.0))))
    if summary:
        section.tables["tainter_summary"] = pd.DataFrame(summary, columns=["what", "value"])
    return section


def _gpu(row: Any) -> str:
    return f"{row.node} GPU {row.gpu}"


def actions(sections: dict[str, Section], temperature_celsius: float) -> pd.DataFrame:
    """The short list at the top: drain, reseat/recable, RMA, reclaim, investigate."""
    rows: list[tuple[str, str, str]] = []

    def table(section: str, name: str) -> pd.DataFrame:
        return sections[section].tables.get(name, pd.DataFrame())

    for r in table("Thermal", "thermal_hot_gpus").itertuples():
        rows.append(
            (
                "drain",
                r.node,
                f"GPU {r.gpu} above {temperature_celsius:g} °C for "
                f"{r.minutes_above:.0f} min (max {r.max_celsius:.1f} °C, "
                f"{r.slowdown_minutes:.0f} min thermal slowdown)",
            )
        )
    for r in table("Reliability", "gpus_lost").itertuples():
        xid = f" after Xid {r.xids}" if r.xids else ""
        rows.append(
            (
                "drain",
                r.node,
                f"GPU {r.gpu} fell off the bus{xid}, last seen about {r.last_seen_approx}: "
                "reboot the node",
            )
        )
    lost = {(r.node, r.gpu) for r in table("Reliability", "gpus_lost").itertuples()}
    xid_events = table("Reliability", "xid_events")
    if not xid_events.empty:
        xid_events = xid_events[xid_events["xid"] == FELL_OFF_BUS_XID]
    for r in xid_events.itertuples():
        if (r.node, r.gpu) not in lost:
            rows.append(
                (
                    "drain",
                    r.node,
                    f"GPU {r.gpu} fell off the bus (Xid 79, {r.events:.0f} events) and came "
                    "back: reboot the node before it drops out of a job again",
                )
            )
    for r in table("Thermal", "thermal_outliers").itertuples():
        rows.append(
            (
                "reseat",
                _gpu(r),
                f"runs {r.excess_celsius:.1f} °C hotter than peers at "
                f"{r.median_watts:.0f} W (robust z {r.robust_z:.1f}): check cooling "
                "and seating before it crosses the threshold",
            )
        )
    for r in table("Fabric", "ib_flaps").itertuples():
        rows.append(
            (
                "recable",
                f"{r.node} {r.device}/{r.port}",
                f"{r.flaps:.0f} link flaps, down {r.down_minutes:.0f} min",
            )
        )
    for r in table("Fabric", "ib_saturated_counters").itertuples():
        rows.append(
            (
                "recable",
                f"{r.node} {r.device}/{r.port}",
                f"{r.error} pinned at its maximum for {r.saturated_minutes:.0f} min: "
                "its rate reads 0; inspect the cable and reset the counters",
            )
        )
    rma = table("Reliability", "xid_events")
    if not rma.empty:
        rma = rma[rma["xid"].isin(RMA_XIDS)]
    for r in rma.itertuples():
        rows.append(("rma", _gpu(r), f"Xid {r.xid} ({r.events:.0f} events)"))
    for r in table("Reliability", "remap_failed").itertuples():
        rows.append(("rma", _gpu(r), "row remapping failed"))
    ecc = table("Reliability", "ecc_errors")
    if not ecc.empty:
        ecc = ecc[ecc["severity"] == "uncorrected"]
    for r in ecc.itertuples():
        rows.append(("rma", _gpu(r), f"{r.errors:.0f} uncorrected ECC errors"))
    for r in table("Training jobs", "stragglers").itertuples():
        events = (
            f", clock events {r.clock_slowed_share:.0%} of the time" if r.clock_slowed_share else ""
        )
        rows.append(
            (
                "investigate",
                _gpu(r),
                f"straggler of {r.namespace}/{r.training_job} for {r.straggling_hours:.1f} h: "
                f"tensor activity {r.tensor_mean:.2f} (job median {r.job_median_tensor:.2f}) "
                f"at SM clock {r.sm_clock_mhz:.0f} MHz (job median "
                f"{r.job_median_sm_clock_mhz:.0f} MHz){events}: the whole job waits for it",
            )
        )
    reclaim = {(r.node, r.gpu) for r in table("Activity", "idle_allocated_gpus").itertuples()}
    for r in table("Training jobs", "idle_in_job").itertuples():
        if (r.node, r.gpu) in reclaim:
            continue  # idle whatever its job does: the reclaim row below says so
        rows.append(
            (
                "investigate",
                _gpu(r),
                f"idle in {r.namespace}/{r.training_job} for {r.idle_hours:.1f} h: tensor "
                f"activity {r.tensor_mean:.2f} vs job median {r.job_median_tensor:.2f} "
                "(starved, misassigned or a stuck rank)",
            )
        )
    for r in table("Training jobs", "job_slowdowns").itertuples():
        rows.append(
            (
                "investigate",
                f"{r.namespace}/{r.training_job}",
                f"job slowed down from {r.first_slow_bucket}: median tensor activity "
                f"{r.median_tensor:.2f}, {r.drop:.0%} below its baseline {r.baseline_tensor:.2f}; "
                f"suspects: {r.suspects or 'none found'}",
            )
        )
    for r in table("Activity", "idle_allocated_gpus").itertuples():
        rows.append(
            (
                "reclaim",
                _gpu(r),
                f"allocated to {r.namespace}/{r.pod} but idle for "
                f"{r.idle_gpu_hours:.1f} GPU-hours (tensor {r.tensor_mean:.3f})",
            )
        )
    return pd.DataFrame(rows, columns=["action", "target", "reason"])


def analyse(ds: Dataset, policy: Policy | None = None) -> Report:
    """Every section plus the action list; thresholds from the rules config by default.

    The window's `threshold_celsius` (the report's flag, which defaults to the rules
    config's) is the temperature threshold.
    """
    p = policy or shipped_policy()
    activity_section, owned = activity(ds, p)
    fabric_section = fabric(ds)
    sections = [
        thermal(ds),
        activity_section,
        training_jobs(ds, owned, fabric_section, p),
        fabric_section,
        reliability(ds),
        remediation(ds),
    ]
    return Report(
        dataset=ds,
        actions=actions({s.title: s for s in sections}, ds.window.threshold_celsius),
        sections=sections,
    )
