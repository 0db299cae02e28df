"""Checkpoint storage (the `storage` collector): the mounts that hold checkpoints, their
capacity, client I/O, NFS per-operation statistics, hung calls and the canary probe.

Part of the metric catalog (`fleetwatch.catalog`): each family is declared here once and
imported by name wherever it is emitted or read."""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.spec import Families

FAMILIES: Final = Families(collectors=("storage",))
"""Every family of this module, in declaration order (the order docs/metrics.md lists them)."""

STORAGE_MOUNT_INFO: Final = FAMILIES.declare(
    "fleetwatch_storage_mount_info",
    "gauge",
    "A watched mount (value 1): its filesystem type, server (network mounts) and device or export.",
    ("mountpoint", "fstype", "server", "device"),
    unit="info (1)",
    source=(
        "mountinfo: type, source (`server` is the host of `HOST:/export`; empty for a local device)"
    ),
    series="M",
)


STORAGE_HUNG: Final = FAMILIES.declare(
    "fleetwatch_storage_hung",
    "gauge",
    (
        "1 while a call on the mount (statvfs, the probe) has been blocked longer than "
        "--collector.storage.hung-timeout; 0 once it returned."
    ),
    ("mountpoint",),
    unit="0/1",
    source=(
        "1 while a call on the mount (statvfs, the probe) has been blocked longer than "
        "`--collector.storage.hung-timeout`"
    ),
    series="M",
)


STORAGE_STUCK_CALLS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_stuck_calls_total",
    "counter",
    (
        "Calls on the mount that blocked past the hung deadline (at most one is in flight per "
        "mount; each is counted once)."
    ),
    ("mountpoint",),
    unit="calls",
    source=(
        "calls that blocked past the hung deadline (one in flight per mount at most, each counted"
        " once)"
    ),
    series="M",
)


STORAGE_CALL_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_call_errors_total",
    "counter",
    (
        "statvfs calls on the mount that failed, by reason (the error's symbolic name, e.g. ENOENT "
        "when the mount went away, EIO)."
    ),
    ("mountpoint", "reason"),
    unit="calls",
    source="statvfs failures on the mount",
    series="M × a few",
    label_values={"reason": "(errno name such as `ENOENT`, `EIO`, `ENOTCONN`; `helper_failed`)"},
)


STORAGE_PARSE_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_parse_errors_total",
    "counter",
    (
        "Lines of a procfs mount file that did not parse (skipped; the rest of mountinfo, "
        "mountstats or diskstats was read; a Lustre llite stats file is skipped whole)."
    ),
    ("file",),
    unit="lines",
    source="malformed lines skipped (a malformed llite stats file is skipped whole)",
    series="4",
    label_values={"file": "(`mountinfo`, `mountstats`, `diskstats`, `llite`)"},
)


STORAGE_SIZE_BYTES: Final = FAMILIES.declare(
    "fleetwatch_storage_size_bytes",
    "gauge",
    "Size of the mounted filesystem (statvfs).",
    ("mountpoint",),
    unit="bytes",
    source="`statvfs` `f_blocks × f_frsize`",
    series="M",
)


STORAGE_FREE_BYTES: Final = FAMILIES.declare(
    "fleetwatch_storage_free_bytes",
    "gauge",
    "Free bytes, reserved blocks included (statvfs).",
    ("mountpoint",),
    unit="bytes",
    source="`statvfs` `f_bfree × f_frsize`",
    series="M",
)


STORAGE_AVAILABLE_BYTES: Final = FAMILIES.declare(
    "fleetwatch_storage_available_bytes",
    "gauge",
    "Bytes an unprivileged writer can still use (statvfs).",
    ("mountpoint",),
    unit="bytes",
    source="`statvfs` `f_bavail × f_frsize`",
    series="M",
)


STORAGE_INODES: Final = FAMILIES.declare(
    "fleetwatch_storage_inodes",
    "gauge",
    "Inodes of the filesystem (statvfs; 0 where unlimited).",
    ("mountpoint",),
    unit="inodes",
    source="`statvfs` `f_files`",
    series="M",
)


STORAGE_INODES_FREE: Final = FAMILIES.declare(
    "fleetwatch_storage_inodes_free",
    "gauge",
    "Free inodes (statvfs).",
    ("mountpoint",),
    unit="inodes",
    source="`statvfs` `f_ffree`",
    series="M",
)


STORAGE_READ_ONLY: Final = FAMILIES.declare(
    "fleetwatch_storage_read_only",
    "gauge",
    "1 when the mount is read-only (a remount after errors).",
    ("mountpoint",),
    unit="0/1",
    source="mountinfo `ro` or `statvfs` `ST_RDONLY`",
    series="M",
)


STORAGE_READ_BYTES_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_read_bytes_total",
    "counter",
    (
        "Bytes the client read from the storage: from the NFS server (page cache and O_DIRECT), or "
        "from a local filesystem's block device."
    ),
    ("mountpoint",),
    unit="bytes",
    source=(
        "mountstats `bytes:` field 5 (from the NFS server), Lustre llite `read_bytes` sum, or "
        "diskstats sectors read × 512 (local)"
    ),
    series="M",
)


STORAGE_WRITTEN_BYTES_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_written_bytes_total",
    "counter",
    (
        "Bytes the client wrote to the storage: to the NFS server, or to a local filesystem's "
        "block device."
    ),
    ("mountpoint",),
    unit="bytes",
    source=(
        "mountstats `bytes:` field 6 (to the NFS server), Lustre llite `write_bytes` sum, or "
        "diskstats sectors written × 512 (local)"
    ),
    series="M",
)


STORAGE_OPERATIONS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_operations_total",
    "counter",
    (
        "Operations sent, by operation: NFS RPCs (READ, WRITE, GETATTR, ...) or a local block "
        "device's completed reads and writes (read, write)."
    ),
    ("mountpoint", "operation"),
    unit="operations",
    source=(
        "mountstats per-op requests (NFS, `READ`, `WRITE`, ...; those counted at least once; "
        "lean: READ, WRITE, COMMIT, GETATTR), Lustre llite operation samples (`open`, `getattr`, "
        "...; full profile only), or diskstats reads and writes completed (`read`, `write`)"
    ),
    series="M × O",
)


STORAGE_OPERATION_TRANSMISSIONS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_operation_transmissions_total",
    "counter",
    "NFS RPC transmissions by operation (more than operations: retransmissions).",
    ("mountpoint", "operation"),
    unit="RPCs",
    source="mountstats per-op field 2 (more than requests: retransmissions)",
    series="M × O",
)


STORAGE_OPERATION_MAJOR_TIMEOUTS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_operation_major_timeouts_total",
    "counter",
    "NFS RPCs that hit a major timeout (the server did not answer), by operation.",
    ("mountpoint", "operation"),
    unit="RPCs",
    source="mountstats per-op field 3",
    series="M × O",
)


STORAGE_OPERATION_SENT_BYTES_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_operation_sent_bytes_total",
    "counter",
    "Bytes sent for NFS RPCs, by operation.",
    ("mountpoint", "operation"),
    unit="bytes",
    source="mountstats per-op field 4; full profile only",
    series="M × O",
)


STORAGE_OPERATION_RECEIVED_BYTES_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_operation_received_bytes_total",
    "counter",
    "Bytes received for NFS RPCs, by operation.",
    ("mountpoint", "operation"),
    unit="bytes",
    source="mountstats per-op field 5; full profile only",
    series="M × O",
)


STORAGE_OPERATION_QUEUE_SECONDS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_operation_queue_seconds_total",
    "counter",
    "Time NFS RPCs waited to be sent, by operation.",
    ("mountpoint", "operation"),
    unit="seconds",
    source="mountstats per-op field 6 (ms); full profile only",
    series="M × O",
)


STORAGE_OPERATION_RTT_SECONDS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_operation_rtt_seconds_total",
    "counter",
    "Round-trip time of NFS RPCs (sent to answered), by operation.",
    ("mountpoint", "operation"),
    unit="seconds",
    source="mountstats per-op field 7 (ms)",
    series="M × O",
)


STORAGE_OPERATION_EXECUTE_SECONDS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_operation_execute_seconds_total",
    "counter",
    "Execution time of NFS RPCs (queued to completed), by operation.",
    ("mountpoint", "operation"),
    unit="seconds",
    source="mountstats per-op field 8 (ms)",
    series="M × O",
)


STORAGE_OPERATION_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_operation_errors_total",
    "counter",
    "NFS RPCs that completed with an error, by operation (kernels that count them).",
    ("mountpoint", "operation"),
    unit="RPCs",
    source="mountstats per-op field 9 (newer kernels; absent where not written); full profile only",
    series="M × O",
)


STORAGE_PROBES_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_probes_total",
    "counter",
    "Canary probes that completed on the mount.",
    ("mountpoint",),
    unit="probes",
    source="canary probes completed in `--collector.storage.probe-dir`",
    series="Q",
)


STORAGE_PROBE_FAILURES_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_storage_probe_failures_total",
    "counter",
    (
        "Canary probes that failed, by reason (missing, not_writable, wrong_filesystem, read_only, "
        "no_space, io_error, ...)."
    ),
    ("mountpoint", "reason"),
    unit="probes",
    source="canary probe failures",
    series="11Q",
    label_values={
        "reason": (
            "(`missing`, `not_a_directory`, `not_writable`, `wrong_filesystem`, `read_only`, "
            "`no_space`, `io_error`, `disconnected`, `short_read`, `mismatch`, `error`)"
        )
    },
)


STORAGE_PROBE_SECONDS: Final = FAMILIES.declare(
    "fleetwatch_storage_probe_seconds",
    "gauge",
    "Seconds each phase of the last successful canary probe took (write, fsync, read, delete).",
    ("mountpoint", "phase"),
    unit="seconds",
    source="last successful probe, per phase",
    series="4Q",
    label_values={"phase": "(`write`, `fsync`, `read`, `delete`)"},
)


STORAGE_PROBE_WRITE_BYTES_PER_SECOND: Final = FAMILIES.declare(
    "fleetwatch_storage_probe_write_bytes_per_second",
    "gauge",
    "Write throughput of the last successful probe, write and fsync together.",
    ("mountpoint",),
    unit="bytes/s",
    source="probe bytes over write + fsync time",
    series="Q",
)


STORAGE_PROBE_READ_BYTES_PER_SECOND: Final = FAMILIES.declare(
    "fleetwatch_storage_probe_read_bytes_per_second",
    "gauge",
    "Read-back throughput of the last successful probe.",
    ("mountpoint",),
    unit="bytes/s",
    source="probe bytes over read-back time",
    series="Q",
)


STORAGE_PROBE_LAST_SUCCESS_TIMESTAMP_SECONDS: Final = FAMILIES.declare(
    "fleetwatch_storage_probe_last_success_timestamp_seconds",
    "gauge",
    "Unix time of the last successful probe on the mount.",
    ("mountpoint",),
    unit="seconds (Unix time)",
    source="end of the last successful probe",
    series="Q",
)


# The kernel log (the `xid` collector's kernel-log reader, `--collector.xid.source` with
# `kmsg`): storage events. Counters count records logged since the exporter started (older
# ones are history, as for Xids); the NFS state reads every record, history included.
KMSG_SOURCE: Final = "the `xid` collector's kernel-log reader (`--collector.xid.source=...,kmsg`)"

KMSG_NFS_SERVER_NOT_RESPONDING: Final = FAMILIES.declare(
    "fleetwatch_kmsg_nfs_server_not_responding",
    "gauge",
    (
        "1 when the kernel's last NFS message about the server is `not responding`, 0 once it "
        "logged `server ... OK` after it."
    ),
    ("server",),
    unit="0/1",
    source=(
        "`nfs: server S not responding, ...` / `nfs: server S OK`, history included; " + KMSG_SOURCE
    ),
    series="NFS servers",
    collectors=("xid",),
)


KMSG_HUNG_TASKS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_kmsg_hung_tasks_total",
    "counter",
    "Hung-task reports (`INFO: task NAME:PID blocked for more than N seconds.`) since start.",
    (),
    unit="reports",
    source=f"new kernel-log records; {KMSG_SOURCE}",
    series="1",
    collectors=("xid",),
)


KMSG_FILESYSTEM_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_kmsg_filesystem_errors_total",
    "counter",
    "ext4 and XFS error reports since start, by device, filesystem and kind.",
    ("device", "fs", "kind"),
    unit="reports",
    source=(
        "new kernel-log records: `EXT4-fs error (device D): ...`, `EXT4-fs (D): Remounting "
        "filesystem read-only`, `XFS (D): ...` error and shutdown reports; " + KMSG_SOURCE
    ),
    series="block devices × 3",
    label_values={
        "fs": "(`ext4`, `xfs`)",
        "kind": "(`error`, `read_only_remount`, `shutdown`)",
    },
    collectors=("xid",),
)


KMSG_NVME_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_kmsg_nvme_errors_total",
    "counter",
    "NVMe command timeouts and controller resets since start, by controller.",
    ("device", "kind"),
    unit="reports",
    source=(
        "new kernel-log records: `nvme nvmeN: I/O ... QID Q timeout, ...` (timeout), "
        "`nvme nvmeN: controller is down; will reset` (reset); " + KMSG_SOURCE
    ),
    series="NVMe controllers × 2",
    label_values={"kind": "(`timeout`, `reset`)"},
    collectors=("xid",),
)


KMSG_LUSTRE_EVICTIONS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_kmsg_lustre_evictions_total",
    "counter",
    "Lustre client evictions since start, by the target that evicted the client.",
    ("target",),
    unit="evictions",
    source=f"new kernel-log records `...: This client was evicted by TARGET; ...`; {KMSG_SOURCE}",
    series="Lustre targets",
    collectors=("xid",),
)
