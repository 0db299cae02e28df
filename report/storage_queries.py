"""The Checkpoint storage section's queries: mounts that hung, went read-only or fill up,
and the training jobs' checkpoint saves.

A mount's hung or read-only time is counted at `--step` resolution; one fills up when its
free space, at the window's trend (a least-squares slope), runs out within
`FULL_WITHIN_HOURS`. The checkpoint series are the recording rules of rules/alerts/storage.py
(`fleetwatch.rules.definitions`): they exist only where a job saved, so their absence is
said by the section rather than taken as a missing collector.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetwatch.catalog.storage import (
    STORAGE_AVAILABLE_BYTES,
    STORAGE_HUNG,
    STORAGE_READ_ONLY,
    STORAGE_SIZE_BYTES,
)
from fleetwatch.report.query import JOB, MOUNT, Query, Window
from fleetwatch.report.windowed_promql import duration, select, time_in_state
from fleetwatch.rules.definitions import (
    CHECKPOINT_JOB_BURST_RECORD,
    CHECKPOINT_JOB_WRITE_RATE_RECORD,
    CHECKPOINT_NODE_WRITE_RATE_RECORD,
)

HUNG = STORAGE_HUNG.name
READ_ONLY = STORAGE_READ_ONLY.name
AVAILABLE = STORAGE_AVAILABLE_BYTES.name
SIZE = STORAGE_SIZE_BYTES.name
# A mount whose free space, at the window's trend, runs out within this many hours is
# filling up (a week: time for a person to clean up or grow it).
FULL_WITHIN_HOURS = 168.0
# The checkpoint recording rules. Per training job (namespace, training_job): bytes/s
# written and 1 while it saves; per node: bytes/s written.
JOB_CHECKPOINT_WRITE = CHECKPOINT_JOB_WRITE_RATE_RECORD
NODE_CHECKPOINT_WRITE = CHECKPOINT_NODE_WRITE_RATE_RECORD
JOB_CHECKPOINT_BURST = CHECKPOINT_JOB_BURST_RECORD


def _mount_time(metric: str) -> Callable[[Window], str]:
    """Seconds each mount's 0/1 `metric` (hung, read-only) was 1, mounts that never were
    left out."""
    return lambda w: (
        f"max by (node,mountpoint) ({time_in_state(w, f'{select(w, metric)} == bool 1')}) > 0"
    )


def _hours_to_full(w: Window) -> str:
    """Hours until a mount's available space runs out at the window's trend (a least-squares
    slope), of the mounts that run out within FULL_WITHIN_HOURS."""
    available = f"{select(w, AVAILABLE)}[{duration(w.seconds)}]"
    falling = f"(-deriv({available}) > 0)"
    return (
        f"max by (node,mountpoint) (last_over_time({available}) / {falling}) / 3600 "
        f"< {FULL_WITHIN_HOURS:g}"
    )


def _saves(w: Window) -> str:
    """Checkpoint saves each job started in the window: steps where it saves and did not a
    step before (whether the record is 0 or absent between saves)."""
    burst = select(w, JOB_CHECKPOINT_BURST, scoped=False)
    started = f"({burst} == 1) unless ({burst} offset {duration(w.step)} == 1)"
    steps = f"[{duration(w.seconds)}:{duration(w.step)}]"
    return f"max by (namespace,training_job) (count_over_time(({started}){steps}))"


def _node_write_while_saving(w: Window) -> str:
    """Each node's mean checkpoint write rate over the steps it wrote at all."""
    writing = f"{select(w, NODE_CHECKPOINT_WRITE)} > 0"
    return f"max by (node) (avg_over_time(({writing})[{duration(w.seconds)}:{duration(w.step)}]))"


STORAGE: tuple[Query, ...] = (
    *(
        Query(
            name=f"mount_{state}_seconds",
            shape="summary",
            keys=MOUNT,
            required=(metric,),
            build=_mount_time(metric),
        )
        for state, metric in (("hung", HUNG), ("read_only", READ_ONLY))
    ),
    Query(
        name="mount_available_ratio",
        shape="summary",
        keys=MOUNT,
        required=(AVAILABLE, SIZE),
        build=lambda w: (
            f"max by (node,mountpoint) (last_over_time({select(w, AVAILABLE)}"
            f"[{duration(w.seconds)}]) / last_over_time({select(w, SIZE)}[{duration(w.seconds)}]))"
        ),
    ),
    Query(
        name="mount_hours_to_full",
        shape="summary",
        keys=MOUNT,
        required=(AVAILABLE,),
        build=_hours_to_full,
    ),
    Query(
        name="job_checkpoint_saving_seconds",
        shape="summary",
        keys=JOB,
        required=(),
        optional=(JOB_CHECKPOINT_BURST,),
        scoped=False,
        batched=False,
        build=lambda w: (
            "max by (namespace,training_job) ("
            + time_in_state(w, f"{select(w, JOB_CHECKPOINT_BURST, scoped=False)} == bool 1")
            + ")"
        ),
    ),
    Query(
        name="job_checkpoint_saves",
        shape="summary",
        keys=JOB,
        required=(),
        optional=(JOB_CHECKPOINT_BURST,),
        scoped=False,
        batched=False,
        build=_saves,
    ),
    Query(
        name="job_checkpoint_peak_bytes",
        shape="summary",
        keys=JOB,
        required=(),
        optional=(JOB_CHECKPOINT_WRITE,),
        scoped=False,
        batched=False,
        build=lambda w: (
            "max by (namespace,training_job) (max_over_time("
            f"{select(w, JOB_CHECKPOINT_WRITE, scoped=False)}[{duration(w.seconds)}]))"
        ),
    ),
    Query(
        name="node_checkpoint_write_while_saving",
        shape="summary",
        keys=("node",),
        required=(),
        optional=(NODE_CHECKPOINT_WRITE,),
        build=_node_write_while_saving,
    ),
)
