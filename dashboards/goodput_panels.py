"""The Goodput rows: a training job's interruptions and effective training time (Training
job dashboard), and the fleet's interruptions per 1,000 node-days by kind (Fleet overview).

They read the interruption records (`fleetwatch.rules.interruptions`): an interruption is a
run of samples of its record, so one is counted where a run begins (present now, absent one
merge window before), sampled every minute.
"""

from __future__ import annotations

from typing import Final

from grafanalib.core import Panel

from dashboards.panels import Layout, table, timeseries
from fleetwatch.rules.interruptions import (
    JOB_GPUS_RECORD,
    JOB_INTERRUPTED_RECORD,
    JOB_INTERRUPTION_RECORD,
    JOB_PROGRESS_RECORD,
    NODE_INTERRUPTION_RECORD,
)

JOB_KIND: Final = "namespace, training_job, kind"
_RUN_STEP: Final = "1m"
"""The sampling step that finds where runs begin: the shipped merge window
(`thresholds.goodput.live_merge_window`), the shortest run."""


def _starts(record: str, labels: str, selector: str = "") -> str:
    """Interruptions of `record` (by `labels`) that began within the dashboard's range."""
    now = f"group by ({labels}) ({record}{selector})"
    before = f"group by ({labels}) ({record}{selector} offset {_RUN_STEP})"
    return (
        f"sum by ({labels}) (sum_over_time((\n  {now}\n  unless on ({labels})\n"
        f"  {before}\n)[$__range:{_RUN_STEP}]))"
    )


def job_panels(lay: Layout, job_selector: str) -> list[Panel]:
    """One job's interruptions over time by kind, its effective training time, and the
    nodes behind its interruptions."""
    sel = f"{{{job_selector}}}"
    return [
        lay.row("Goodput: when was the job interrupted, and what did it cost?"),
        timeseries(
            lay,
            "Interruptions by kind",
            (f"{JOB_INTERRUPTION_RECORD}{sel}", "{{kind}}"),
            description="Each bar is one interruption, named by how it was seen: a JobSet "
            "restart, a pod recreated, a container restarted in place, a pod evicted, a node "
            "lost or failed, a Slurm requeue, or every GPU idle at once and back (in_place). "
            "docs/training-jobs.md says what each one is.",
            max_value=1,
        ),
        timeseries(
            lay,
            "Effective training time (ETTR) and GPUs held",
            (f"avg_over_time({JOB_PROGRESS_RECORD}{sel}[1h])", "ETTR, last hour"),
            (f"avg_over_time({JOB_PROGRESS_RECORD}{sel}[$__range])", "ETTR, whole range"),
            unit="percentunit",
            max_value=1,
            description="The share of time the job made progress (median tensor activity "
            "above thresholds.job_busy_ratio) while it held GPUs: interruptions, restarts and "
            "checkpoint saves lower it. Time queued is not seen.",
        ),
        table(
            lay,
            "Interruptions in the range, and GPUs held",
            (_starts(JOB_INTERRUPTED_RECORD, "namespace, training_job", sel), ""),
            (f"max_over_time({JOB_GPUS_RECORD}{sel}[$__range])", ""),
            columns={"Value #A": "interruptions", "Value #B": "most GPUs held"},
            height=6,
            description="How many times the job was interrupted in the range (every kind "
            "counted once) and the most GPUs it held.",
        ),
        table(
            lay,
            "Nodes behind the job's interruptions",
            (
                f"count by (node, kind) (max_over_time({NODE_INTERRUPTION_RECORD}{sel}[$__range]))",
                "",
            ),
            height=6,
            description="The nodes the interruptions named (the pod's node, a node lost or "
            "failed); a node behind interruptions of different jobs is taken out by "
            "NodeInterruptsJobs.",
        ),
    ]


def fleet_panels(lay: Layout, up: str) -> list[Panel]:
    """Interruptions per 1,000 node-days by kind, and the jobs interrupted most."""
    node_days = f"(count(max by (node) (max_over_time({up}[$__range]))) * $__range_s / 86400)"
    return [
        lay.row("Goodput: how often are training jobs interrupted?"),
        timeseries(
            lay,
            "Interruptions per 1,000 node-days by kind (over the range)",
            (
                f"sum by (kind) ({_starts(JOB_INTERRUPTION_RECORD, JOB_KIND)})\n"
                f"/ on () group_left ()\n{node_days} * 1000",
                "{{kind}}",
            ),
            description="Interruptions that began in the range, per 1,000 days of the "
            "nodes fleetwatch scrapes. Meta's research clusters measured 2.3 and 6.5 "
            "failures per 1,000 node-days, Llama 3's 54-day run about 3.8 "
            "(docs/training-jobs.md).",
        ),
        table(
            lay,
            "Training jobs by interruptions in the range",
            (_starts(JOB_INTERRUPTED_RECORD, "namespace, training_job"), ""),
            width=12,
            description="Each job's interruptions that began in the range, every kind "
            "counted once.",
        ),
    ]
