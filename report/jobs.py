"""Training-job findings: the GPU a job waits for, GPUs idle in a job, job slowdowns.

A job's GPUs are its pods' allocated GPUs, named as the rules name them (`pod_jobs`:
kube_pod_labels, else the pod); what a straggler, an idle GPU in a job and a slowdown are
is the rules' definition (`fleetwatch.rules.definitions`), evaluated here per `--bucket`
on the bucketed frames.
"""

from __future__ import annotations

import pandas as pd

from fleetwatch.report.dataset import Dataset
from fleetwatch.report.query import GPU
from fleetwatch.report.section import Section, ranked
from fleetwatch.report.thresholds import Policy
from fleetwatch.rules.definitions import (
    is_idle_in_job,
    is_job_slowdown,
    is_straggler_candidate,
    is_training,
    straggler_gate,
)


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
    # The GPU keys stay categorical (one dtype across the frames): joined on codes.
    return frame[[*keys, "value"]].rename(columns={"value": column})


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
        section.caveats.append(
            f"pod_jobs: {why}; each pod counts as its own training job (kube-state-metrics "
            "must export kube_pod_labels with the job label keys allowed in "
            "--metric-labels-allowlist)"
        )
        data = owned.assign(training_job=owned["pod"])
    else:
        # Joined on the pods' categorical codes (one dtype with the allocations'); the job
        # names become strings, as a pod without a job label is named after the pod.
        data = owned.merge(
            jobs[[*pod_keys, "training_job"]].drop_duplicates(pod_keys),
            on=pod_keys,
            how="left",
        )
        pods = data["pod"].astype("string")
        data["training_job"] = data["training_job"].astype("string").fillna(pods)
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
    median by `straggler_clock_fraction`, or a straggler clock-event reason holding the
    clocks more than `clock_event_fraction` of the bucket, in a job whose median was busy
    within the preceding `job_slowdown_baseline` (a straggler drags the median down) or
    that had a straggler in the bucket before (the alert keeps firing while one persists,
    past the baseline); idle
    in job = activity below `idle_in_job_fraction` of the job median, or below
    `tensor_idle_ratio` whatever the job does (those also get a reclaim action);
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
    median = data["job_median_tensor"]
    data["busy"] = (data["job_gpus"] >= 2) & is_training(p, job_median_tensor=median)
    data["candidate"] = is_straggler_candidate(
        p,
        tensor=data["tensor"],
        job_median_tensor=median,
        sm_clock=data["sm_clock_mhz"],
        job_median_sm_clock=data["job_median_sm_clock_mhz"],
        clock_slowed=data["slowed"],
        job_gpus=data["job_gpus"],
    )
    gate = _straggler_gate(p, data, group, ds.window.bucket)
    data = data.merge(gate.reset_index(), on=group, how="left")
    data["straggling"] = data["candidate"] & data["straggler_gate"]
    data["idle_in_job"] = is_idle_in_job(p, tensor=data["tensor"], job_median_tensor=median)
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
    section.tables["stragglers"] = ranked(
        stragglers.assign(
            clock_deficit_mhz=stragglers["job_median_sm_clock_mhz"] - stragglers["sm_clock_mhz"]
        ),
        ["straggling_hours", "clock_deficit_mhz"],
    )
    idle = per_gpu[per_gpu["idle_hours"] > 0]
    section.tables["idle_in_job"] = ranked(
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
    section.tables["jobs"] = ranked(
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


def _straggler_gate(
    p: Policy, data: pd.DataFrame, group: list[str], bucket_seconds: float
) -> pd.Series:
    """Per job and bucket, whether the job counts as training for `straggler`: its median
    busy within the preceding `job_slowdown_baseline` (this bucket included), or a straggler
    in the bucket before that passed the gate, as GPUStraggler keeps firing while one
    persists (`straggler_gate`, the rule's definition)."""
    buckets = max(1, round(p.job_slowdown_baseline_seconds / bucket_seconds))
    per_bucket = (
        data.groupby(group, observed=True)
        .agg(median=("job_median_tensor", "first"), straggled=("candidate", "any"))
        .sort_index()
    )
    gates = [
        pd.Series(
            straggler_gate(
                p,
                job_recent_max_tensor=job["median"].rolling(buckets, min_periods=1).max().tolist(),
                straggled=job["straggled"].tolist(),
            ),
            index=job.index,
            dtype=bool,
        )
        for _, job in per_bucket.groupby(level=["namespace", "training_job"], observed=True)
    ]
    return pd.concat(gates).rename("straggler_gate")


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
        slow = is_job_slowdown(p, job_median_tensor=group["median_tensor"], baseline=baseline)
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
    return ranked(pd.DataFrame(rows, columns=columns), ["drop"])


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
