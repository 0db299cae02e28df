"""The node's mounts from a container: pid 1's mount table under `--path.procfs`, calls on
a mount reached under `--path.rootfs`, series named by the host's mount points.

The fixture is what a DaemonSet pod sees: the host's /proc at `proc/` (pid 1 in the host's
mount namespace, `self` the container's own), the host's checkpoint directory at
`hostroot/ckpt` (a real directory here, so statvfs and the probe run for real).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from fleetwatch.catalog.storage import STORAGE_PROBES_TOTAL
from fleetwatch.collectors import storage
from fleetwatch.collectors.sources.mounts import from_rootfs, reach
from fleetwatch.collectors.storage import StorageCollector, StorageSettings
from testbed.mounts import write_procfs
from tests.storage.exposition import collect_and_close, label_values
from tests.storage.exposition import sample as _get

# The host: its root, a local checkpoint filesystem at /ckpt and an NFS mount at /mnt/host-nfs.
HOST_MOUNTINFO = """\
1 0 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
30 1 259:3 / /ckpt rw,relatime shared:5 - ext4 /dev/nvme1n1 rw
31 1 0:70 / /mnt/host-nfs rw,relatime shared:6 - nfs4 10.9.0.1:/export/run rw,vers=4.1
"""
HOST_MOUNTSTATS = """\
device /dev/nvme0n1p2 mounted on / with fstype ext4
device /dev/nvme1n1 mounted on /ckpt with fstype ext4
device 10.9.0.1:/export/run mounted on /mnt/host-nfs with fstype nfs4 statvers=1.1
\tbytes:\t0 0 0 0 4096 777000 0 0
\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)
\txprt:\ttcp 0 0 1 0 2 3 3 0 3 0 1 0 0
\tper-op statistics
\t       WRITE: 3 3 0 777600 480 0 5 6 0
"""
NAMED = ("/ckpt", "/mnt/host-nfs")


def _container_view(rootfs: Path) -> tuple[str, str]:
    """(mountinfo, mountstats) of the container: its own root and /proc, and the host's
    mounts under `rootfs` (HostToContainer propagation brings them there)."""
    info = (
        "700 650 0:90 / / ro,relatime - overlay overlay rw,lowerdir=/l\n"
        "701 700 0:91 / /proc rw,nosuid - proc proc rw\n"
        f"702 700 259:2 / {rootfs} ro,relatime master:1 - ext4 /dev/nvme0n1p2 rw\n"
        f"703 702 259:3 / {rootfs}/ckpt rw,relatime master:5 - ext4 /dev/nvme1n1 rw\n"
        f"704 702 0:70 / {rootfs}/mnt/host-nfs rw,relatime master:6 - nfs4 "
        "10.9.0.1:/export/run rw,vers=4.1\n"
    )
    stats = HOST_MOUNTSTATS.replace(" on / ", f" on {rootfs} ").replace(" on /", f" on {rootfs}/")
    return info, stats


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    """The host's root as the container reaches it, with the checkpoint probe directory."""
    root = tmp_path / "hostroot"
    (root / "ckpt" / "fleetwatch").mkdir(parents=True)
    return root


def _collector(procfs: Path, rootfs: Path, **settings: object) -> StorageCollector:
    return StorageCollector(
        procfs=procfs,
        rootfs=rootfs,
        settings=StorageSettings(**settings),  # type: ignore[arg-type]
        wait=30.0,  # waits for the mount helper's start
    )


def test_pid_1s_mounts_are_watched_and_reached_under_rootfs(
    tmp_path: Path, rootfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    procfs = write_procfs(tmp_path / "proc", host=(HOST_MOUNTINFO, HOST_MOUNTSTATS))
    collector = _collector(
        procfs, rootfs, mounts=NAMED, probe_dir=("/ckpt/fleetwatch",), probe_bytes=65536
    )
    with caplog.at_level(logging.INFO):
        (samples,) = collect_and_close(collector)
    expected = os.statvfs(rootfs / "ckpt")
    # statvfs of the host's /ckpt, reached at <rootfs>/ckpt, labelled with the host's path.
    assert _get(samples, storage.SIZE, mountpoint="/ckpt") == expected.f_blocks * expected.f_frsize
    assert _get(samples, STORAGE_PROBES_TOTAL.name, mountpoint="/ckpt") == 1
    assert os.listdir(rootfs / "ckpt" / "fleetwatch") == []  # probed there, file deleted
    # NFS counters of the host's mount, from pid 1's mountstats.
    assert _get(samples, storage.WRITTEN_BYTES, mountpoint="/mnt/host-nfs") == 777000
    # The container's own mounts (self: the fixture's NFS mounts) are not the node's.
    assert _get(samples, storage.INFO, mountpoint="/mnt/checkpoints") is None
    assert not [r for r in caplog.records if "pid 1" in r.getMessage()]


def test_discovery_lists_the_hosts_network_mounts_not_the_containers(
    tmp_path: Path, rootfs: Path
) -> None:
    procfs = write_procfs(tmp_path / "proc", host=(HOST_MOUNTINFO, HOST_MOUNTSTATS))
    collector = _collector(procfs, rootfs)
    (samples,) = collect_and_close(collector)
    assert label_values(samples, storage.INFO, "mountpoint") == {"/mnt/host-nfs"}


def test_unreadable_pid_1_mountstats_falls_back_to_self_under_rootfs(
    tmp_path: Path, rootfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """/proc/1/mountstats is readable by root only: a non-root exporter reads its own, where
    the host's mounts lie under --path.rootfs, and names them by the host's paths."""
    info, stats = _container_view(rootfs)
    procfs = write_procfs(
        tmp_path / "proc", mountinfo=info, mountstats=stats, host=(HOST_MOUNTINFO, "")
    )
    (procfs / "1" / "mountstats").unlink()
    (procfs / "1" / "mountstats").mkdir()  # read() fails: IsADirectoryError, as EACCES would
    collector = _collector(procfs, rootfs, mounts=NAMED)
    with caplog.at_level(logging.INFO):
        samples, again = collect_and_close(collector, 2)
    assert _get(samples, storage.WRITTEN_BYTES, mountpoint="/mnt/host-nfs") == 777000
    assert _get(again, storage.WRITTEN_BYTES, mountpoint="/mnt/host-nfs") == 777000
    said = [r for r in caplog.records if "pid 1" in r.getMessage()]
    assert len(said) == 1, "the fallback is said once"
    assert said[0].file == str(procfs / "1" / "mountstats")  # type: ignore[attr-defined]


def test_hidden_pid_1_reads_selfs_mounts_under_rootfs_only(tmp_path: Path, rootfs: Path) -> None:
    """With pid 1 hidden (hidepid), the container's own table: the host's mounts under
    --path.rootfs, by their host paths; the container's own root and /proc left out."""
    info, stats = _container_view(rootfs)
    procfs = write_procfs(tmp_path / "proc", mountinfo=info, mountstats=stats)
    collector = _collector(procfs, rootfs, mounts=("/", "/proc", *NAMED))
    (samples,) = collect_and_close(collector)
    # "/" is the host's root (reached at rootfs), not the container's overlay.
    assert label_values(samples, storage.INFO, "mountpoint") == {"/", *NAMED}
    assert label_values(samples, storage.INFO, "device") >= {"/dev/nvme0n1p2"}
    assert "overlay" not in label_values(samples, storage.INFO, "device")
    assert _get(samples, storage.SIZE, mountpoint="/ckpt") is not None


def test_malformed_pid_1_mountinfo_lines_are_counted_and_the_rest_served(
    tmp_path: Path, rootfs: Path
) -> None:
    procfs = write_procfs(
        tmp_path / "proc", host=(HOST_MOUNTINFO + "garbage line\n", HOST_MOUNTSTATS)
    )
    collector = _collector(procfs, rootfs, mounts=NAMED)
    (samples,) = collect_and_close(collector)
    assert _get(samples, storage.PARSE_ERRORS, file="mountinfo") == 1
    assert _get(samples, storage.WRITTEN_BYTES, mountpoint="/mnt/host-nfs") == 777000


def test_no_readable_mount_table_fails_the_collection_naming_it(
    tmp_path: Path, rootfs: Path
) -> None:
    procfs = write_procfs(tmp_path / "proc", host=(HOST_MOUNTINFO, HOST_MOUNTSTATS))
    shutil.rmtree(procfs / "1")
    (procfs / "26231" / "mountinfo").unlink()
    collector = _collector(procfs, rootfs)
    try:
        with pytest.raises(FileNotFoundError, match="no mountinfo under"):
            collector.collect()
    finally:
        collector.close()


def test_paths_between_the_host_and_rootfs() -> None:
    assert reach("/mnt/ckpt", "/host/root") == "/host/root/mnt/ckpt"
    assert reach("/mnt/ckpt", "/") == "/mnt/ckpt"
    assert from_rootfs("/host/root/mnt/ckpt", "/host/root/") == "/mnt/ckpt"
    assert from_rootfs("/host/root", "/host/root") == "/"
    assert from_rootfs("/host/rootless", "/host/root") is None
    assert from_rootfs("/proc", "/host/root") is None
    assert from_rootfs("/proc", "/") == "/proc"
