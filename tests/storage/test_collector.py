"""The storage collector on fixture procfs trees and real directories (no FUSE needed)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fleetwatch.catalog.storage import (
    STORAGE_PROBE_FAILURES_TOTAL,
    STORAGE_PROBE_SECONDS,
    STORAGE_PROBE_WRITE_BYTES_PER_SECOND,
    STORAGE_PROBES_TOTAL,
)
from fleetwatch.collectors import storage
from fleetwatch.collectors.sources.procfs_mounts import MountTable
from fleetwatch.collectors.storage import StorageCollector, StorageSettings
from testbed.mounts import (
    LLITE_STATS,
    LLITE_STATS_DEBUGFS,
    LUSTRE_MOUNT,
    MOUNTINFO,
    write_llite,
    write_procfs,
)
from tests.storage.exposition import collect_and_close
from tests.storage.exposition import collect_samples as _samples
from tests.storage.exposition import sample as _get


def _local_mount(point: Path, fstype: str = "ext4") -> str:
    """A mountinfo line for a directory of this machine (statvfs answers for it)."""
    return f"90 22 259:3 / {point} rw,relatime shared:50 - {fstype} /dev/nvme1n1 rw\n"


def _collector(procfs: Path, **settings: object) -> StorageCollector:
    # Waits for the mount helper's start (a production cycle serves the calls' results on
    # the next cycle instead).
    return StorageCollector(procfs=procfs, settings=StorageSettings(**settings), wait=30.0)  # type: ignore[arg-type]


def test_nfs_counters_and_statvfs_of_a_named_mount(tmp_path: Path) -> None:
    point = tmp_path / "ckpt"
    point.mkdir()
    procfs = write_procfs(tmp_path / "proc", mountinfo=MOUNTINFO + _local_mount(point))
    collector = _collector(procfs)
    try:
        samples = _samples(collector)
    finally:
        collector.close()
    ckpt = "/mnt/checkpoints"
    # Discovered network mounts: NFS counters from mountstats (the mount points do not exist
    # here, so their statvfs fails with ENOENT and is counted, naming the mount).
    assert _get(samples, storage.READ_BYTES, mountpoint=ckpt) == 1210214218
    assert _get(samples, storage.WRITTEN_BYTES, mountpoint=ckpt) == 21474836480
    # The wrapped u64 queue time, modulo 2^53 (exact in a float64), as node_exporter has it.
    assert _get(samples, storage.OP_QUEUE, mountpoint=ckpt, operation="ACCESS") == (
        (18446743919241604546 % 2**53) / 1000
    )
    assert _get(samples, storage.OP_TRANSMISSIONS, mountpoint=ckpt, operation="WRITE") == 20483
    assert _get(samples, storage.OP_ERRORS, mountpoint=ckpt, operation="LOOKUP") == 412
    assert _get(samples, storage.OPERATIONS, mountpoint=ckpt, operation="READDIR") is None
    assert _get(samples, storage.CALL_ERRORS, mountpoint=ckpt, reason="ENOENT") == 1
    assert _get(samples, storage.SIZE, mountpoint=ckpt) is None
    assert _get(samples, storage.HUNG, mountpoint=ckpt) == 0
    assert _get(samples, storage.READ_ONLY, mountpoint="/mnt/datasets") == 1
    info = (storage.INFO, (("device", "10.0.0.5:/export/ckpt"), ("fstype", "nfs4"),
                           ("mountpoint", ckpt), ("server", "10.0.0.5")))  # fmt: skip
    assert samples[info] == 1
    # The tmp directory is not a network filesystem: not watched unless named.
    assert _get(samples, storage.INFO, mountpoint=str(point)) is None


def test_a_named_local_mount_gets_statvfs_and_diskstats(tmp_path: Path) -> None:
    point = tmp_path / "scratch"
    point.mkdir()
    procfs = write_procfs(tmp_path / "proc", mountinfo=MOUNTINFO + _local_mount(point))
    collector = _collector(procfs, mounts=(str(point),))
    try:
        samples = _samples(collector)
    finally:
        collector.close()
    expected = os.statvfs(point)
    name = str(point)
    assert _get(samples, storage.SIZE, mountpoint=name) == expected.f_blocks * expected.f_frsize
    assert _get(samples, storage.INODES, mountpoint=name) == expected.f_files
    assert _get(samples, storage.READ_BYTES, mountpoint=name) == 2097152 * 512
    assert _get(samples, storage.OPERATIONS, mountpoint=name, operation="write") == 4096
    assert _get(samples, storage.INFO, mountpoint="/mnt/checkpoints") is None  # named only


def test_lean_keeps_only_the_data_path_operations(tmp_path: Path) -> None:
    procfs = write_procfs(tmp_path / "proc")
    full, lean = _collector(procfs), _collector(procfs, all_operations=False)
    try:
        full_ops = {dict(k[1])["operation"] for k in _samples(full) if k[0] == storage.OPERATIONS}
        lean_ops = {dict(k[1])["operation"] for k in _samples(lean) if k[0] == storage.OPERATIONS}
    finally:
        full.close()
        lean.close()
    assert "SETATTR" in full_ops
    assert "NULL" in full_ops
    assert lean_ops == storage.LEAN_OPERATIONS


def test_malformed_lines_are_counted_by_file_and_the_rest_served(tmp_path: Path) -> None:
    procfs = write_procfs(tmp_path / "proc", mountinfo=MOUNTINFO + "garbage line\n")
    samples, again = collect_and_close(_collector(procfs), 2)
    assert _get(samples, storage.PARSE_ERRORS, file="mountinfo") == 1
    assert _get(again, storage.PARSE_ERRORS, file="mountinfo") == 2  # counted each read
    assert _get(samples, storage.READ_BYTES, mountpoint="/mnt/checkpoints") == 1210214218


def test_a_mount_that_disappears_is_dropped(tmp_path: Path) -> None:
    procfs = write_procfs(tmp_path / "proc")
    collector = _collector(procfs)
    try:
        assert _get(_samples(collector), storage.HUNG, mountpoint="/mnt/datasets") == 0
        kept = "\n".join(line for line in MOUNTINFO.splitlines() if "/mnt/datasets" not in line)
        write_procfs(procfs, mountinfo=kept + "\n")
        samples = _samples(collector)
    finally:
        collector.close()
    assert _get(samples, storage.HUNG, mountpoint="/mnt/datasets") is None
    assert _get(samples, storage.HUNG, mountpoint="/mnt/checkpoints") == 0


def test_a_mount_that_appears_shows_in_the_next_cycle(tmp_path: Path) -> None:
    """The mount table's parse is kept while its text stands still: a new line is seen."""
    kept = "\n".join(line for line in MOUNTINFO.splitlines() if "/mnt/datasets" not in line)
    procfs = write_procfs(tmp_path / "proc", mountinfo=kept + "\n")
    collector = _collector(procfs)
    try:
        before = [_samples(collector) for _ in range(2)]
        write_procfs(procfs, mountinfo=MOUNTINFO)
        after = _samples(collector)
    finally:
        collector.close()
    assert all(_get(s, storage.HUNG, mountpoint="/mnt/datasets") is None for s in before)
    assert _get(after, storage.HUNG, mountpoint="/mnt/datasets") == 0


def test_the_mount_table_is_parsed_again_only_when_its_text_changed() -> None:
    table = MountTable()
    first = table.parse(MOUNTINFO)
    assert table.parse(MOUNTINFO) is first
    changed = table.parse(MOUNTINFO + _local_mount(Path("/mnt/scratch")))
    assert changed is not first
    assert [m.mountpoint for m in changed.mounts] == [
        *(m.mountpoint for m in first.mounts),
        "/mnt/scratch",
    ]


def test_probe_runs_and_a_missing_directory_is_reported(tmp_path: Path) -> None:
    point = tmp_path / "scratch"
    (point / "fleetwatch").mkdir(parents=True)
    procfs = write_procfs(tmp_path / "proc", mountinfo=MOUNTINFO + _local_mount(point))
    collector = _collector(
        procfs, mounts=(str(point),), probe_dir=(str(point / "fleetwatch"),), probe_bytes=65536
    )
    name = str(point)
    try:
        samples = _samples(collector)
        assert _get(samples, STORAGE_PROBES_TOTAL.name, mountpoint=name) == 1
        assert _get(samples, STORAGE_PROBE_SECONDS.name, mountpoint=name, phase="fsync") is not None
        assert (_get(samples, STORAGE_PROBE_WRITE_BYTES_PER_SECOND.name, mountpoint=name) or 0) > 0
        assert os.listdir(point / "fleetwatch") == []  # the probe file was deleted
    finally:
        collector.close()
    missing = _collector(
        procfs, mounts=(str(point),), probe_dir=(str(point / "absent"),), probe_interval=1.0
    )
    try:
        samples = _samples(missing)
    finally:
        missing.close()
    assert _get(samples, STORAGE_PROBE_FAILURES_TOTAL.name, mountpoint=name, reason="missing") == 1
    assert not (point / "absent").exists()  # never created


def test_a_probe_directory_on_an_unwatched_filesystem_is_not_probed(tmp_path: Path) -> None:
    directory = tmp_path / "probe"
    directory.mkdir()
    procfs = write_procfs(tmp_path / "proc")  # tmp_path lies on "/" in this mountinfo
    collector = _collector(procfs, probe_dir=(str(directory),))
    try:
        samples = _samples(collector)
    finally:
        collector.close()
    assert (
        _get(samples, STORAGE_PROBE_FAILURES_TOTAL.name, mountpoint="/", reason="wrong_filesystem")
        == 1
    )
    assert _get(samples, STORAGE_PROBES_TOTAL.name, mountpoint="/") == 0


def test_a_probe_outcome_is_counted_across_short_cycles(tmp_path: Path) -> None:
    """With the production wait (results served on a later cycle), a probe's outcome is
    still counted before the next call on the mount replaces it."""
    point = tmp_path / "scratch"
    point.mkdir()
    procfs = write_procfs(tmp_path / "proc", mountinfo=MOUNTINFO + _local_mount(point))
    settings = StorageSettings(mounts=(str(point),), probe_dir=(str(point / "absent"),))
    collector = StorageCollector(procfs=procfs, settings=settings)
    name = str(point)
    try:
        deadline = time.monotonic() + 30
        while (
            _get(
                _samples(collector),
                STORAGE_PROBE_FAILURES_TOTAL.name,
                mountpoint=name,
                reason="missing",
            )
            != 1
        ):
            assert time.monotonic() < deadline, "the missing probe directory was never counted"
            time.sleep(0.05)
    finally:
        collector.close()


def test_lustre_client_stats_by_filesystem_name(tmp_path: Path) -> None:
    procfs = write_procfs(
        tmp_path / "proc",
        mountinfo=MOUNTINFO + LUSTRE_MOUNT,
        llite={"ckptfs-ffff8b1b2c3d4000": LLITE_STATS, "otherfs-ffff8b1b2c3d8000": "garbage\n"},
    )
    collector = _collector(procfs)
    try:
        samples = _samples(collector)
    finally:
        collector.close()
    point = "/lustre/ckpt"
    assert _get(samples, storage.READ_BYTES, mountpoint=point) == 4202496
    assert _get(samples, storage.WRITTEN_BYTES, mountpoint=point) == 6442450944
    assert _get(samples, storage.OPERATIONS, mountpoint=point, operation="getattr") == 9
    assert _get(samples, storage.PARSE_ERRORS, file="llite") == 1
    info = (storage.INFO, (("device", "10.0.1.1@o2ib:/ckptfs"), ("fstype", "lustre"),
                           ("mountpoint", point), ("server", "10.0.1.1@o2ib")))  # fmt: skip
    assert samples[info] == 1


def test_lustre_client_stats_from_debugfs_since_lustre_2_12(tmp_path: Path) -> None:
    procfs = write_procfs(tmp_path / "proc", mountinfo=MOUNTINFO + LUSTRE_MOUNT)
    sysfs = tmp_path / "sys"
    debugfs = sysfs / "kernel" / "debug" / "lustre" / "llite"
    write_llite(debugfs, {"ckptfs-ffff8b1b2c3d4000": LLITE_STATS_DEBUGFS})
    collector = StorageCollector(procfs=procfs, sysfs=sysfs, settings=StorageSettings(), wait=30.0)
    (samples,) = collect_and_close(collector)
    point = "/lustre/ckpt"
    assert _get(samples, storage.READ_BYTES, mountpoint=point) == 4202496
    assert _get(samples, storage.WRITTEN_BYTES, mountpoint=point) == 12884901888
    assert _get(samples, storage.OPERATIONS, mountpoint=point, operation="write") == 4096
    assert _get(samples, storage.OPERATIONS, mountpoint=point, operation="statfs") == 1
    assert _get(samples, storage.PARSE_ERRORS, file="llite") is None


def test_an_instance_in_both_proc_and_debugfs_is_read_once(tmp_path: Path) -> None:
    """A client listing one instance in both places is one mount, not two (which would be
    left out as a filesystem mounted twice)."""
    instance = {"ckptfs-ffff8b1b2c3d4000": LLITE_STATS}
    procfs = write_procfs(tmp_path / "proc", mountinfo=MOUNTINFO + LUSTRE_MOUNT, llite=instance)
    sysfs = tmp_path / "sys"
    write_llite(sysfs / "kernel" / "debug" / "lustre" / "llite", instance)
    collector = StorageCollector(procfs=procfs, sysfs=sysfs, settings=StorageSettings(), wait=30.0)
    (samples,) = collect_and_close(collector)
    assert _get(samples, storage.WRITTEN_BYTES, mountpoint="/lustre/ckpt") == 6442450944
