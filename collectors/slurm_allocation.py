"""Slurm job attribution: which Slurm job holds which GPU, from the mapping directory.

`fleetwatch slurm prolog` and `epilog` keep one file per job in `--slurm.mapping-dir`; a fleet
whose prolog writes dcgm-exporter's HPC job-mapping files (one per GPU index, `GPU.GI` for a
MIG instance, holding job IDs) can point `--slurm.mapping-dir` at that directory instead, or keep
both in one (`fleetwatch.slurm.mapping`). Each (job, GPU) is a series of the allocation
family pods use, `namespace="slurm"` and `pod=<job ID>`, joined to the GPU by `gpu`/`uuid`
as PodResources allocations are; `fleetwatch_slurm_job_info` adds the job's user,
partition and node count, `fleetwatch_slurm_job_restarts` how many times Slurm restarted it
(`SLURM_RESTART_COUNT`: a requeue keeps the job ID, so the interruption rules see the count
rise; a mapping written without one reads as 0, noted once in the log). A mapping whose
job ended without an epilog (the node crashed) expires and is counted, not exported; a
malformed file is logged once, naming the file and what is wrong, counted, and the rest of
the directory is still read. No directory: no series
and no error (a node that runs no Slurm jobs, or none yet).

The directory is a few small files on tmpfs, read at each collection.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fleetwatch.catalog import collected_by
from fleetwatch.catalog.allocation import GPU_ALLOCATION_INFO
from fleetwatch.catalog.slurm import (
    SLURM_JOB_INFO,
    SLURM_JOB_RESTARTS,
    SLURM_MAPPING_FILES,
    SLURM_NAMESPACE,
)
from fleetwatch.collectors.base import CollectorContext, CollectorSpec
from fleetwatch.collectors.families import FamilyBuilder, SeriesFamily
from fleetwatch.collectors.podresources import device_labels
from fleetwatch.collectors.sources.nvml import NvmlSource
from fleetwatch.flags import duration_setting, setting
from fleetwatch.slurm import mapping

log = logging.getLogger(__name__)

SPECS: Final = collected_by("slurmjobs")


class SlurmJobsCollector:
    """Reads the mapping directory at each collection."""

    def __init__(self, *, directory: Path, source: NvmlSource, max_age: float | None) -> None:
        self._directory = directory
        self._source = source
        self._max_age = max_age
        self._reported: frozenset[tuple[str, str]] = frozenset()
        self._no_restarts: frozenset[str] = frozenset()
        self._dcgm_live: frozenset[tuple[str, int]] = frozenset()  # not expired by a clock step

    def collect(self) -> list[SeriesFamily]:
        if not self._directory.is_dir():
            return []
        reading = mapping.read(self._directory, max_age=self._max_age, seen_live=self._dcgm_live)
        self._dcgm_live = reading.dcgm_live
        self._report(reading.malformed)
        labels = device_labels(self._source)
        builder = FamilyBuilder(SPECS)
        for job in reading.jobs:
            for device in job.gpus:
                gpu, uuid = labels(device)
                builder.add(
                    GPU_ALLOCATION_INFO.name, (gpu, uuid, SLURM_NAMESPACE, job.job_id, "", ""), 1
                )
            if job.source == "fleetwatch":
                nodes = str(job.nodes) if job.nodes else ""
                builder.add(SLURM_JOB_INFO.name, (job.job_id, job.user, job.partition, nodes), 1)
                builder.add(SLURM_JOB_RESTARTS.name, (job.job_id,), job.restarts or 0)
        self._note_no_restarts(reading.jobs)
        counts = {
            "live": len(reading.jobs),
            "expired": reading.expired,
            "malformed": len(reading.malformed),
        }
        for state, count in counts.items():
            builder.add(SLURM_MAPPING_FILES.name, (state,), count)
        return builder.families()

    def _report(self, malformed: tuple[tuple[str, str], ...]) -> None:
        """Log each malformed file once while it stays malformed."""
        now = frozenset(malformed)
        for name, problem in sorted(now - self._reported):
            log.warning(
                "Slurm job mapping %s/%s is malformed: %s (left out)",
                self._directory,
                name,
                problem,
                extra={"file": name, "problem": problem},
            )
        self._reported = now

    def _note_no_restarts(self, jobs: tuple[mapping.JobGpus, ...]) -> None:
        """Note once per job a mapping without a restart count (an older prolog wrote it):
        read as 0, so a requeue of that run is not seen by the restart count."""
        now = frozenset(j.job_id for j in jobs if j.source == "fleetwatch" and j.restarts is None)
        for job_id in sorted(now - self._no_restarts):
            log.info(
                "Slurm job mapping of job %s has no restart count (written by an older "
                "prolog): read as 0",
                job_id,
                extra={"job_id": job_id},
            )
        self._no_restarts = now

    def close(self) -> None:
        """Nothing to release: the directory is read afresh each time."""


@dataclass(frozen=True, kw_only=True)
class SlurmJobsSettings:
    """`--slurm.mapping-dir` and `--collector.slurmjobs.*` flags."""

    mapping_dir: Path = setting(
        mapping.DEFAULT_DIR,
        parse=Path,
        metavar="DIR",
        flag="slurm.mapping-dir",
        deprecated=("mapping-dir",),
        help="the Slurm job-to-GPU mapping directory (fleetwatch's prolog, or dcgm-exporter's "
        "HPC job-mapping format); absent: no Slurm series",
    )
    max_age: float | None = duration_setting(
        None,
        minimum=1.0,
        maximum=365 * 86400.0,
        help="a mapping older than this has expired (unset: only mappings from an earlier "
        "boot expire); set it above the longest job time limit",
    )


def _create(context: CollectorContext, settings: SlurmJobsSettings) -> SlurmJobsCollector:
    return SlurmJobsCollector(
        directory=settings.mapping_dir, source=context.nvml_source, max_age=settings.max_age
    )


SPEC = CollectorSpec(
    name="slurmjobs",
    help="which Slurm job holds which GPU, from the prolog's mapping directory",
    settings=SlurmJobsSettings,
    create=_create,
    metrics=SPECS,
)
