"""Storage events in the kernel log: each kernel text parsed to its bounded labels, other
messages ignored; through the Xid collector's kernel-log reader, records from before the
exporter started are history (not counted) while an NFS server's state follows the last
message, history included."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fleetwatch.catalog.storage import (
    KMSG_FILESYSTEM_ERRORS_TOTAL,
    KMSG_HUNG_TASKS_TOTAL,
    KMSG_LUSTRE_EVICTIONS_TOTAL,
    KMSG_NFS_SERVER_NOT_RESPONDING,
    KMSG_NVME_ERRORS_TOTAL,
)
from fleetwatch.collectors.sources.kmsg import KmsgReader, parse_record
from fleetwatch.collectors.sources.kmsg_storage import EventKind, StorageEvent
from fleetwatch.collectors.xid import XidCollector, XidLedger
from fleetwatch.sim import loopback_servers as servers
from tests.gpu.kmsglines import an_hour_ago, record
from tests.gpu.simnode import samples, simulated

# (message as the kernel logs it, kind, subject, fs, detail)
KERNEL_TEXTS = [
    (
        "nfs: server nfs-1.example not responding, still trying",
        "nfs_not_responding",
        "nfs-1.example",
        "",
        "",
    ),
    ("nfs: server 10.0.0.60 not responding, timed out", "nfs_not_responding", "10.0.0.60", "", ""),
    ("nfs: server nfs-1.example OK", "nfs_ok", "nfs-1.example", "", ""),
    ("INFO: task python3:4242 blocked for more than 122 seconds.", "hung_task", "", "", ""),
    ("INFO: task kworker/u16:3:117 blocked for more than 120 seconds.", "hung_task", "", "", ""),
    (
        "EXT4-fs error (device sdb7): ext4_journal_check_start:87: comm torch: "
        "Detected aborted journal",
        "filesystem",
        "sdb7",
        "ext4",
        "error",
    ),
    (
        "EXT4-fs (dm-17): Remounting filesystem read-only",
        "filesystem",
        "dm-17",
        "ext4",
        "read_only_remount",
    ),
    (
        "XFS (nvme1n1): Corruption of in-memory data detected.  Shutting down filesystem",
        "filesystem",
        "nvme1n1",
        "xfs",
        "shutdown",
    ),
    (
        'XFS (sda1): metadata I/O error in "xfs_trans_read_buf_map" at daddr 0x2 len 1 error 5',
        "filesystem",
        "sda1",
        "xfs",
        "error",
    ),
    ("nvme nvme0: I/O 528 QID 10 timeout, reset controller", "nvme", "nvme0", "", "timeout"),
    ("nvme nvme3: I/O 3 (I/O Cmd) QID 2 timeout, aborting", "nvme", "nvme3", "", "timeout"),
    (
        "nvme nvme0: I/O tag 12 (400c) opcode 0x9 (Admin Cmd) QID 0 timeout, reset controller",
        "nvme",
        "nvme0",
        "",
        "timeout",
    ),
    (
        "nvme nvme0: controller is down; will reset: CSTS=0x3, PCI_STATUS=0x10",
        "nvme",
        "nvme0",
        "",
        "reset",
    ),
    (
        "LustreError: 167-0: lustre-MDT0001-mdc-ffff8: This client was evicted by lustre-MDT0001; "
        "in progress operations using this service will fail.",
        "lustre_eviction",
        "lustre-MDT0001",
        "",
        "",
    ),
]


@pytest.mark.parametrize(("message", "kind", "subject", "fs", "detail"), KERNEL_TEXTS)
def test_kernel_texts_parse(
    message: str, kind: EventKind, subject: str, fs: str, detail: str
) -> None:
    found = parse_record(record(7, 12.5, message))
    assert found == StorageEvent(
        kind=kind,
        subject=subject,
        fs=fs,
        detail=detail,
        sequence=7,
        seconds=12.5,
    )


@pytest.mark.parametrize(
    "message",
    [
        "XFS (sda1): Mounting V5 Filesystem",
        "EXT4-fs (sda1): mounted filesystem with ordered data mode",
        "nvme nvme0: 12/0/0 default/read/poll queues",
        "NFS: Registering the id_resolver key type",
        "task python3:4242 blocked on a mutex",
    ],
)
def test_other_messages_are_no_event(message: str) -> None:
    assert parse_record(record(1, 1.0, message)) is None


def family(collector: XidCollector, name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(v for _, v in k): value for k, value in samples(collector.collect(), name).items()
    }


def test_history_is_not_counted_and_nfs_state_follows_the_last_message(tmp_path: Path) -> None:
    _, source = simulated(at=120.0)
    old = an_hour_ago()
    log = tmp_path / "kmsg"
    log.write_text(
        record(1, old, "nfs: server nfs-1 not responding, still trying")
        + record(2, old, "nfs: server nfs-2 not responding, timed out")
        + record(3, old, "nfs: server nfs-2 OK")
        + record(4, old, "INFO: task python3:1 blocked for more than 120 seconds.")
        + record(5, old, "EXT4-fs (sdb1): Remounting filesystem read-only")
        + record(6, old, "nvme nvme0: I/O 1 QID 1 timeout, reset controller")
        + record(7, old, "x: This client was evicted by lustre-OST0002; in progress ...")
    )
    collector = XidCollector(
        source=source,
        kernel_log=KmsgReader(path=log),
        ledger=XidLedger(window=5.0),
        nvml_events=False,
    )
    nfs = KMSG_NFS_SERVER_NOT_RESPONDING.name
    try:
        collector.start()
        servers.wait_until(
            lambda: family(collector, nfs) == {("nfs-1",): 1.0, ("nfs-2",): 0.0},
            timeout=10,
            what="the NFS state from the history",
        )
        assert family(collector, KMSG_HUNG_TASKS_TOTAL.name) == {(): 0.0}
        assert family(collector, KMSG_FILESYSTEM_ERRORS_TOTAL.name) == {}
        assert family(collector, KMSG_NVME_ERRORS_TOTAL.name) == {}
        assert family(collector, KMSG_LUSTRE_EVICTIONS_TOTAL.name) == {}
        now = time.monotonic()
        with log.open("a") as more:
            more.write(
                record(8, now, "nfs: server nfs-1 OK")
                + record(9, now, "nfs: server nfs-2 not responding, still trying")
                + record(10, now, "INFO: task python3:1 blocked for more than 241 seconds.")
                + record(11, now, "EXT4-fs (sdb1): Remounting filesystem read-only")
                + record(12, now, "nvme nvme0: I/O 2 QID 1 timeout, reset controller")
                + record(13, now, "nvme nvme0: controller is down; will reset: CSTS=0x3")
                + record(14, now, "x: This client was evicted by lustre-OST0002; in progress ...")
            )
        servers.wait_until(
            lambda: (
                family(collector, KMSG_LUSTRE_EVICTIONS_TOTAL.name) == {("lustre-OST0002",): 1.0}
            ),
            timeout=10,
            what="the new records",
        )
        assert family(collector, nfs) == {("nfs-1",): 0.0, ("nfs-2",): 1.0}
        assert family(collector, KMSG_HUNG_TASKS_TOTAL.name) == {(): 1.0}
        assert family(collector, KMSG_FILESYSTEM_ERRORS_TOTAL.name) == {
            ("sdb1", "ext4", "read_only_remount"): 1.0
        }
        assert family(collector, KMSG_NVME_ERRORS_TOTAL.name) == {
            ("nvme0", "timeout"): 1.0,
            ("nvme0", "reset"): 1.0,
        }
    finally:
        collector.close()
