"""Which Slurm job holds which GPU: the mapping directory the prolog writes, the epilog
clears and the exporter reads.

Two formats live side by side in one directory:

- fleetwatch's own, one file per job, `job-<JOBID>.json`, written by `fleetwatch slurm
  prolog` (atomically: a temporary file renamed into place) and removed by `fleetwatch slurm
  epilog`: the job's ID, user, partition, node count, how many times Slurm restarted it
  (`SLURM_RESTART_COUNT`: a requeue keeps the job ID and counts up), its GPUs on this node
  (NVML indices or UUIDs, as Slurm gave them) and the boot it was written in (`boot_id`).
  A file without `restarts` (written by an older prolog) reads as restarts unknown.
- dcgm-exporter's HPC job mapping (`--hpc-job-mapping-dir`), one file per GPU index, or
  `GPU.GI` for a MIG instance, whose lines are the IDs of the jobs using it: a fleet whose
  prolog already writes it needs no new one. It carries no user, partition or node count.

A mapping whose job ended without an epilog (the node crashed) expires: a job file from an
earlier boot (`boot_id`), or a dcgm-exporter file last written before this boot, is left
out; with `max_age` (seconds) set, so is any mapping older than that. "Before this boot" is
the file's modification time against the wall clock less the uptime, which a step of the wall
clock moves: a reader passes back the dcgm-exporter files it read as live (`Reading.dcgm_live`),
which a later step forward then cannot expire (the reader lives within one boot).

This module is on every job's start and end path (the prolog and epilog import it): it
imports only the standard library.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

DEFAULT_DIR: Final = Path("/run/fleetwatch/slurm-jobs")
ENV_DIR: Final = "FLEETWATCH_SLURM_MAPPING_DIR"
FORMAT_VERSION: Final = 1
BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")
GPU_VARIABLES: Final = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES")
"""Where the prolog finds the job's GPUs, first present wins: the prolog sees
SLURM_JOB_GPUS; a task prolog or a step sees SLURM_STEP_GPUS and CUDA_VISIBLE_DEVICES."""

_JOB_ID: Final = re.compile(r"[0-9]{1,20}")
_JOB_FILE: Final = re.compile(r"job-([0-9]{1,20})\.json")
_DCGM_FILE: Final = re.compile(r"([0-9]{1,4})(?:\.([0-9]{1,4}))?")
# An NVML index, or a GPU/MIG UUID (GPU-8c0a..., MIG-GPU-.../1/0, MIG-4b2e...).
_GPU_ID: Final = re.compile(r"[0-9]{1,4}|(?:GPU|MIG)-[0-9A-Za-z./-]{1,120}")
_NAME: Final = re.compile(r"[^\x00-\x1f\x7f]{0,256}")


class MappingError(ValueError):
    """Input the mapping cannot hold or a file it cannot read; the message names which."""


@dataclass(frozen=True)
class JobGpus:
    """One job's GPUs on this node, as a mapping file records them."""

    job_id: str
    gpus: tuple[str, ...]  # NVML indices ("0") or UUIDs ("GPU-...", "MIG-...")
    user: str = ""  # empty where the format does not record it (dcgm-exporter's)
    partition: str = ""
    nodes: int = 0  # the job's node count; 0 when unknown
    restarts: int | None = None  # SLURM_RESTART_COUNT; None when the mapping has none
    mig_instance: Mapping[str, str] | None = None  # dcgm `GPU.GI` files: gpu -> instance
    source: str = "fleetwatch"  # or "dcgm"


def from_environment(environ: Mapping[str, str]) -> JobGpus:
    """The job the prolog runs for, from Slurm's variables; MappingError naming the variable
    that is missing or wrong."""
    job_id = environ.get("SLURM_JOB_ID", "")
    if not _JOB_ID.fullmatch(job_id):
        raise MappingError(f"SLURM_JOB_ID={job_id!r} is not a Slurm job ID (is this a prolog?)")
    gpus: tuple[str, ...] = ()
    for variable in GPU_VARIABLES:
        value = environ.get(variable, "").strip()
        if value:
            gpus = parse_gpus(value, what=variable)
            break
    for variable in ("SLURM_JOB_USER", "SLURM_JOB_PARTITION"):
        if not _NAME.fullmatch(environ.get(variable, "")):
            raise MappingError(f"{variable} holds control characters or is over 256 long")
    nodes_text = environ.get("SLURM_JOB_NUM_NODES", "0") or "0"
    if not nodes_text.isdigit():
        raise MappingError(f"SLURM_JOB_NUM_NODES={nodes_text!r} is not a count")
    # Slurm sets SLURM_RESTART_COUNT once the job has been restarted: absent is the first run.
    restarts_text = environ.get("SLURM_RESTART_COUNT", "0") or "0"
    if not restarts_text.isdigit():
        raise MappingError(f"SLURM_RESTART_COUNT={restarts_text!r} is not a count")
    return JobGpus(
        job_id=job_id,
        gpus=gpus,
        user=environ.get("SLURM_JOB_USER", ""),
        partition=environ.get("SLURM_JOB_PARTITION", ""),
        nodes=int(nodes_text),
        restarts=int(restarts_text),
    )


def parse_gpus(text: str, *, what: str) -> tuple[str, ...]:
    """`0,1` or `GPU-...,GPU-...` as a tuple; MappingError naming `what` on anything else
    (`NoDevFiles`, a range, an empty item)."""
    items = tuple(item.strip() for item in text.split(","))
    bad = [item for item in items if not _GPU_ID.fullmatch(item)]
    if bad:
        raise MappingError(f"{what}={text!r}: {bad[0]!r} is neither a GPU index nor a UUID")
    return items


def boot_id(path: Path = BOOT_ID_PATH) -> str:
    """This boot's ID (a new one at every boot), "" where the kernel has none."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def job_path(directory: Path, job_id: str) -> Path:
    """The file of `job_id` in `directory`."""
    if not _JOB_ID.fullmatch(job_id):
        raise MappingError(f"{job_id!r} is not a Slurm job ID")
    return directory / f"job-{job_id}.json"


def write(directory: Path, job: JobGpus, *, now: float | None = None) -> Path:
    """Record `job` (atomically: readers see the old file or the new one, never half).
    Creates `directory` when missing. Returns the file written."""
    directory.mkdir(parents=True, exist_ok=True)
    record = {
        "version": FORMAT_VERSION,
        "job_id": job.job_id,
        "user": job.user,
        "partition": job.partition,
        "nodes": job.nodes,
        "restarts": job.restarts,
        "gpus": list(job.gpus),
        "boot_id": boot_id(),
        "written": time.time() if now is None else now,
    }
    target = job_path(directory, job.job_id)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".job-", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(record, out)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def remove(directory: Path, job_id: str) -> bool:
    """Forget `job_id` (the epilog); False when there was nothing to forget."""
    try:
        job_path(directory, job_id).unlink()
    except FileNotFoundError:
        return False
    return True


@dataclass(frozen=True)
class Reading:
    """What one read of the directory found: the live jobs, the malformed files (name and
    what is wrong) and how many mappings expired."""

    jobs: tuple[JobGpus, ...]
    malformed: tuple[tuple[str, str], ...]
    expired: int
    dcgm_live: frozenset[tuple[str, int]] = frozenset()
    """The dcgm-exporter files read as live, by name and modification time (ns)."""


def read(
    directory: Path,
    *,
    max_age: float | None = None,
    now: float | None = None,
    boot: str | None = None,
    seen_live: Collection[tuple[str, int]] = (),
) -> Reading:
    """Every live mapping in `directory`, in both formats. A missing directory is an empty
    reading; a file that cannot be read or parsed is reported in `malformed` and the others
    are still read. Temporary and unrelated files are ignored. A dcgm-exporter file in
    `seen_live` (an earlier reading's `dcgm_live`, unchanged since) is never judged older
    than this boot."""
    now = time.time() if now is None else now
    boot = boot_id() if boot is None else boot
    booted_at = now - _uptime()
    jobs: list[JobGpus] = []
    malformed: list[tuple[str, str]] = []
    dcgm: dict[str, list[tuple[str, str | None]]] = {}  # job -> (gpu, mig instance)
    expired = 0
    dcgm_live: set[tuple[str, int]] = set()
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except FileNotFoundError:
        return Reading((), (), 0)
    except OSError as exc:
        return Reading((), ((str(directory), f"cannot list: {exc.strerror}"),), 0)
    for entry in entries:
        job_file, dcgm_file = _JOB_FILE.fullmatch(entry.name), _DCGM_FILE.fullmatch(entry.name)
        if not (job_file or dcgm_file):
            continue
        try:
            stat = entry.stat()
            text = Path(entry.path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            malformed.append((entry.name, f"cannot read: {exc}"))
            continue
        too_old = max_age is not None and now - stat.st_mtime > max_age
        if job_file:
            try:
                job, its_boot = _parse_job(text, job_file.group(1))
            except MappingError as exc:
                malformed.append((entry.name, str(exc)))
                continue
            if too_old or (boot and its_boot and its_boot != boot):
                expired += 1
                continue
            jobs.append(job)
        elif dcgm_file:
            mark = (entry.name, stat.st_mtime_ns)
            if too_old or (stat.st_mtime < booted_at and mark not in seen_live):
                expired += 1
                continue
            try:
                ids = _parse_dcgm(text)
            except MappingError as exc:
                malformed.append((entry.name, str(exc)))
                continue
            dcgm_live.add(mark)
            for job_id in ids:
                dcgm.setdefault(job_id, []).append((dcgm_file.group(1), dcgm_file.group(2)))
    for job_id, held in sorted(dcgm.items()):
        jobs.append(
            JobGpus(
                job_id=job_id,
                gpus=tuple(gpu for gpu, _ in held),
                mig_instance={gpu: gi for gpu, gi in held if gi is not None} or None,
                source="dcgm",
            )
        )
    return Reading(tuple(jobs), tuple(malformed), expired, frozenset(dcgm_live))


def _parse_job(text: str, job_id: str) -> tuple[JobGpus, str]:
    """One fleetwatch job file: the job and the boot it was written in."""
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise MappingError(f"not JSON: {exc!r}") from None
    if not isinstance(record, dict):
        raise MappingError("not a JSON object")
    if record.get("version") != FORMAT_VERSION:
        raise MappingError(f"version {repr(record.get('version'))[:80]}, not {FORMAT_VERSION}")
    if record.get("job_id") != job_id:
        raise MappingError(f"job_id {repr(record.get('job_id'))[:80]} in the file of job {job_id}")
    gpus = record.get("gpus")
    if not isinstance(gpus, list) or not all(
        isinstance(g, str) and _GPU_ID.fullmatch(g) for g in gpus
    ):
        raise MappingError(f"gpus {repr(gpus)[:80]} is not a list of GPU indices or UUIDs")
    strings = {key: record.get(key, "") for key in ("user", "partition", "boot_id")}
    for key, value in strings.items():
        if not isinstance(value, str) or not _NAME.fullmatch(value):
            raise MappingError(f"{key} {repr(value)[:80]} is not a short text")
    nodes = record.get("nodes", 0)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 0:
        raise MappingError(f"nodes {repr(nodes)[:80]} is not a count")
    restarts = record.get("restarts")
    if restarts is not None and (
        not isinstance(restarts, int) or isinstance(restarts, bool) or restarts < 0
    ):
        raise MappingError(f"restarts {repr(restarts)[:80]} is not a count")
    job = JobGpus(
        job_id=job_id,
        gpus=tuple(gpus),
        user=strings["user"],
        partition=strings["partition"],
        nodes=nodes,
        restarts=restarts,
    )
    return job, strings["boot_id"]


def _parse_dcgm(text: str) -> list[str]:
    """A dcgm-exporter mapping file: one job ID a line (blank lines ignored)."""
    ids = [line.strip() for line in text.splitlines() if line.strip()]
    bad = [item for item in ids if not _JOB_ID.fullmatch(item)]
    if bad:
        raise MappingError(f"line {bad[0][:80]!r} is not a Slurm job ID")
    return ids


def _uptime(path: Path = Path("/proc/uptime")) -> float:
    """Seconds since boot (infinite where unknown, so nothing expires by boot time)."""
    try:
        return float(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("inf")
