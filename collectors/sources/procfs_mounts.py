"""One read of the host's procfs mount files: the mount table, NFS client statistics,
block-device counters and Lustre client statistics, parsed (`sources.mounts`) into one
value the storage collector reads a cycle from.

The mount table is required, and parsed again only when its text changed (`MountTable`:
mounts come and go rarely, while the counters of mountstats move every cycle and are parsed
each time); the file itself is read every cycle, so a mount that appears or vanishes shows
in the next one. The statistics files are optional (a kernel without mountstats, a node
without diskstats or Lustre): what is missing leaves its counters out, never the mount. The
storage collector runs this on a lane of its own, since procfs reads can block too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fleetwatch.collectors.sources.mounts import (
    LineProblem,
    LustreStats,
    Mount,
    MountStatsEntry,
    Parsed,
    parse_diskstats,
    parse_llite_stats,
    parse_mountinfo,
    parse_mountstats,
    read_mount_file,
    under_rootfs,
)


@dataclass(frozen=True, kw_only=True)
class ProcReading:
    """One read of the procfs mount files (the stats files are optional); `fallbacks` names
    each mount file read from `self` because pid 1's could not be, with the reason."""

    mounts: tuple[Mount, ...]
    stats: dict[str, MountStatsEntry]
    disks: dict[tuple[int, int], tuple[int, int, int, int]]
    lustre: dict[str, LustreStats]
    problems: tuple[LineProblem, ...]
    fallbacks: tuple[tuple[str, str], ...] = ()


class MountTable:
    """mountinfo's last text and its parse: the same text is not parsed twice running.

    Used from one thread at a time (the storage collector's procfs lane)."""

    def __init__(self) -> None:
        self._text: str | None = None
        self._parsed: Parsed | None = None

    def parse(self, text: str) -> Parsed:
        """The mounts of `text` (and its malformed lines), parsed when it changed."""
        if self._parsed is None or text != self._text:
            self._parsed = parse_mountinfo(text, "mountinfo")
            self._text = text
        return self._parsed


def llite_dirs(procfs: Path, sysfs: Path) -> tuple[Path, ...]:
    """Where a Lustre client keeps its llite instances' stats: under /proc before Lustre
    2.12, in debugfs (mounted at `<sysfs>/kernel/debug`) from 2.12 on."""
    return (procfs / "fs" / "lustre" / "llite", sysfs / "kernel" / "debug" / "lustre" / "llite")


def read_procfs(
    root: Path, *, rootfs: str, llite: tuple[Path, ...], table: MountTable | None = None
) -> ProcReading:
    """mountinfo (required), mountstats and diskstats (absent on some kernels) under `root`,
    and the Lustre client stats in the `llite` directories (`llite_dirs`).

    A mount table read from `self` names mounts as this process sees them: with a `rootfs`
    other than `/` (a container that reaches the host's root there), only those under it are
    kept, named by the host's mount points."""
    info = read_mount_file(root, "mountinfo")
    if info is None:
        raise FileNotFoundError(f"no mountinfo under {root / '1'} or {root / 'self'}")
    parsed = (table or MountTable()).parse(info.text)
    mounts = parsed.mounts if info.host else under_rootfs(parsed.mounts, rootfs)
    problems = list(parsed.problems)
    stats: dict[str, MountStatsEntry] = {}
    disks: dict[tuple[int, int], tuple[int, int, int, int]] = {}
    mountstats = read_mount_file(root, "mountstats")
    if mountstats is not None:  # else no mountstats (a kernel without it): capacity still read
        found = parse_mountstats(mountstats.text)
        entries = found.stats if mountstats.host else under_rootfs(found.stats, rootfs)
        stats = {entry.mountpoint: entry for entry in entries}
        problems.extend(found.problems)
    try:
        found = parse_diskstats((root / "diskstats").read_text(errors="replace"))
    except FileNotFoundError:
        pass  # no diskstats: local mounts have capacity but no I/O counters
    else:
        disks = {
            (d.major, d.minor): (d.reads, d.read_bytes, d.writes, d.write_bytes)
            for d in found.disks
        }
        problems.extend(found.problems)
    lustre = _read_llite(llite, problems)
    return ProcReading(
        mounts=mounts,
        stats=stats,
        disks=disks,
        lustre=lustre,
        problems=tuple(problems),
        fallbacks=tuple(
            (f"1/{file.name}", file.fallback)
            for file in (info, mountstats)
            if file is not None and file.fallback is not None
        ),
    )


def _read_llite(dirs: tuple[Path, ...], problems: list[LineProblem]) -> dict[str, LustreStats]:
    """Lustre client stats by filesystem name, from the first of `dirs` that lists an
    instance (a name mounted twice is left out: which instance is which mount cannot be
    told from its stats). An unreadable directory (debugfs is root's) lists nothing."""
    files: dict[str, Path] = {}
    for directory in dirs:
        for stats in sorted(directory.glob("*/stats")):
            files.setdefault(stats.parent.name, stats)
    found: dict[str, list[LustreStats]] = {}
    for instance, stats in sorted(files.items()):
        try:
            text = stats.read_text(errors="replace")
        except OSError:
            continue  # the instance went away while listed (an unmount), or is root's
        parsed = parse_llite_stats(instance, text, "llite")
        if isinstance(parsed, LineProblem):
            problems.append(parsed)
        else:
            found.setdefault(parsed.fsname, []).append(parsed)
    return {name: only[0] for name, only in found.items() if len(only) == 1}
