"""The kernel log trusts only the kernel: an event's text in a record that user space wrote
to /dev/kmsg (any facility but the kernel's) is counted as ignored, never as the event; and
NVIDIA's NVSentinel's wording of a GPU that fell off the bus is read."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import pytest

from fleetwatch.collectors.sources.kmsg import (
    MAX_RECORD,
    FallenOffBus,
    KernelXid,
    KmsgReader,
    Unreadable,
    parse_record,
)
from fleetwatch.collectors.xid import XidCollector, XidLedger
from fleetwatch.sim import loopback_servers as servers
from tests.gpu.simnode import samples, simulated

XID_TEXT = "NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus."


@pytest.mark.parametrize(
    ("priority", "kernel"),
    [(0, True), (3, True), (7, True), (8, False), (12, False), (14, False), (191, False)],
)
def test_only_kernel_facility_records_are_events(priority: int, kernel: bool) -> None:
    """Priority is facility * 8 + level: 0-7 is the kernel's, 8 and up another facility's
    (user space: what a write to /dev/kmsg gets)."""
    found = parse_record(f"{priority},5,1000000,-;{XID_TEXT}")
    if kernel:
        assert isinstance(found, KernelXid)
        assert (found.xid, found.pci_bus_id) == (79, "0000:18:00")
        return
    assert isinstance(found, Unreadable)
    assert found.reason == "user_space"
    facility = priority >> 3
    assert found.why.startswith(f"written to the kernel log from user space (facility {facility})")


@pytest.mark.parametrize(
    "message",
    [
        "NVRM: The NVIDIA GPU 0000:18:00.0 (PCI ID: 10de:2330) installed in this system has "
        "fallen off the bus and is not responding to commands.",
        "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
        "nfs: server fs01 not responding, still trying",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 48",
    ],
)
def test_user_space_forgeries_of_every_event_are_ignored(message: str) -> None:
    forged = parse_record(f"12,5,1000000,-;{message}")
    assert isinstance(forged, Unreadable)
    assert forged.reason == "user_space"
    assert not isinstance(parse_record(f"3,5,1000000,-;{message}"), Unreadable)


def test_user_space_records_without_an_event_are_not_counted() -> None:
    """systemd and friends log to /dev/kmsg all day: only a forgery of an event counts."""
    assert parse_record("30,5,1000000,-;systemd[1]: Started Session 3 of user root.") is None


@pytest.mark.parametrize(
    "message",
    [
        # NVSentinel's own test text: the journal's indented continuation lines.
        "NVRM: The NVIDIA GPU 0000:b3:00.0\n               NVRM: installed in this system has\n"
        "               NVRM: fallen off the bus and is not responding to commands.",
        "NVRM: The NVIDIA GPU 0000:b3:00.0 has fallen off the bus and is not responding to "
        "commands.",
        "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) was installed in this system"
        " and has\nNVRM: fallen off the bus and is not responding to commands.",
    ],
)
def test_nvsentinel_fallen_off_the_bus_wording(message: str) -> None:
    escaped = message.replace("\n", "\\x0a")
    found = parse_record(f"3,9,2000000,-;{escaped}")
    assert found == FallenOffBus(pci_bus_id="0000:b3:00", sequence=9, seconds=2.0)


def test_overlong_lines_and_numbers_are_malformed_not_errors() -> None:
    long_line = f"3,1,1,-;{XID_TEXT}" + "x" * MAX_RECORD
    found = parse_record(long_line)
    assert isinstance(found, Unreadable)
    assert found.reason == "malformed"
    runaway = parse_record(f"{'9' * 5000},1,1,-;{XID_TEXT}")  # int() refuses 4300+ digits
    assert isinstance(runaway, Unreadable)
    assert runaway.reason == "no_timestamp"


def test_reader_keeps_memory_bounded_on_a_line_without_end(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_bytes(b"3,1,1,-;" + b"\xc3\xa9" * (1 << 20))  # 2 MiB, no newline yet
    reader = KmsgReader(path=log)
    try:
        assert reader.read(0.0) == []
        with log.open("ab") as more:
            more.write(b"\n" + f"3,2,1,-;{XID_TEXT}\n".encode())
        long_line, xid_line = reader.read(0.0)
    finally:
        reader.close()
    assert len(long_line) == MAX_RECORD + 1
    found = parse_record(long_line)
    assert isinstance(found, Unreadable)
    assert found.reason == "malformed"
    assert isinstance(parse_record(xid_line), KernelXid)


def _kmsg_writable() -> str | None:
    """Why the real /dev/kmsg test cannot run here, or None."""
    if os.geteuid() != 0:
        return "writing a record to /dev/kmsg and reading it back needs root"
    if not os.access("/dev/kmsg", os.R_OK | os.W_OK):
        return "/dev/kmsg is not readable and writable here"
    return None


class WatchedLog:
    """The real /dev/kmsg reader, noting every line it hands the collector and how many
    reads it has served (a read after the one that returned a line means that line has
    been handled: the collector's thread reads again only when done)."""

    def __init__(self, reader: KmsgReader) -> None:
        self._reader = reader
        self.opened_at = reader.opened_at
        self.lines: list[tuple[int, str]] = []  # (the read that returned it, the line)
        self.reads = 0

    def now(self) -> float:
        return self._reader.now()

    def read(self, timeout: float) -> list[str]:
        self.reads += 1
        number = self.reads
        lines = self._reader.read(timeout)
        self.lines.extend((number, line) for line in lines)
        return lines

    def close(self) -> None:
        self._reader.close()


@pytest.mark.skipif(_kmsg_writable() is not None, reason=str(_kmsg_writable()))
def test_a_record_written_to_dev_kmsg_from_user_space_is_not_an_xid() -> None:
    """The attack itself: a root process writes an Xid's text to the real /dev/kmsg; the
    exporter's kernel-log source reads it back and counts it as user_space, not as an Xid."""
    _, source = simulated(at=120.0)
    marker = f"fleetwatch-test-{uuid.uuid4().hex}"
    kernel_log = WatchedLog(KmsgReader(path=Path("/dev/kmsg")))
    collector = XidCollector(
        source=source, kernel_log=kernel_log, ledger=XidLedger(window=5.0), nvml_events=False
    )
    try:
        collector.start()
        with open("/dev/kmsg", "w") as kmsg:  # no <prio> prefix: the kernel gives it LOG_USER
            kmsg.write(f"NVRM: Xid (PCI:0000:fe:1f): 79, pid=1, {marker} forged\n")

        def forged() -> list[tuple[int, str]]:
            return [(n, line) for n, line in kernel_log.lines if marker in line]

        servers.wait_until(lambda: bool(forged()), timeout=10, what="the forged record read back")
        ((returned_by, _),) = forged()
        servers.wait_until(
            lambda: kernel_log.reads > returned_by, timeout=10, what="the record handled"
        )
    finally:
        collector.close()
    ((_, line),) = forged()
    assert int(line.split(",", 1)[0]) >> 3 == 1  # the kernel marked it: facility user
    assert collector.ledger.counts() == {}  # no Xid, new or old, from it
    unreadable = samples(collector.collect(), "fleetwatch_kmsg_unreadable_records")
    assert unreadable[(("reason", "user_space"),)] >= 1


def _in_poll(thread: threading.Thread) -> bool:
    """Whether `thread` sleeps in poll (its kernel wait channel; where the kernel does not
    show one, that it sleeps at all)."""
    task = Path(f"/proc/self/task/{thread.native_id}")
    try:
        wchan = (task / "wchan").read_text()
        state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return "poll" in wchan if wchan not in ("", "0") else state == "S"


@pytest.mark.skipif(_kmsg_writable() is not None, reason=str(_kmsg_writable()))
def test_a_dev_kmsg_reader_sleeps_until_a_record_and_close_wakes_it() -> None:
    """On the device a read with nothing new sleeps in poll, however long its timeout, and
    returns as soon as the kernel logs a record (a timer would have slept the minute); a
    close() wakes a sleeping read at once."""
    reader = KmsgReader(path=Path("/dev/kmsg"))
    marker = f"fleetwatch-test-{uuid.uuid4().hex}"
    seen: list[str] = []

    def until_marker() -> None:
        while not any(marker in line for line in seen):
            seen.extend(reader.read(60.0))

    try:
        while reader.read(0):  # the history
            pass
        thread = threading.Thread(target=until_marker, daemon=True)
        thread.start()
        servers.wait_until(lambda: _in_poll(thread), timeout=10, what="the read in poll")
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"{marker}\n")
        thread.join(10)
        assert not thread.is_alive()
        sleeper = threading.Thread(target=reader.read, args=(60.0,), daemon=True)
        sleeper.start()
        servers.wait_until(lambda: _in_poll(sleeper), timeout=10, what="the second read in poll")
    finally:
        reader.close()
    sleeper.join(10)
    assert not sleeper.is_alive()
    assert reader.read(60.0) == []  # closed: nothing, at once
