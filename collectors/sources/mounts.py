"""Mounts as the kernel reports them: mountinfo, NFS mountstats and diskstats.

Three procfs files, parsed into frozen readings in native units (bytes, milliseconds, counts):

- `<procfs>/PID/mountinfo`: one line per mount (`ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS
  [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS`); octal escapes (`\\040` for a space) decoded.
- `<procfs>/PID/mountstats`: one `device SOURCE mounted on MOUNTPOINT with fstype TYPE
  [statvers=V]` line per mount, then, for NFS, tab-indented `bytes:`, `xprt:` and per-operation
  lines (`NAME: requests transmissions major_timeouts bytes_sent bytes_received queue_ms
  rtt_ms execute_ms [errors]`; the ninth field comes with newer kernels). Counters are
  unsigned 64-bit: real kernels write wrapped values (18446743919241604546) and fewer
  transmissions than requests; they are kept as read, never made negative or refused.
- `<procfs>/diskstats`: per block device, sectors read and written (512-byte sectors) and
  completed reads and writes, for a local filesystem's device.

- `llite/FSNAME-INSTANCE/stats`: a Lustre client's counters (`read_bytes 11 samples [bytes]
  MIN MAX SUM [SUMSQUARE]`; `open 2 samples [usecs] ...`), under `<procfs>/fs/lustre` before
  Lustre 2.12 and in debugfs (`/sys/kernel/debug/lustre`) from 2.12 on, where the format is
  the same (lprocfs's `snapshot_time`, `start_time`, `elapsed_time` lines first).

A malformed line is a `LineProblem` (file, line number, reason) and the rest of the file is
still read: one odd mount never hides the others.

PID is `1`, the host's init, whose mount namespace is the host's when `--path.procfs` is the
host's /proc (as node_exporter reads it), else `self`. A mount table read from `self` inside a
container holds the container's own mounts, among them the host's under `--path.rootfs`:
`from_rootfs` maps those back to the host's mount points, so a mount is named the same
whichever table it came from; `reach` is the other way, where this process finds the host's
path.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

# Filesystem types watched with no configuration: network and parallel filesystems, where a
# checkpoint lives and where a call can block on a server.
NETWORK_FSTYPES: Final = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "wekafs",
        "beegfs",
        "ceph",
        "cifs",
        "smb3",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.ceph",
        "fuse.juicefs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "9p",
        "orangefs",
        "pvfs2",
    }
)
SECTOR_BYTES: Final = 512
_OCTAL: Final = re.compile(r"\\([0-7]{3})")
# The numbers end on a digit: `[0-9 ]+\s*` backtracked quadratically over a run of blanks.
_PER_OP: Final = re.compile(r"\s*([A-Z_0-9]+):\s+([0-9 ]*[0-9])\s*")
# A counter as the kernel writes one: ASCII digits, at most a u64's 20 (str.isdigit() also
# takes "²", which int() refuses, and int() refuses 4300 digits or more).
_COUNT: Final = re.compile(r"[0-9]{1,20}")


def _is_count(text: str) -> bool:
    return _COUNT.fullmatch(text) is not None


@dataclass(frozen=True, kw_only=True, slots=True)
class LineProblem:
    """A line that could not be parsed: which file, which line (from 1), and why."""

    path: str
    line: int
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Mount:
    """One mountinfo line: where, what, from where, and whether it is read-only."""

    mount_id: int
    major: int
    minor: int
    mountpoint: str
    fstype: str
    source: str
    read_only: bool

    @property
    def server(self) -> str:
        """The server of a network mount (`HOST` of `HOST:/export`, `mgs@tcp` of Lustre's
        `mgs@tcp:/fs`); "" for a local device."""
        host, colon, _path = self.source.rpartition(":/")
        return host if colon and not self.source.startswith("/") else ""


@dataclass(frozen=True, kw_only=True, slots=True)
class NfsOperation:
    """One per-op statistics line; times are cumulative milliseconds, `errors` is None on
    kernels that do not write the ninth field."""

    name: str
    requests: int
    transmissions: int
    major_timeouts: int
    bytes_sent: int
    bytes_received: int
    queue_ms: int
    rtt_ms: int
    execute_ms: int
    errors: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class NfsStats:
    """The NFS client counters of one mount from mountstats.

    `read_bytes`/`write_bytes` are the bytes read from and written to the server in total
    (`bytes:` fields 5 and 6: page cache and O_DIRECT together), what moved on the wire.
    """

    statvers: str
    read_bytes: int
    write_bytes: int
    protocol: str
    operations: tuple[NfsOperation, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class MountStatsEntry:
    """One `device ... mounted on ...` block; `nfs` is None for a mount with no NFS lines."""

    source: str
    mountpoint: str
    fstype: str
    nfs: NfsStats | None


@dataclass(frozen=True, kw_only=True, slots=True)
class DiskStats:
    """One block device's cumulative I/O from diskstats, in bytes and completed requests."""

    major: int
    minor: int
    name: str
    reads: int
    read_bytes: int
    writes: int
    write_bytes: int


@dataclass(frozen=True, kw_only=True)
class Parsed:
    """What a file held: the readings, and the lines that did not parse."""

    mounts: tuple[Mount, ...] = ()
    stats: tuple[MountStatsEntry, ...] = ()
    disks: tuple[DiskStats, ...] = ()
    problems: tuple[LineProblem, ...] = field(default=())


def unescape(text: str) -> str:
    """mountinfo's and mountstats' octal escapes (`\\040` space, `\\011` tab, `\\012`,
    `\\134` backslash) decoded."""
    return _OCTAL.sub(lambda match: chr(int(match.group(1), 8)), text)


def parse_mountinfo(text: str, path: str = "mountinfo") -> Parsed:
    """Every mount in a mountinfo text; a malformed line is a problem, not a failure."""
    mounts: list[Mount] = []
    problems: list[LineProblem] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split()
        try:
            separator = fields.index("-", 6)
        except ValueError:
            problems.append(LineProblem(path=path, line=number, reason="no ' - ' separator"))
            continue
        if len(fields) < separator + 3:
            problems.append(
                LineProblem(path=path, line=number, reason="fewer than 3 fields after ' - '")
            )
            continue
        major, _, minor = fields[2].partition(":")
        if not (_is_count(fields[0]) and _is_count(major) and _is_count(minor)):
            reason = f"bad mount id or MAJ:MIN {fields[0][:40]!r} {fields[2][:40]!r}"
            problems.append(LineProblem(path=path, line=number, reason=reason))
            continue
        options = fields[5].split(",")
        super_options = fields[separator + 3].split(",") if len(fields) > separator + 3 else []
        mounts.append(
            Mount(
                mount_id=int(fields[0]),
                major=int(major),
                minor=int(minor),
                mountpoint=unescape(fields[4]),
                fstype=fields[separator + 1],
                source=unescape(fields[separator + 2]),
                read_only="ro" in options or "ro" in super_options,
            )
        )
    return Parsed(mounts=tuple(mounts), problems=tuple(problems))


def _mountstats_header(line: str) -> tuple[str, str, str, str] | None:
    """(source, mountpoint, fstype, statvers) of a `device ... mounted on ...` line."""
    if not line.startswith("device "):
        return None
    head, sep, rest = line[len("device ") :].partition(" mounted on ")
    if not sep:
        return None
    mountpoint, sep, tail = rest.rpartition(" with fstype ")
    if not sep:
        return None
    fstype, _, statvers = tail.partition(" statvers=")
    return unescape(head), unescape(mountpoint), fstype.strip(), statvers.strip()


def _operation(name: str, numbers: list[int]) -> NfsOperation | str:
    """A per-op line's numbers as a reading, or the reason they are not one."""
    if len(numbers) not in (8, 9):
        return f"operation {name}: expected 8 or 9 counters, got {len(numbers)}"
    return NfsOperation(
        name=name,
        requests=numbers[0],
        transmissions=numbers[1],
        major_timeouts=numbers[2],
        bytes_sent=numbers[3],
        bytes_received=numbers[4],
        queue_ms=numbers[5],
        rtt_ms=numbers[6],
        execute_ms=numbers[7],
        errors=numbers[8] if len(numbers) == 9 else None,
    )


class _NfsBlock:
    """The NFS lines of one mountstats block, as they are read."""

    def __init__(self, statvers: str) -> None:
        self.statvers = statvers
        self.bytes: list[int] | None = None
        self.protocol = ""
        self.operations: list[NfsOperation] = []
        self.in_operations = False

    def line(self, line: str) -> str | None:
        """Take one indented line; the reason it is malformed, or None."""
        key, _, value = line.strip().partition(":")
        if self.in_operations:
            match = _PER_OP.fullmatch(line)
            if match is None:
                return f"not a per-op statistics line: {line.strip()[:60]!r}"
            numbers = match.group(2).split()
            if not all(_is_count(n) for n in numbers):
                return f"operation {match.group(1)}: a counter of over 20 digits"
            found = _operation(match.group(1), [int(n) for n in numbers])
            if isinstance(found, str):
                return found
            self.operations.append(found)
            return None
        if line.strip() == "per-op statistics":
            self.in_operations = True
        elif key == "bytes":
            numbers = value.split()
            if len(numbers) != 8 or not all(_is_count(n) for n in numbers):
                return f"bytes: expected 8 counters, got {value.strip()[:60]!r}"
            self.bytes = [int(n) for n in numbers]
        elif key == "xprt":
            self.protocol = value.split()[0] if value.split() else ""
        return None

    def stats(self) -> NfsStats | None:
        if self.bytes is None and not self.operations:
            return None
        counters = self.bytes or [0] * 8
        return NfsStats(
            statvers=self.statvers,
            read_bytes=counters[4],
            write_bytes=counters[5],
            protocol=self.protocol,
            operations=tuple(self.operations),
        )


def parse_mountstats(text: str, path: str = "mountstats") -> Parsed:
    """Every mount in a mountstats text, NFS counters where the kernel wrote them."""
    entries: list[MountStatsEntry] = []
    problems: list[LineProblem] = []
    header: tuple[str, str, str, str] | None = None
    block: _NfsBlock | None = None
    bad_block = False

    def finish() -> None:
        if header is not None and not bad_block:
            source, mountpoint, fstype, _ = header
            nfs = block.stats() if block is not None else None
            entries.append(
                MountStatsEntry(source=source, mountpoint=mountpoint, fstype=fstype, nfs=nfs)
            )

    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if not line[0].isspace():
            finish()
            header = _mountstats_header(line)
            block, bad_block = None, False
            if header is None:
                problems.append(
                    LineProblem(path=path, line=number, reason=f"not a device line: {line[:60]!r}")
                )
            elif header[3]:
                block = _NfsBlock(header[3])
            continue
        if block is None or bad_block:
            continue
        reason = block.line(line)
        if reason is not None:
            # The whole block is dropped: half a mount's counters would read as a reset.
            bad_block = True
            problems.append(LineProblem(path=path, line=number, reason=reason))
    finish()
    return Parsed(stats=tuple(entries), problems=tuple(problems))


def parse_diskstats(text: str, path: str = "diskstats") -> Parsed:
    """Every block device in a diskstats text (14, 18 or 20 fields a line)."""
    disks: list[DiskStats] = []
    problems: list[LineProblem] = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        numbers = fields[:2] + fields[3:]
        if len(fields) < 14 or not all(_is_count(n) for n in numbers):
            reason = f"expected MAJ MIN NAME and 11 or more counters: {line.strip()[:60]!r}"
            problems.append(LineProblem(path=path, line=number, reason=reason))
            continue
        disks.append(
            DiskStats(
                major=int(fields[0]),
                minor=int(fields[1]),
                name=fields[2],
                reads=int(fields[3]),
                read_bytes=int(fields[5]) * SECTOR_BYTES,
                writes=int(fields[7]),
                write_bytes=int(fields[9]) * SECTOR_BYTES,
            )
        )
    return Parsed(disks=tuple(disks), problems=tuple(problems))


@dataclass(frozen=True, kw_only=True)
class LustreStats:
    """One Lustre client instance's counters: its filesystem name, bytes read and written,
    and each operation's sample count."""

    fsname: str
    read_bytes: int
    write_bytes: int
    operations: dict[str, int]


def parse_llite_stats(
    instance: str, text: str, path: str = "llite stats"
) -> LustreStats | LineProblem:
    """The stats file of llite instance `instance` (`FSNAME-INSTANCE`)."""
    read_bytes = write_bytes = 0
    operations: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0] in ("snapshot_time", "start_time", "elapsed_time"):
            continue
        if len(fields) < 4 or fields[2] != "samples" or not _is_count(fields[1]):
            return LineProblem(path=path, line=number, reason=f"not a stats line: {line[:60]!r}")
        name, count = fields[0], int(fields[1])
        if name in ("read_bytes", "write_bytes"):
            if len(fields) < 7 or not _is_count(fields[6]):
                return LineProblem(path=path, line=number, reason=f"{name}: no sum of bytes")
            if name == "read_bytes":
                read_bytes = int(fields[6])
            else:
                write_bytes = int(fields[6])
        else:
            operations[name] = count
    fsname = instance.rpartition("-")[0] or instance
    return LustreStats(
        fsname=fsname, read_bytes=read_bytes, write_bytes=write_bytes, operations=operations
    )


def lustre_fsname(mount: Mount) -> str | None:
    """The filesystem name of a Lustre mount (`MGS@tcp:/FSNAME`), None for another type."""
    if mount.fstype != "lustre":
        return None
    return mount.source.rpartition(":/")[2] or None


def watched_mounts(mounts: Iterable[Mount], named: tuple[str, ...]) -> list[Mount]:
    """The mounts to watch: those `named` (any filesystem type), else every network or
    parallel filesystem. A mount point listed twice (over-mounted) keeps its top mount."""
    chosen: dict[str, Mount] = {}
    for mount in mounts:
        if mount.mountpoint in named if named else mount.fstype in NETWORK_FSTYPES:
            chosen[mount.mountpoint] = mount  # later lines are mounted on top
    return [chosen[point] for point in sorted(chosen)]


def mount_of(path: str, mounts: Iterable[Mount]) -> Mount | None:
    """The mount `path` lies on: the longest mount point that contains it."""
    best: Mount | None = None
    for mount in mounts:
        point = mount.mountpoint.rstrip("/") + "/"
        if (path.rstrip("/") + "/").startswith(point) and (
            best is None or len(mount.mountpoint) >= len(best.mountpoint)
        ):
            best = mount
    return best


@dataclass(frozen=True, kw_only=True)
class MountFile:
    """A mount file's text; `host` when it is pid 1's, else `fallback` says why pid 1's
    could not be read and the text is this process's own (`self`)."""

    name: str
    text: str
    host: bool
    fallback: str | None


def read_mount_file(procfs: Path, name: str) -> MountFile | None:
    """`<procfs>/1/<name>` (the host's init: the host's mount namespace when `procfs` is the
    host's /proc, as node_exporter reads it), else `<procfs>/self/<name>` (pid 1 hidden by
    hidepid, or mountstats, readable by root only); None when `self`'s does not exist either
    (a kernel without mountstats). Raises when `self`'s exists but cannot be read."""
    try:
        text = (procfs / "1" / name).read_text(errors="replace")
    except OSError as exc:
        host_error = exc
    else:
        return MountFile(name=name, text=text, host=True, fallback=None)
    try:
        text = (procfs / "self" / name).read_text(errors="replace")
    except FileNotFoundError:
        return None
    reason = host_error.strerror or str(host_error)
    return MountFile(name=name, text=text, host=False, fallback=reason)


def reach(path: str, rootfs: str) -> str:
    """Where this process reaches the host's `path`: under `rootfs` (`/`: the path itself)."""
    return os.path.normpath(os.path.join(rootfs, path.lstrip("/")))


def from_rootfs(path: str, rootfs: str) -> str | None:
    """The host's path of `path`, a path of this process that lies under `rootfs`; None for
    one outside it (the container's own mounts: its /, /proc, ...)."""
    root = os.path.normpath(rootfs)
    if root == "/":
        return path
    if path == root:
        return "/"
    if path.startswith(root + "/"):
        return path[len(root) :]
    return None


_Placed = TypeVar("_Placed", Mount, MountStatsEntry)


def under_rootfs(items: Iterable[_Placed], rootfs: str) -> tuple[_Placed, ...]:
    """This process's mounts (mountinfo or mountstats entries) that lie under `rootfs`,
    named by the host's mount points; the others, the container's own, left out."""
    found: list[_Placed] = []
    for item in items:
        point = from_rootfs(item.mountpoint, rootfs)
        if point is not None:
            found.append(dataclasses.replace(item, mountpoint=point))
    return tuple(found)
