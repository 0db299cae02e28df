"""Findings: turn a Dataset into ranked tables, each row carrying its evidence.

Every finding table holds only rows that call for attention, ranked worst first;
distribution tables (activity by node, by allocation) describe the whole fleet. A
section whose inputs are missing says so in `notes` instead of showing an empty table
as if the fleet were healthy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fleetwatch.report.actions import actions, overheat_words
from fleetwatch.report.checkpoints import TITLE as CHECKPOINTS
from fleetwatch.report.checkpoints import checkpoints
from fleetwatch.report.dataset import Dataset
from fleetwatch.report.goodput import TITLE as GOODPUT
from fleetwatch.report.goodput import goodput
from fleetwatch.report.goodput_queries import GOODPUT as GOODPUT_QUERIES
from fleetwatch.report.jobs import training_jobs
from fleetwatch.report.query import DOMAIN, GPU, PORT
from fleetwatch.report.section import Section, frame_values, ranked, require
from fleetwatch.report.thresholds import (
    OUTLIER_MIN_EXCESS_CELSIUS,
    OUTLIER_Z,
    Policy,
    shipped_policy,
)


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


def thermal(ds: Dataset) -> Section:
    """Time above the taint threshold, p99/max, slowdown, and cooling/seating outliers."""
    section = Section("Thermal")
    if not require(section, ds, "temp_p99", "temp_max", "temp_above_seconds"):
        return section
    gpus = frame_values(ds, "temp_p99", GPU, "p99_celsius")
    assert gpus is not None
    for name, column in (
        ("temp_max", "max_celsius"),
        ("temp_median", "median_celsius"),
        ("power_median", "median_watts"),
        ("temp_above_seconds", "above_s"),
        ("thermal_slowdown_seconds", "slowdown_s"),
    ):
        values = frame_values(ds, name, GPU, column)
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
    section.tables["thermal_hot_gpus"] = ranked(
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
    return ranked(flagged[columns], ["robust_z"])


def activity(ds: Dataset, p: Policy) -> tuple[Section, pd.DataFrame | None]:
    """Tensor activity by node and allocation, and idle allocated GPUs.

    Also returns the allocated GPUs' buckets (`owned`: GPU, namespace, pod, timestamp,
    tensor, utilization) for the training-job findings, or None without allocations.
    """
    section = Section("Activity")
    if not require(section, ds, "tensor_active"):
        return section, None
    tensor = ds.frames["tensor_active"]
    keys = [*GPU, "timestamp"]
    # The label columns stay categorical, one dtype across the frames (`share_categories`):
    # the joins below compare integer codes, not 2 million Python strings a frame.
    frame = tensor[[*keys, "value"]].rename(columns={"value": "tensor"})
    util = ds.frame("gpu_utilization")
    if util is None:
        section.notes.append(f"gpu_utilization: {ds.problems.get('gpu_utilization')}")
        frame["utilization"] = np.nan
    else:
        util = util.rename(columns={"value": "utilization"})
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
    section.tables["idle_allocated_gpus"] = ranked(idle_gpus, ["idle_gpu_hours"])
    return section, owned


def fabric(ds: Dataset) -> Section:
    """InfiniBand errors per type, flaps, degraded rate, saturated counters; NVLink errors."""
    section = Section("Fabric")
    hours = ds.window.seconds / 3600
    errors = frame_values(ds, "ib_errors", (*PORT, "error"), "errors")
    if errors is None:
        section.notes.append(f"ib_errors: {ds.problems.get('ib_errors')}")
    else:
        errors["errors_per_hour"] = errors["errors"] / hours
        errors["rank_in_type"] = (
            errors.groupby("error")["errors_per_hour"]
            .rank(ascending=False, method="min")
            .astype("int64")
        )
        section.tables["ib_port_errors"] = ranked(errors, ["errors_per_hour"])
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
        section.tables[table] = ranked(out, [column])
    nvlink = frame_values(ds, "nvlink_errors", (*GPU, "link", "error"), "errors")
    if nvlink is None:
        section.notes.append(f"nvlink_errors: {ds.problems.get('nvlink_errors')}")
    else:
        nvlink["errors_per_hour"] = nvlink["errors"] / hours
        section.tables["nvlink_errors"] = ranked(nvlink, ["errors_per_hour"])
    return section


def nvlink_domains(ds: Dataset, owned: pd.DataFrame | None, section: Section) -> None:
    """NVLink domains (NVL72) into `section`: per domain its GPUs, nodes, GPUs whose fabric
    was degraded or unregistered and for how long, and the training jobs holding GPUs in
    it; and the jobs that span a domain with such a GPU (they all stall when one tray's
    fabric fails). Nothing without NVLink-fabric GPUs in the window."""
    gpus = frame_values(ds, "domain_gpus", (*GPU, *DOMAIN), "on_fabric")
    if gpus is None:
        section.notes.append(f"domain_gpus: {ds.problems.get('domain_gpus')}")
        return
    if gpus.empty:
        return
    unhealthy = frame_values(ds, "fabric_unhealthy_seconds", GPU, "unhealthy_s")
    if unhealthy is None:
        section.notes.append(
            f"fabric_unhealthy_seconds: {ds.problems.get('fabric_unhealthy_seconds')}"
        )
        unhealthy = pd.DataFrame(
            {k: pd.Series(dtype="string") for k in GPU} | {"unhealthy_s": pd.Series(dtype=float)}
        )
    gpus = gpus.merge(unhealthy, on=list(GPU), how="left")
    gpus["unhealthy_s"] = gpus["unhealthy_s"].fillna(0.0)
    domains = gpus.groupby(list(DOMAIN), observed=True, as_index=False).agg(
        gpus=("uuid", "nunique"),
        nodes=("node", "nunique"),
        unhealthy_gpus=("unhealthy_s", lambda s: int((s > 0).sum())),
        unhealthy_gpu_minutes=("unhealthy_s", lambda s: float(s.sum()) / 60),
    )
    jobs = _domain_jobs(ds, owned, gpus)
    names = jobs.assign(job=jobs["namespace"] + "/" + jobs["training_job"])
    listed = names.groupby(list(DOMAIN), observed=True)["job"].agg(lambda j: ", ".join(sorted(j)))
    domains = domains.merge(listed.rename("jobs").reset_index(), on=list(DOMAIN), how="left")
    domains["jobs"] = domains["jobs"].fillna("")
    section.tables["nvlink_domains"] = ranked(domains, ["unhealthy_gpus", "unhealthy_gpu_minutes"])
    degraded = domains[domains["unhealthy_gpus"] > 0][list(DOMAIN)]
    spanning = jobs.merge(degraded, on=list(DOMAIN), how="inner")
    section.tables["jobs_in_degraded_domains"] = ranked(spanning, ["gpus_in_domain"])


def _domain_jobs(ds: Dataset, owned: pd.DataFrame | None, gpus: pd.DataFrame) -> pd.DataFrame:
    """Training jobs (kube_pod_labels' job, else the pod) with how many GPUs each holds in
    each domain: namespace, training_job, cluster_uuid, clique_id, gpus_in_domain."""
    columns = ["namespace", "training_job", *DOMAIN, "gpus_in_domain"]
    if owned is None or owned.empty:
        return pd.DataFrame({c: pd.Series(dtype="string") for c in columns[:-1]}).assign(
            gpus_in_domain=pd.Series(dtype="int64")
        )
    pods = owned[["uuid", "namespace", "pod"]].drop_duplicates().astype("string")
    pod_jobs = ds.frame("pod_jobs")
    if pod_jobs is not None and not pod_jobs.empty:
        named = pod_jobs[["namespace", "pod", "training_job"]].drop_duplicates(["namespace", "pod"])
        pods = pods.merge(named.astype("string"), on=["namespace", "pod"], how="left")
        pods["training_job"] = pods["training_job"].fillna(pods["pod"])
    else:
        pods = pods.assign(training_job=pods["pod"])
    held = pods.merge(gpus[["uuid", *DOMAIN]], on="uuid", how="inner")
    return (
        held.groupby(["namespace", "training_job", *DOMAIN], observed=True)["uuid"]
        .nunique()
        .rename("gpus_in_domain")
        .reset_index()[columns]
    )


def flaps(ds: Dataset, section: Section, errors: pd.DataFrame | None) -> pd.DataFrame:
    """Ports that went down: `link_downed` growth, or the exporter's state changes / 2.

    Either source alone is enough: a history without the exporter's state-change counter
    (or a flap shorter than a scrape, which it cannot see) still shows `link_downed`.
    """
    parts = []
    for name, column in (("ib_state_changes", "state_changes"), ("ib_down_seconds", "down_s")):
        values = frame_values(ds, name, PORT, column)
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
    return ranked(
        table[[*PORT, "state_changes", "link_downed", "flaps", "down_minutes"]],
        ["flaps", "down_minutes"],
    )


def reliability(ds: Dataset) -> Section:
    """Xid events by code and GPU, ECC and row-remap growth, GPUs that fell off the bus."""
    section = Section("Reliability")
    xid = frame_values(ds, "xid_events", (*GPU, "xid"), "events")
    if xid is None:
        section.notes.append(f"xid_events: {ds.problems.get('xid_events')}")
    else:
        section.tables["xid_events"] = ranked(xid, ["events"])
        section.tables["xid_by_code"] = ranked(
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
        values = frame_values(ds, name, keys, column)
        if values is None:
            section.notes.append(f"{name}: {ds.problems.get(name)}")
        else:
            section.tables[name] = ranked(values, [column])
    lost = frame_values(ds, "gpu_lost_samples", GPU, "samples")
    reference = ds.frame("gpu_samples_max")
    if lost is None or reference is None or reference.empty:
        require(section, ds, "gpu_lost_samples", "gpu_samples_max")
    else:
        # A healthy GPU has the fleet's full sample count; the shortfall is time missing.
        full = float(reference["value"].max())  # one row per node batch
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
        section.tables["gpus_lost"] = ranked(lost, ["minutes_missing"])
    count = frame_values(ds, "gpu_count_min", ("node",), "min_visible")
    expected = frame_values(ds, "gpu_expected", ("node",), "expected")
    if count is not None and expected is not None:
        nodes = count.merge(expected, on="node")
        short = nodes[nodes["min_visible"] < nodes["expected"]]
        section.tables["nodes_missing_gpus"] = short.sort_values("node", ignore_index=True)
    else:
        require(section, ds, "gpu_count_min", "gpu_expected")
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
        section.tables["node_tainted_time"] = ranked(
            windows.groupby("node")
            .agg(windows=("start", "size"), minutes=("minutes", "sum"))
            .reset_index(),
            ["minutes"],
        )
    summary: list[tuple[str, float]] = []
    ops = frame_values(ds, "taint_operations", ("op", "result"), "count")
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
    summary += _repairs(ds, section)
    if summary:
        section.tables["tainter_summary"] = pd.DataFrame(summary, columns=["what", "value"])
    return section


def _repairs(ds: Dataset, section: Section) -> list[tuple[str, float]]:
    """Repairs after the drain (`--repair.*`): counts by kind and result and the most in
    flight for the summary; tables of repairs that did not hold and of time from taken out
    to back in service per reason. Nothing when the tainter repaired nothing."""
    summary: list[tuple[str, float]] = []
    repairs = frame_values(ds, "repairs", ("repair", "result"), "count")
    if repairs is not None:
        summary += [
            (f"repair {r.repair} ({r.result})", float(r.count)) for r in repairs.itertuples()
        ]
    flying = ds.frame("repairs_in_flight")
    if flying is not None and len(flying):
        summary.append(("max repairs in flight", float(flying["value"].max())))
    not_held = frame_values(ds, "repairs_not_held", ("reason", "repair"), "repairs")
    if not_held is not None and len(not_held):
        section.tables["repairs_not_held"] = ranked(not_held, ["repairs"])
    seconds = frame_values(ds, "repair_back_seconds", ("reason",), "seconds")
    count = frame_values(ds, "repair_back_count", ("reason",), "repairs")
    if seconds is not None and count is not None and len(count):
        back = count.merge(seconds, on="reason", how="left")
        back = back[back["repairs"] > 0]
        back["mean_minutes"] = back["seconds"] / back["repairs"] / 60
        section.tables["repair_back_in_service"] = ranked(
            back[["reason", "repairs", "mean_minutes"]], ["repairs"]
        )
    return summary


SECTION_QUERIES: dict[str, tuple[str, ...]] = {
    "Thermal": (
        "temp_p99",
        "temp_max",
        "temp_median",
        "power_median",
        "temp_above_seconds",
        "thermal_slowdown_seconds",
    ),
    "Activity": ("tensor_active", "gpu_utilization", "allocation"),
    "Training jobs": (
        "tensor_active",
        "gpu_utilization",
        "allocation",
        "pod_jobs",
        "sm_clock",
        "clock_slowed",
    ),
    "Fabric": (
        "ib_errors",
        "ib_state_changes",
        "ib_down_seconds",
        "ib_degraded_seconds",
        "ib_saturated_seconds",
        "nvlink_errors",
        "domain_gpus",
        "fabric_unhealthy_seconds",
    ),
    "Reliability": (
        "xid_events",
        "ecc_errors",
        "remapped_rows",
        "remap_failed",
        "gpu_lost_samples",
        "gpu_samples_max",
        "gpu_count_min",
        "gpu_expected",
    ),
    "Remediation": (
        "taint_alerts",
        "taint_operations",
        "tainted_nodes",
        "breaker_open",
        "repairs",
        "repairs_not_held",
        "repair_back_seconds",
        "repair_back_count",
        "repairs_in_flight",
    ),
    CHECKPOINTS: (
        "job_checkpoint_saves",
        "job_checkpoint_saving_seconds",
        "job_checkpoint_peak_bytes",
        "node_checkpoint_write_while_saving",
        "mount_hung_seconds",
        "mount_read_only_seconds",
        "mount_hours_to_full",
        "mount_available_ratio",
    ),
    GOODPUT: tuple(q.name for q in GOODPUT_QUERIES),
}
"""The queries each section reads: a part of one the store did not return is named in the
section, so a finding table that looks clean is not taken for a healthy fleet."""


def missing_data(ds: Dataset, section: Section) -> None:
    """Name in `section` every part of its queries the store failed or answered partially."""
    for name in SECTION_QUERIES[section.title]:
        section.missing += [f"{name}: {part}" for part in ds.missing.get(name, ())]


def analyse(ds: Dataset, policy: Policy | None = None) -> Report:
    """Every section plus the action list; thresholds from the rules config by default.

    The window's `threshold_celsius` (the report's flag, which defaults to the rules
    config's) is the overheat policy's default temperature; its `overheat_policy` the
    models judged by their own.
    """
    p = policy or shipped_policy()
    activity_section, owned = activity(ds, p)
    fabric_section = fabric(ds)
    nvlink_domains(ds, owned, fabric_section)
    sections = [
        thermal(ds),
        activity_section,
        training_jobs(ds, owned, fabric_section, p),
        fabric_section,
        reliability(ds),
        checkpoints(ds),
        goodput(ds),
        remediation(ds),
    ]
    for section in sections:
        missing_data(ds, section)
    return Report(
        dataset=ds,
        actions=actions({s.title: s for s in sections}, overheat_words(ds.window)),
        sections=sections,
    )
