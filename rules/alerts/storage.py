"""Checkpoint storage rules: each node's checkpoint writes and each training job's (its
write rate summed over its nodes, its save bursts and the node that lags during one), and
the alerts on them: a hung or read-only checkpoint mount (both taint), a mount filling up,
an NFS server that stops answering, the storage straggler and a job saving below its
target.

The record names are in `fleetwatch.rules.definitions` (dashboards and the report read
them). Thresholds are `thresholds.checkpoint.<name>` in rules/config.yaml, read here as
`p("checkpoint.<name>")`; each alert's severity, `for` and taint are `alerts.<AlertName>`;
how a taint lifts (its `Remediation`) is beside the alert's expression.
"""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.storage import (
    KMSG_NFS_SERVER_NOT_RESPONDING,
    STORAGE_AVAILABLE_BYTES,
    STORAGE_HUNG,
    STORAGE_MOUNT_INFO,
    STORAGE_OPERATION_MAJOR_TIMEOUTS_TOTAL,
    STORAGE_READ_ONLY,
    STORAGE_SIZE_BYTES,
    STORAGE_WRITTEN_BYTES_TOTAL,
)
from fleetwatch.durations import parse_duration
from fleetwatch.rules.config import Config, Params
from fleetwatch.rules.contract import MOUNT_SUBJECT, NO_REPAIR, LocalCheck, NeedsPrometheus
from fleetwatch.rules.definitions import (
    CHECKPOINT_JOB_BURST_BYTES_RECORD,
    CHECKPOINT_JOB_BURST_DURATION_RECORD,
    CHECKPOINT_JOB_BURST_RECORD,
    CHECKPOINT_JOB_BURST_START_RECORD,
    CHECKPOINT_JOB_NODE_WRITE_RATE_RECORD,
    CHECKPOINT_JOB_PEAK_RECORD,
    CHECKPOINT_JOB_WRITE_RATE_RECORD,
    CHECKPOINT_NODE_LAG_RECORD,
    CHECKPOINT_NODE_WRITE_RATE_RECORD,
    CHECKPOINT_READ_ONLY_REMOUNT_RECORD,
    JOB_INFO,
    JOB_LABELS,
)
from fleetwatch.rules.promql import (
    PERCENT,
    Alert,
    Healthy,
    Promql,
    Record,
    Remediation,
    clear_condition,
    lookup,
    match,
    union,
)

STORAGE_COLLECTOR: Final = "storage"
"""The exporter's collector (COLLECTOR_UP's `collector` label) the clear conditions need."""

MOUNT: Final = "mount {{ $labels.mountpoint }} on node {{ $labels.node }}"
JOB_NAME: Final = "{{ $labels.namespace }}/{{ $labels.training_job }}"
NFS_FSTYPES: Final = "nfs|nfs4"
BYTES_PER_SECOND: Final = "{{ $value | humanize }}B/s"


def _in_burst(series: str) -> str:
    """`series` {namespace, training_job, ...} only while its job is saving."""
    return f"{series}\nand on ({JOB_LABELS})\n{CHECKPOINT_JOB_BURST_RECORD} == 1"


def records(config: Config, p: Params) -> list[Record]:
    """Node scope: each node's write rate to its watched mounts."""
    del p  # no thresholds: a rate only
    q = Promql(config)
    written = q.exporter(STORAGE_WRITTEN_BYTES_TOTAL.name)
    return [
        Record(
            record=CHECKPOINT_NODE_WRITE_RATE_RECORD,
            expr=f"sum by (node) (rate({written}[{q.window}]))",
        )
    ]


def history(config: Config, p: Params) -> list[Record]:
    """Node scope, the `intervals.history` group: which watched mounts were remounted
    read-only (read-only now, writable at some time within `presence_history`). Each
    interval's lowest read-only value is kept per mount, so the history costs a query one
    sample per interval, not one per scrape."""
    q = Promql(config)
    read_only = q.exporter(STORAGE_READ_ONLY.name)
    tile = f"job_node_mountpoint:{STORAGE_READ_ONLY.name}:min{q.history_interval}"
    return [
        Record(
            record=tile,
            expr=(
                f"min by (job, node, mountpoint) (min_over_time({read_only}[{q.history_interval}]))"
            ),
        ),
        Record(
            record=CHECKPOINT_READ_ONLY_REMOUNT_RECORD,
            expr=(
                f"{read_only}\n* on (job, node, mountpoint) group_left ()\n"
                f"(min_over_time({tile}[{p('presence_history')}]) == bool 0)"
            ),
        ),
    ]


def job_records(config: Config, p: Params) -> list[Record]:
    """Global scope, per training job (a job's nodes are the nodes holding its GPUs,
    `fleetwatch:gpu_job:info`): its write rate, its recent peak, whether it is saving (a
    burst: the job writes above `checkpoint.burst_floor_megabytes_per_second` and at least
    `checkpoint.burst_peak_fraction` of its peak within `checkpoint.peak_window`), the
    current burst's start, duration and bytes, and each node's lag during a burst.

    A burst's start and bytes carry over from the previous evaluation (each rule reads its
    own last sample): its bytes are the job's write rate integrated over the burst, one
    evaluation interval at a time. A node shared by two jobs counts its writes in both."""
    step = parse_duration(config.evaluation_interval)
    burst = f"{CHECKPOINT_JOB_BURST_RECORD} == 1"
    on_job = f"on ({JOB_LABELS})"
    median = f"quantile by ({JOB_LABELS}) (0.5, {CHECKPOINT_JOB_NODE_WRITE_RATE_RECORD})"
    return [
        Record(
            record=CHECKPOINT_JOB_NODE_WRITE_RATE_RECORD,
            expr=(
                f"max by (node, {JOB_LABELS}) (0 * {JOB_INFO})\n"
                f"+ on (node) group_left ()\n{CHECKPOINT_NODE_WRITE_RATE_RECORD}"
            ),
        ),
        Record(
            record=CHECKPOINT_JOB_WRITE_RATE_RECORD,
            expr=f"sum by ({JOB_LABELS}) ({CHECKPOINT_JOB_NODE_WRITE_RATE_RECORD})",
        ),
        Record(
            record=CHECKPOINT_JOB_PEAK_RECORD,
            expr=(
                f"max_over_time({CHECKPOINT_JOB_WRITE_RATE_RECORD}[{p('checkpoint.peak_window')}])"
            ),
        ),
        Record(
            record=CHECKPOINT_JOB_BURST_RECORD,
            expr=(
                f"({CHECKPOINT_JOB_WRITE_RATE_RECORD} > bool "
                f"{p('checkpoint.burst_floor_megabytes_per_second')} * 1e6)\n"
                f"* ({CHECKPOINT_JOB_WRITE_RATE_RECORD} >= bool "
                f"{p('checkpoint.burst_peak_fraction')} * {CHECKPOINT_JOB_PEAK_RECORD})"
            ),
        ),
        Record(
            record=CHECKPOINT_JOB_BURST_START_RECORD,
            expr=(
                f"{CHECKPOINT_JOB_BURST_START_RECORD} and {on_job} ({burst})\n"
                f"or {on_job}\n0 * ({burst}) + time()"
            ),
        ),
        Record(
            record=CHECKPOINT_JOB_BURST_DURATION_RECORD,
            expr=f"time() - {CHECKPOINT_JOB_BURST_START_RECORD}",
        ),
        Record(
            record=CHECKPOINT_JOB_BURST_BYTES_RECORD,
            expr=(
                f"(\n  {CHECKPOINT_JOB_BURST_BYTES_RECORD}\n"
                f"  + {on_job} {step:g} * {CHECKPOINT_JOB_WRITE_RATE_RECORD}\n)\n"
                f"and {on_job} ({burst})\nor {on_job}\n"
                f"{step:g} * {CHECKPOINT_JOB_WRITE_RATE_RECORD} and {on_job} ({burst})"
            ),
        ),
        Record(
            record=CHECKPOINT_NODE_LAG_RECORD,
            expr=_in_burst(
                f"clamp_min(\n  1 - {CHECKPOINT_JOB_NODE_WRITE_RATE_RECORD}\n"
                f"  / {on_job} group_left ()\n  ({median} > 0),\n  0\n)"
            ),
        ),
    ]


def alerts(config: Config, p: Params) -> list[Alert]:
    """Node scope: a hung or read-only checkpoint mount (both taint), a mount filling up,
    an NFS server that stops answering."""
    q = Promql(config)
    hold_down = p("untaint_hold_down")
    available = q.exporter(STORAGE_AVAILABLE_BYTES.name)
    timeouts = q.exporter(STORAGE_OPERATION_MAJOR_TIMEOUTS_TOTAL.name)
    nfs_info = q.exporter(STORAGE_MOUNT_INFO.name, match("fstype", "=~", NFS_FSTYPES))
    mount_filter = ("node=%q", "mountpoint=%q")
    server = lookup(
        q.exporter(STORAGE_MOUNT_INFO.name, *mount_filter),
        "node",
        "mountpoint",
        then=" ({{ .Labels.fstype }} from {{ if .Labels.server }}server {{ .Labels.server }}"
        "{{ else }}device {{ .Labels.device }}{{ end }})",
    )

    def cleared(*healthy: Healthy) -> str:
        """A clear condition of this area, with the configured hold-down."""
        return clear_condition(q, collector=STORAGE_COLLECTOR, hold_down=hold_down, healthy=healthy)

    return [
        Alert(
            name="CheckpointMountHung",
            expr=f"{q.exporter(STORAGE_HUNG.name)} == 1",
            summary="Checkpoint mount hung on node {{ $labels.node }}",
            description=(
                f"A call on {MOUNT}{server} has been blocked in the kernel longer than the "
                "exporter's hung deadline: a job on this node will hang at its next "
                "checkpoint save, and every rank of it with it."
            ),
            # Lifted once every watched mount of the node has answered (not hung) at every
            # sample of the hold-down: an NFS server that comes and goes keeps the taint.
            remediation=Remediation(
                reason="checkpoint-mount-hung",
                clear=cleared(Healthy(STORAGE_HUNG.name, "max", "== 0")),
                local=(
                    LocalCheck(family=STORAGE_HUNG.name, op="==", limit=1, subject=MOUNT_SUBJECT),
                ),
                # The server or the path to it is at fault: a reboot of this node fixes neither.
                repair=NO_REPAIR,
            ),
        ),
        Alert(
            name="CheckpointMountReadOnly",
            expr=f"{q.exporter(CHECKPOINT_READ_ONLY_REMOUNT_RECORD)} == 1",
            summary="Checkpoint mount turned read-only on node {{ $labels.node }}",
            description=(
                f"The {MOUNT}{server} is read-only, and was writable within the last "
                f"{p('presence_history')}: the kernel or the server remounted it after "
                "errors, and the next checkpoint save on this node fails."
            ),
            # Lifted once no mount of the node is a read-only remount for the hold-down: it
            # was remounted writable, or it has been read-only for all of presence_history.
            remediation=Remediation(
                reason="checkpoint-mount-read-only",
                clear=cleared(Healthy(CHECKPOINT_READ_ONLY_REMOUNT_RECORD, "max", "== 0")),
                local=NeedsPrometheus(
                    why="read-only is a fault only on a mount that was writable within "
                    f"{p('presence_history')} (a history baseline); a mount read-only by "
                    "design reads the same in one scrape"
                ),
                repair=NO_REPAIR,
            ),
        ),
        Alert(
            name="CheckpointStorageFillingUp",
            expr=(
                f"predict_linear({available}[{p('checkpoint.fill_window')}], "
                f"{p('checkpoint.fill_horizon_seconds')}) <= 0\n"
                f"and on (node, mountpoint)\n{q.exporter(STORAGE_SIZE_BYTES.name)} > 0"
            ),
            summary="Checkpoint mount filling up on node {{ $labels.node }}",
            description=(
                f"The {MOUNT}{server} has "
                + lookup(
                    q.exporter(STORAGE_AVAILABLE_BYTES.name, *mount_filter),
                    "node",
                    "mountpoint",
                    then="{{ .Value | humanize }}B",
                )
                + " available and, at the rate it filled over the last "
                f"{p('checkpoint.fill_window')}, is full within "
                f"{p('checkpoint.fill_horizon_seconds')} seconds: a few checkpoints more. "
                "Delete old checkpoints or grow the filesystem before a save fails."
            ),
        ),
        Alert(
            name="NFSServerNotResponding",
            expr=union(
                [
                    f"sum by (node, server) (\n  rate({timeouts}[{q.window}])\n"
                    "  * on (node, instance, mountpoint) group_left (server)\n"
                    f"  max by (node, instance, mountpoint, server) ({nfs_info})\n) > 0",
                    f"max by (node, server) ({q.exporter(KMSG_NFS_SERVER_NOT_RESPONDING.name)})"
                    " == 1",
                ]
            ),
            summary=("NFS server {{ $labels.server }} not responding to node {{ $labels.node }}"),
            description=(
                "Requests of node {{ $labels.node }} to NFS server {{ $labels.server }} "
                "reach their major timeout, or the kernel's last word on the server was "
                "`nfs: server {{ $labels.server }} not responding`. Saves to its mounts stall "
                "until it answers (`nfs: server {{ $labels.server }} OK`)."
            ),
        ),
    ]


def job_alerts(config: Config, p: Params) -> list[Alert]:
    """Global scope, per training job: the node whose checkpoint writes lag the job's
    others during a save, and a job saving below `checkpoint.target_bytes_per_second`
    (off when 0)."""
    del config  # the records carry the exporter's selector
    target = p("checkpoint.target_bytes_per_second")
    lag = p("checkpoint.straggler_lag_ratio")
    job_filter = "namespace=%q,training_job=%q"
    return [
        Alert(
            name="CheckpointStraggler",
            expr=f"{CHECKPOINT_NODE_LAG_RECORD} > {lag}",
            summary=f"Node {{{{ $labels.node }}}} lags training job {JOB_NAME}'s checkpoint",
            description=(
                f"During a checkpoint save of training job {JOB_NAME}, node "
                "{{ $labels.node }} writes "
                + lookup(
                    f"{CHECKPOINT_JOB_NODE_WRITE_RATE_RECORD}{{{job_filter},node=%q}}",
                    "namespace",
                    "training_job",
                    "node",
                    then="{{ .Value | humanize }}B/s",
                )
                + f", {PERCENT} below the job's median node: every rank waits for its save. "
                "Look at its mounts' RTT and retransmissions and its network."
            ),
        ),
        Alert(
            name="CheckpointBelowTarget",
            expr=(
                _in_burst(f"{CHECKPOINT_JOB_WRITE_RATE_RECORD} < {target}")
                + f"\nand on () (vector({target}) > 0)"
            ),
            summary=f"Training job {JOB_NAME} saves checkpoints below its target",
            description=(
                f"Training job {JOB_NAME} writes its checkpoint at {BYTES_PER_SECOND}, below "
                f'the target of {{{{ "{target}" | humanize }}}}B/s. Straggler: '
                + lookup(
                    f'ALERTS{{alertname="CheckpointStraggler",{job_filter}}}',
                    "namespace",
                    "training_job",
                    then="node {{ .Labels.node }}",
                    otherwise="none flagged",
                )
                + "."
            ),
        ),
    ]
