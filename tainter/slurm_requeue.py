"""Removal from the run on Slurm: requeue (or cancel) the jobs of a node fleetwatch drained.

A drain starts no new job on the node; the job already there keeps running on the bad GPU.
For the reasons an operator lists (`--evict.reasons`, none by default: opt in), after each
sync of a node that fleetwatch drained for such a reason, the jobs running there
(`squeue -h -w NODE -t RUNNING -o %i`) are requeued (`scontrol requeue JOBID`, the default
of `--slurm.remove-jobs`) or cancelled (`scancel JOBID`, `--slurm.remove-jobs=cancel`).
A multi-node job is one job: removing it takes it off all its nodes at once, so it is
removed once however many of its nodes are drained (one node of a job at a time), and
remembered for `REMEMBER_SECONDS` so the next syncs do not requeue it again while Slurm
reschedules it. Only the leader acts; `--dry-run` says what it would do. Every command goes
through `GuardedScontrol` (a deadline, backoff after failures). Each outcome is logged and
counted in `fleetwatch_tainter_evictions_total{reason,result}` (evicted, deferred_same_job,
dry_run, error).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from fleetwatch.tainter.election import Leadership
from fleetwatch.tainter.kube_objects import ApiError, NodeView
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import KEY_PREFIX
from fleetwatch.tainter.settings import SlurmAccess
from fleetwatch.tainter.slurm_backend import GuardedScontrol
from fleetwatch.tainter.writes import our_taints

log = logging.getLogger(__name__)

REMEMBER_SECONDS: Final = 600.0
"""How long a removed job is not removed again (Slurm requeues it to PENDING at once)."""

# A running job as `squeue -o %i` prints it: a job ID, an array task (`1234_7`) or a
# heterogeneous job's component (`1234+0`). Anything else is not passed to scontrol/scancel.
JOB_ID: Final = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10}|\+[0-9]{1,5})?")


def job_ids(text: str) -> tuple[list[str], list[str]]:
    """The job IDs of `squeue -h -o %i` output, in order and once each, and the lines that
    are none (each quoted by an excerpt): a line that is not a job ID (a warning Slurm
    printed, an option-like `--user=root`) never reaches `scontrol requeue` or `scancel`."""
    jobs: dict[str, None] = {}
    bad: list[str] = []
    for line in text.splitlines():
        job = line.strip()
        if JOB_ID.fullmatch(job):
            jobs[job] = None
        elif job:
            bad.append(repr(job[:60]))
    return list(jobs), bad


def sibling(command: str, name: str) -> str:
    """`name` (squeue, scancel) beside `command` when that is a path, else on PATH."""
    return str(Path(command).with_name(name)) if "/" in command else name


class JobRemover:
    """The after-sync step that removes a drained node's jobs from the run (module doc)."""

    def __init__(
        self,
        *,
        access: SlurmAccess,
        reasons: frozenset[str],
        leadership: Leadership,
        metrics: TainterMetrics,
        dry_run: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        def guarded(command: str) -> GuardedScontrol:
            return GuardedScontrol(command=command, conf=access.conf, timeout=access.timeout)

        self._scontrol = guarded(access.scontrol)
        self._squeue = guarded(sibling(access.scontrol, "squeue"))
        self._scancel = guarded(sibling(access.scontrol, "scancel"))
        self._cancel = access.remove_jobs == "cancel"
        self._reasons = reasons
        self._leadership = leadership
        self._metrics = metrics
        self._dry_run = dry_run
        self._clock = clock
        self._removed: dict[str, float] = {}  # job id -> when removed

    async def node_synced(self, node: NodeView) -> None:
        """Remove the running jobs of `node` if fleetwatch drained it for a listed reason;
        failures are logged and counted, never raised."""
        held = [k.removeprefix(KEY_PREFIX) for k in our_taints(node)]
        listed = sorted(r for r in held if r in self._reasons)
        if not listed or not self._leadership.is_leader:
            return
        reason = listed[0]
        now = self._clock()
        self._removed = {j: t for j, t in self._removed.items() if now - t < REMEMBER_SECONDS}
        try:
            out = await self._squeue.run("-h", "-w", node.name, "-t", "RUNNING", "-o", "%i")
        except ApiError as exc:
            self._metrics.evictions.labels(reason=reason, result="error").inc()
            log.warning("cannot list the node's jobs", extra={"node": node.name, "error": str(exc)})
            return
        jobs, bad = job_ids(out)
        if bad:
            self._metrics.evictions.labels(reason=reason, result="error").inc()
            log.warning(
                "squeue printed lines that are no job ID; those are left alone",
                extra={"node": node.name, "lines": len(bad), "first": bad[0]},
            )
        for job in jobs:
            await self._remove(job, node=node.name, reason=reason, now=now)

    async def _remove(self, job: str, *, node: str, reason: str, now: float) -> None:
        what = "cancel" if self._cancel else "requeue"
        if job in self._removed:
            self._metrics.evictions.labels(reason=reason, result="deferred_same_job").inc()
            return
        if self._dry_run:
            self._metrics.evictions.labels(reason=reason, result="dry_run").inc()
            log.warning(f"dry run: would {what} job", extra={"node": node, "job": job})
            self._removed[job] = now
            return
        try:
            if self._cancel:
                await self._scancel.run(job)
            else:
                await self._scontrol.run("requeue", job)
        except ApiError as exc:
            self._metrics.evictions.labels(reason=reason, result="error").inc()
            log.warning(f"cannot {what} job", extra={"node": node, "job": job, "error": str(exc)})
            return
        self._removed[job] = now
        self._metrics.evictions.labels(reason=reason, result="evicted").inc()
        log.warning(
            f"job removed from the run ({what})",
            extra={"node": node, "job": job, "reason": reason},
        )
