"""What the live interruption rules record about a simulated training job
(`fleetwatch.rules.interruptions`), written as recorded, for `fleetwatch.sim.goodput_history`.

The rules evaluate at the history's step: per job its busiest GPU's tensor activity, its
GPUs and its GPUs per node while it holds them, and one run of samples (one step, the
merge window at a step of a minute) per interruption it saw, by kind, with the nodes the
kind names. A restart shows as the scheduler's facts arrive: a container restarted the
step after the job dropped, a JobSet's pods recreated at the next attempt (or a Slurm job
back with its next restart count) the step after; an in-place restart when the job trains
again (the drop is known only then).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from fleetwatch.rules.interruptions import (
    JOB_GPUS_RECORD,
    JOB_INTERRUPTED_RECORD,
    JOB_INTERRUPTION_RECORD,
    JOB_NODE_GPUS_RECORD,
    JOB_TENSOR_MAX_RECORD,
    KIND_LABEL,
    NODE_INTERRUPTION_RECORD,
)

BUSY: Final = 0.6
"""The busiest GPU's tensor activity while the job trains (the history's GPUs are 0.6 + noise)."""
IDLE: Final = 0.002
"""... and while it holds its GPUs idle (a save, a restart in place)."""

BACK: Final = -1
"""A record seen when the job holds its GPUs again (a Slurm job back with its next count)."""
TRAINING: Final = -2
"""A record seen when the job trains again (an in-place restart: the drop is known then)."""
RESTART_RECORDS: Final[dict[str, tuple[tuple[str, int, bool], ...]]] = {
    "pods_recreated": (("container_restart", 1, True), ("jobset_restart", 2, False)),
    "container_restarted": (("container_restart", 1, True),),
    "slurm_restart": (("slurm_requeue", BACK, False),),
    "in_place": (("in_place", TRAINING, False),),
}
"""Each simulated restart kind's records: (record kind, steps after the drop it is seen, or
`BACK` or `TRAINING`; whether it names the job's nodes: a container restart names its pod's
node, a JobSet's or Slurm's restart none without a failed pod)."""

Series = tuple[str, str, str, np.ndarray]
"""(family, OpenMetrics type, label text, values per step; NaN: no sample)."""


@dataclass(frozen=True, kw_only=True)
class RecordedJob:
    """One simulated job as the rules see it: its name (`renamed` from step `cut` on),
    its state per step (2 training, 1 holding its GPUs idle, 0 not holding them), its nodes
    with where each reported (its exporter scraped), and its restarts (drop step, kind)."""

    namespace: str
    name: str
    renamed: str
    cut: int
    state: np.ndarray
    nodes: dict[str, np.ndarray]
    gpus_per_node: int
    restarts: Sequence[tuple[int, str]]


def _on(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask, values, np.nan)


def job_records(job: RecordedJob, *, since: int) -> list[Series]:
    """The job's records, from step `since` on (the rules loaded then)."""
    n = job.state.size
    loaded = np.arange(n) >= since
    held = job.state > 0
    out: list[Series] = []
    for first, last, name in ((0, job.cut, job.name), (job.cut, n, job.renamed)):
        part = loaded.copy()
        part[:first] = False
        part[last:] = False
        if not (part & held).any():
            continue
        labels = f'namespace="{job.namespace}",training_job="{name}"'
        gpus = np.zeros(n)
        for node, here in job.nodes.items():
            mine = held & here & part
            out.append(
                (
                    JOB_NODE_GPUS_RECORD,
                    "gauge",
                    f'node="{node}",{labels}',
                    _on(np.full(n, float(job.gpus_per_node)), mine),
                )
            )
            gpus += np.where(mine, job.gpus_per_node, 0)
        busiest = np.where(job.state == 2, BUSY, IDLE)
        out.append((JOB_GPUS_RECORD, "gauge", labels, _on(gpus, gpus > 0)))
        out.append((JOB_TENSOR_MAX_RECORD, "gauge", labels, _on(busiest, gpus > 0)))
        out += _interruptions(job, labels, part)
    return out


def _interruptions(job: RecordedJob, labels: str, part: np.ndarray) -> list[Series]:
    """One step of each kind's record per restart it sees, per job and per named node, and
    the job's union of kinds."""
    n = job.state.size
    runs: dict[str, np.ndarray] = {}
    named: dict[tuple[str, str], np.ndarray] = {}
    for drop, kind in job.restarts:
        for record, after, names in RESTART_RECORDS[kind]:
            step = drop + after
            if after in (BACK, TRAINING):
                again = np.flatnonzero(job.state[drop:] >= (1 if after == BACK else 2))
                step = drop + int(again[0]) if again.size else n
            if step >= n or not part[step]:
                continue
            runs.setdefault(record, np.full(n, np.nan))[step] = 1.0
            for node in job.nodes if names else ():
                named.setdefault((node, record), np.full(n, np.nan))[step] = 1.0
    out: list[Series] = [
        (JOB_INTERRUPTION_RECORD, "gauge", f'{labels},{KIND_LABEL}="{kind}"', values)
        for kind, values in runs.items()
    ]
    if runs:
        union = np.fmax.reduce(list(runs.values()))
        out.append((JOB_INTERRUPTED_RECORD, "gauge", labels, union))
    out += [
        (NODE_INTERRUPTION_RECORD, "gauge", f'node="{node}",{labels},{KIND_LABEL}="{kind}"', v)
        for (node, kind), v in named.items()
    ]
    return out
