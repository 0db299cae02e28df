"""The procfs mount parsers on the kernel's real formats, absurd values included."""

from __future__ import annotations

from fleetwatch.collectors.sources.mounts import (
    Mount,
    mount_of,
    parse_diskstats,
    parse_mountinfo,
    parse_mountstats,
    watched_mounts,
)
from testbed.mounts import DISKSTATS, MOUNTINFO, MOUNTSTATS


def test_mountinfo_gives_every_mount_with_escapes_and_read_only() -> None:
    parsed = parse_mountinfo(MOUNTINFO)
    assert not parsed.problems
    by_point = {m.mountpoint: m for m in parsed.mounts}
    ckpt = by_point["/mnt/checkpoints"]
    assert (ckpt.fstype, ckpt.source, ckpt.server) == ("nfs4", "10.0.0.5:/export/ckpt", "10.0.0.5")
    assert not ckpt.read_only
    assert by_point["/mnt/datasets"].read_only
    assert "/mnt/with space" in by_point
    scratch = by_point["/scratch"]
    assert (scratch.major, scratch.minor, scratch.server) == (259, 3, "")


def test_mountstats_keeps_wrapped_and_odd_counters_as_read() -> None:
    parsed = parse_mountstats(MOUNTSTATS)
    assert not parsed.problems
    by_point = {entry.mountpoint: entry for entry in parsed.stats}
    assert by_point["/proc"].nfs is None
    ckpt = by_point["/mnt/checkpoints"].nfs
    assert ckpt is not None
    assert (ckpt.statvers, ckpt.protocol) == ("1.1", "tcp")
    assert (ckpt.read_bytes, ckpt.write_bytes) == (1210214218, 21474836480)
    access = next(op for op in ckpt.operations if op.name == "ACCESS")
    assert access.queue_ms == 18446743919241604546  # a wrapped u64, never negative
    assert access.transmissions < access.requests
    assert access.errors == 3
    assert "/mnt/with space" in by_point


def test_statvers_1_0_has_no_errors_field() -> None:
    datasets = {e.mountpoint: e for e in parse_mountstats(MOUNTSTATS).stats}["/mnt/datasets"].nfs
    assert datasets is not None
    assert datasets.statvers == "1.0"
    read = next(op for op in datasets.operations if op.name == "READ")
    assert (read.requests, read.transmissions, read.major_timeouts) == (40960, 40961, 1)
    assert (read.rtt_ms, read.execute_ms, read.errors) == (330311, 330801, None)


def test_a_malformed_block_is_named_and_others_survive() -> None:
    broken = MOUNTSTATS.replace("\t        READ: 1298 1298 0", "\t        READ: 1298 x 0", 1)
    broken = broken.replace("device proc mounted on /proc", "garbage here", 1)
    parsed = parse_mountstats(broken, "mountstats")
    reasons = [(p.line, p.reason) for p in parsed.problems]
    assert len(reasons) == 2, reasons
    assert reasons[0] == (2, "not a device line: 'garbage here with fstype proc'")
    assert "not a per-op statistics line" in reasons[1][1]
    points = {entry.mountpoint for entry in parsed.stats}
    assert "/mnt/checkpoints" not in points  # half a mount's counters would read as a reset
    assert {"/mnt/datasets", "/mnt/with space", "/scratch"} <= points


def test_wrong_counter_count_is_a_problem() -> None:
    text = MOUNTSTATS.replace("\t      LOOKUP: 1 1 0 120 236 0 0 0\n", "\t      LOOKUP: 1 1 0\n")
    problems = parse_mountstats(text).problems
    assert [p.reason for p in problems] == ["operation LOOKUP: expected 8 or 9 counters, got 3"]


def test_malformed_mountinfo_lines_are_named() -> None:
    text = MOUNTINFO + "99 22 0:60 / /broken rw shared:40\nx 22 0:61 / /bad rw - nfs a:/b rw\n"
    parsed = parse_mountinfo(text, "mountinfo")
    assert [(p.line, p.reason) for p in parsed.problems] == [
        (len(MOUNTINFO.splitlines()) + 1, "no ' - ' separator"),
        (len(MOUNTINFO.splitlines()) + 2, "bad mount id or MAJ:MIN 'x' '0:61'"),
    ]
    assert len(parsed.mounts) == len(MOUNTINFO.splitlines())


def test_diskstats_in_bytes() -> None:
    parsed = parse_diskstats(DISKSTATS + "garbage\n")
    disk = {(d.major, d.minor): d for d in parsed.disks}[(259, 3)]
    assert (disk.reads, disk.read_bytes, disk.writes, disk.write_bytes) == (
        1200,
        2097152 * 512,
        4096,
        8388608 * 512,
    )
    assert len(parsed.problems) == 1


def test_network_mounts_are_watched_by_default_and_named_ones_whatever_their_type() -> None:
    mounts = parse_mountinfo(MOUNTINFO).mounts
    assert [m.mountpoint for m in watched_mounts(mounts, ())] == [
        "/mnt/checkpoints",
        "/mnt/datasets",
        "/mnt/with space",
    ]
    assert [m.mountpoint for m in watched_mounts(mounts, ("/scratch",))] == ["/scratch"]


def test_mount_of_picks_the_longest_mount_point() -> None:
    mounts = parse_mountinfo(MOUNTINFO).mounts
    found = mount_of("/mnt/checkpoints/fleetwatch", mounts)
    assert isinstance(found, Mount)
    assert found.mountpoint == "/mnt/checkpoints"
    root = mount_of("/mnt/checkpointsX/fleetwatch", mounts)
    assert root is not None
    assert root.mountpoint == "/"
