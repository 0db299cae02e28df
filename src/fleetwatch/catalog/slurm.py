"""Slurm job attribution: which Slurm job holds which GPU (the `slurmjobs` collector).

A Slurm job's GPUs are exported on the allocation series Kubernetes pods use
(`fleetwatch_gpu_allocation_info`), with `namespace` set to `SLURM_NAMESPACE` and `pod` to
the job ID, so the training-job identity, rules, dashboards and report treat a Slurm job
(the same job ID on every node it spans) as one training job with no Slurm-specific join.
The families here add what only Slurm knows.

Part of the metric catalog (`fleetwatch.catalog`): each family is declared here once and
imported by name wherever it is emitted or read."""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.spec import Families

SLURM_NAMESPACE: Final = "slurm"
"""The allocation series' `namespace` for a Slurm job (its `pod` is the job ID)."""

FAMILIES: Final = Families(collectors=("slurmjobs",))
"""Every family of this module, in declaration order (the order docs/metrics.md lists them)."""

SLURM_JOB_INFO: Final = FAMILIES.declare(
    "fleetwatch_slurm_job_info",
    "gauge",
    "A Slurm job holding GPUs on this node (value 1): its user, partition and node count.",
    ("job_id", "user", "partition", "nodes"),
    unit="info (1)",
    source=(
        "the mapping directory (`--slurm.mapping-dir`) that `fleetwatch slurm prolog` writes; "
        "jobs known only from dcgm-exporter's mapping format have no user or partition "
        "and are not listed here"
    ),
    series="jobs on the node",
    label_values={"nodes": "the job's node count (`SLURM_JOB_NUM_NODES`)"},
)
SLURM_JOB_RESTARTS: Final = FAMILIES.declare(
    "fleetwatch_slurm_job_restarts",
    "gauge",
    "How many times Slurm restarted the job (requeued it, or restarted it after a node "
    "failure) before the run that holds GPUs on this node: its SLURM_RESTART_COUNT.",
    ("job_id",),
    unit="restarts",
    source=(
        "the mapping directory: `SLURM_RESTART_COUNT` as `fleetwatch slurm prolog` saw it "
        "(absent on a job's first run: 0); a mapping written without a restart count (an "
        "older prolog) reads as 0, noted once in the log; dcgm-exporter's mapping format "
        "has none and is not listed here"
    ),
    series="jobs on the node",
)
SLURM_MAPPING_FILES: Final = FAMILIES.declare(
    "fleetwatch_slurm_mapping_files",
    "gauge",
    "Files in the Slurm job mapping directory at the last read, by state.",
    ("state",),
    unit="files",
    source=(
        "the mapping directory: `live` mappings, `expired` ones (written before this boot "
        "or older than `--collector.slurmjobs.max-age`: the job ended without an epilog) "
        "and `malformed` files (each logged with what is wrong)"
    ),
    series="3",
    label_values={"state": "`live`, `expired`, `malformed`"},
)
