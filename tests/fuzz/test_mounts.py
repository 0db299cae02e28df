"""Procfs mount files and Lustre stats, fuzzed from the kernel's real formats
(testbed/mounts.py): mountinfo, mountstats, diskstats and llite stats. A malformed line is a
`LineProblem`, never an exception; every counter read is a non-negative integer."""

from __future__ import annotations

from typing import Final

from hypothesis import given

from fleetwatch.collectors.sources.mounts import (
    LineProblem,
    LustreStats,
    Parsed,
    parse_diskstats,
    parse_llite_stats,
    parse_mountinfo,
    parse_mountstats,
)
from testbed.mounts import DISKSTATS, LLITE_STATS, LLITE_STATS_DEBUGFS, MOUNTINFO, MOUNTSTATS
from tests.fuzz.harness import FUZZ, bounded_label, exercise, finite_counts, named, peak_bytes
from tests.fuzz.mutations import MIB, mutated_text

# A bound on what a parsed line may hold: up to 4 mutations each grow a field by 1 MiB.
_LABEL: Final = 8 * MIB


def _problems(parsed: Parsed) -> bool:
    return bool(parsed.problems)


def parsed_holds(parsed: Parsed) -> None:
    """Mounts with numeric ids and bounded strings; every counter a non-negative integer."""
    for mount in parsed.mounts:
        finite_counts((mount.mount_id, mount.major, mount.minor))
        for text in (mount.mountpoint, mount.fstype, mount.source):
            bounded_label(text, _LABEL)
    for entry in parsed.stats:
        bounded_label(entry.mountpoint, _LABEL)
        if entry.nfs is None:
            continue
        finite_counts((entry.nfs.read_bytes, entry.nfs.write_bytes))
        for op in entry.nfs.operations:
            finite_counts(
                (op.requests, op.transmissions, op.major_timeouts, op.bytes_sent)
                + (op.bytes_received, op.queue_ms, op.rtt_ms, op.execute_ms)
                + (() if op.errors is None else (op.errors,))
            )
    for disk in parsed.disks:
        finite_counts((disk.major, disk.minor, disk.reads, disk.writes))
        finite_counts((disk.read_bytes, disk.write_bytes))
    for problem in parsed.problems:
        assert problem.line >= 1
        named(problem.reason)


@FUZZ
@given(mutated_text([MOUNTINFO]))
def test_mountinfo(text: str) -> None:
    exercise("mountinfo", parse_mountinfo, text, malformed=_problems, holds=parsed_holds)


@FUZZ
@given(mutated_text([MOUNTSTATS]))
def test_mountstats(text: str) -> None:
    exercise("mountstats", parse_mountstats, text, malformed=_problems, holds=parsed_holds)


@FUZZ
@given(mutated_text([DISKSTATS]))
def test_diskstats(text: str) -> None:
    exercise("diskstats", parse_diskstats, text, malformed=_problems, holds=parsed_holds)


def _lustre(text: str) -> LustreStats | LineProblem:
    return parse_llite_stats("scratch-ffff8f0a1b2c3000", text)


def lustre_holds(found: LustreStats | LineProblem) -> None:
    if isinstance(found, LineProblem):
        named(found.reason)
        return
    assert found.fsname == "scratch"
    finite_counts((found.read_bytes, found.write_bytes, *found.operations.values()))
    for name in found.operations:
        bounded_label(name, _LABEL)


@FUZZ
@given(mutated_text([LLITE_STATS, LLITE_STATS_DEBUGFS]))
def test_lustre_llite_stats(text: str) -> None:
    exercise(
        "Lustre llite stats",
        _lustre,
        text,
        malformed=lambda found: isinstance(found, LineProblem),
        holds=lustre_holds,
    )


def test_a_megabyte_line_costs_memory_in_proportion() -> None:
    """A 1 MiB mountinfo line is one problem; parsing it holds a few copies at most."""
    text = MOUNTINFO + "99 22 0:60 / /x rw " + "a" * MIB + "\n"
    parsed: list[Parsed] = []
    peak = peak_bytes(lambda: parsed.append(parse_mountinfo(text)))
    assert len(parsed[0].problems) == 1
    assert peak < 8 * MIB


def test_digits_int_refuses_are_problems_not_errors() -> None:
    """Found by the fuzzer: "²" passes str.isdigit() and a 5000-digit count passes it too,
    and int() refuses both; each is now a line problem."""
    for number in ("\u00b2", "9" * 5000):
        disk = f"259 0 nvme0n1 {number} 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
        assert len(parse_diskstats(disk).problems) == 1
        mount = f"{number} 1 259:2 / / rw shared:1 - ext4 /dev/nvme0n1p2 rw\n"
        assert len(parse_mountinfo(mount).problems) == 1
        stats = f"read_bytes {number} samples [bytes] 1 2 3\n"
        assert isinstance(parse_llite_stats("fs-1", stats), LineProblem)
        block = MOUNTSTATS.replace("READ: 1298 ", f"READ: {number} ", 1)
        assert block != MOUNTSTATS
        assert parse_mountstats(block).problems


def test_a_per_op_line_with_a_run_of_blanks_is_read_in_linear_time() -> None:
    """`[0-9 ]+\\s*` backtracked quadratically over a long run of blanks before garbage."""
    block = MOUNTSTATS.replace("READ: 1298 ", "READ: 1298 " + " " * MIB + "x ", 1)
    assert parse_mountstats(block).problems
    assert not parse_mountstats(MOUNTSTATS).problems


def test_a_reason_quotes_an_excerpt_of_a_huge_mount_id() -> None:
    """Found by the fuzzer (`named`): a mount id of 1 MiB was quoted whole in the reason the
    collector logs."""
    (problem,) = parse_mountinfo("2" * MIB + " 1 259:2 / / rw shared:1 - ext4 /dev/x rw\n").problems
    named(problem.reason)
    assert problem.reason.startswith("bad mount id or MAJ:MIN '2222")
