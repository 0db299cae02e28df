"""Simulated checkpoint mounts: procfs mount files that move, and calls answered by the node.

The storage collector reads `<procfs>/1/mountinfo`, `<procfs>/1/mountstats` and
`<procfs>/diskstats`, and makes its calls on mounts (statvfs, the canary probe) through a
`MountCaller`. Under `--simulate` with a scenario that has `mounts:`, `SimulatedProcfs`
writes those files into a directory of its own, as the simulated node's init (`1/`): the
host's lines as the collector would read them (pid 1's, else its own: a mount the command
line names stays the real one) followed by one line per simulated mount, whose NFS
counters (bytes written, WRITE calls and their round-trip time) follow the node's checkpoint
saves. `SimulatedMountCalls` answers statvfs of a simulated mount from the node (size, free
space, read-only) and blocks while a `mount_hung` fault holds the mount, as a hard NFS
mount's caller does; a call on any other mount goes to the real helper process (under
`--path.rootfs`). A probe directory on a simulated mount (`--collector.storage.probe-dir`) is
probed by the node: its phases take the mount's rate and round trip (slowed by `mount_slow`),
a read-only mount fails it `read_only` and a full one `no_space`; the directory itself is
taken to exist. Lustre client stats (`fs/lustre`) are not carried over: a real Lustre mount
named beside simulated mounts has capacity and hung, not its client counters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from fleetwatch.collectors.sources.mount_calls import (
    Capacity,
    MountCalls,
    MountReading,
    ProbeResult,
)
from fleetwatch.collectors.sources.mounts import read_mount_file
from fleetwatch.collectors.sources.probe import ProbeFailed
from fleetwatch.sim.scenario import MountSpec
from fleetwatch.sim.world import MOUNT_WSIZE, SimulatedNode

# Mount IDs and device minors of simulated mounts, clear of a host's own (which count up
# from small numbers); majors of network filesystems are 0, as the kernel gives them.
_FIRST_ID: Final = 90000
_FIRST_MINOR: Final = 900
_NFS_FSTYPES: Final = frozenset({"nfs", "nfs4"})
# What statvfs reports for inodes of a simulated mount (they never run out).
_INODES: Final = 1 << 32
# The job read its last checkpoint back once, at start (one READ of this many bytes).
_READ_BACK: Final = 1 << 20


class SimulatedProcfs:
    """A procfs-shaped directory with the host's mount files plus the simulated mounts."""

    def __init__(self, *, node: SimulatedNode, root: Path, host: Path) -> None:
        self.node = node
        self.root = root
        self.host = host

    def write(self, t: float | None = None) -> None:
        """Rewrite the three files at simulated time `t` (each replaced whole, atomically:
        the collector reads them on its own thread)."""
        t = self.node.now() if t is None else t
        mountinfo = [self._host("mountinfo")]
        mountstats = [self._host("mountstats")]
        for index, mount in enumerate(self.node.scenario.mounts):
            mountinfo.append(self._mountinfo_line(index, mount, t))
            mountstats.append(self._mountstats_block(mount, t))
        self._replace("1/mountinfo", "".join(mountinfo))
        self._replace("1/mountstats", "".join(mountstats))
        self._replace("diskstats", self._host_diskstats())

    def _host(self, name: str) -> str:
        """The host's mount file, pid 1's or its own (empty when it has none, or cannot be
        read: no host mount is then watched)."""
        try:
            found = read_mount_file(self.host, name)
        except OSError:
            return ""
        return "" if found is None else _line_ended(found.text)

    def _host_diskstats(self) -> str:
        """The host's diskstats (empty when it has none)."""
        try:
            return _line_ended((self.host / "diskstats").read_text(errors="replace"))
        except OSError:
            return ""

    def _mountinfo_line(self, index: int, mount: MountSpec, t: float) -> str:
        mode = "ro" if self.node.mount_read_only(mount.mountpoint, t) else "rw"
        options = f"{mode},vers=4.1,rsize={MOUNT_WSIZE},wsize={MOUNT_WSIZE},hard,proto=tcp"
        return (
            f"{_FIRST_ID + index} 1 0:{_FIRST_MINOR + index} / {mount.mountpoint} "
            f"{mode},relatime shared:{_FIRST_ID + index} - {mount.fstype} {mount.source} "
            f"{options}\n"
        )

    def _mountstats_block(self, mount: MountSpec, t: float) -> str:
        header = f"device {mount.source} mounted on {mount.mountpoint} with fstype {mount.fstype}"
        if mount.fstype not in _NFS_FSTYPES:
            return header + "\n"  # no NFS counters: capacity and hung only
        written, rtt_ms = self.node.mount_written(mount.mountpoint, t)
        data = int(written)
        writes = data // MOUNT_WSIZE
        rtt = int(rtt_ms)
        pages = writes * (MOUNT_WSIZE // 4096)
        getattrs = int(t) + 1  # the job stats its checkpoint directory once a second
        return (
            f"{header} statvers=1.1\n"
            f"\tage:\t{int(t)}\n"
            f"\tbytes:\t{_READ_BACK} {data} 0 0 {_READ_BACK} {data} 1 {pages}\n"
            "\txprt:\ttcp 832 0 1 0 11 0 0 0 0 0 0 0 0\n"
            "\tper-op statistics\n"
            "\t        NULL: 1 1 0 44 24 0 0 0 0\n"
            f"\t        READ: 1 1 0 200 {_READ_BACK + 120} 0 2 2 0\n"
            f"\t       WRITE: {writes} {writes} 0 {data + writes * 200} {writes * 160} 0 "
            f"{rtt} {rtt + writes // 10} 0\n"
            f"\t      COMMIT: {writes // 64 + 1} {writes // 64 + 1} 0 0 0 0 0 0 0\n"
            f"\t     GETATTR: {getattrs} {getattrs} 0 0 0 0 {getattrs} {getattrs} 0\n"
        )

    def _replace(self, name: str, text: str) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(text)
        temporary.replace(path)


def _line_ended(text: str) -> str:
    """`text` ending in a newline (unless empty), so lines can follow it."""
    return text if not text or text.endswith("\n") else text + "\n"


class SimulatedMountCalls:
    """The collector's mount calls: a simulated mount answered by the node, any other by the
    real helper process (started only when a real mount is called)."""

    def __init__(self, node: SimulatedNode, *, rootfs: Path = Path("/")) -> None:
        self.node = node
        self.rootfs = rootfs
        self._simulated = frozenset(m.mountpoint for m in node.scenario.mounts)
        self._real: MountCalls | None = None

    def call(self, mountpoint: str, probe: tuple[str, int] | None) -> MountReading:
        """statvfs of `mountpoint` (blocking while the node hangs it), then the probe if
        given."""
        if mountpoint not in self._simulated:
            if self._real is None:
                self._real = MountCalls(rootfs=self.rootfs)
            return self._real.call(mountpoint, probe)
        self.node.block_for_mount_hang(mountpoint)
        mount = self.node.mount(mountpoint)
        free = int(self.node.mount_free_bytes(mountpoint))
        capacity = Capacity(
            size_bytes=int(mount.size_bytes),
            free_bytes=free,
            available_bytes=free,
            inodes=_INODES,
            inodes_free=_INODES // 2,
            read_only=self.node.mount_read_only(mountpoint),
        )
        found = None if probe is None else self._probe(mountpoint, probe[1])
        return MountReading(capacity=capacity, error=None, probe=found)

    def _probe(self, mountpoint: str, size: int) -> ProbeResult | ProbeFailed:
        """A canary probe of `size` bytes on a simulated mount, as the node has it now."""
        if self.node.mount_read_only(mountpoint):
            return ProbeFailed("read_only", "write", "Read-only file system")
        if self.node.mount_free_bytes(mountpoint) < size:
            return ProbeFailed("no_space", "write", "No space left on device")
        return ProbeResult(seconds=self.node.mount_probe_seconds(mountpoint, size), size=size)

    def close(self) -> None:
        """Stop the real helper, if one was started."""
        if self._real is not None:
            self._real.close()
