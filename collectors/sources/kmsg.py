r"""Kernel-log reader: NVRM Xid, fallen-off-the-bus and NVSwitch SXid records from /dev/kmsg.

NVML delivers Xid events only to an event set registered at the time; the kernel log also
holds what was logged before the exporter started (or while it was down). `KmsgReader`
reads /dev/kmsg records without blocking (each read returns one record, `EPIPE` means
records were overwritten before we read them) and sleeps in `poll` until the kernel logs
the next one, so it wakes for records, not on a timer; a regular file of records in the
same format (tests use them) is read the same way, from its start, then whatever is
appended, looked at again every second since nothing says when it grows.

Every /dev/kmsg record is `<prio>,<seq>,<usec>,<flags>[,...];<message>`, continuation lines
(` KEY=value`) after it. `<usec>` is the kernel's `local_clock()` at logging time, in
microseconds: the clock `CLOCK_MONOTONIC` follows (both stop during suspend, unlike
`CLOCK_BOOTTIME`). A reader notes `CLOCK_MONOTONIC` when it opens the log (`opened_at`):
records stamped before it are history, logged before the exporter was there to see them.

`parse_record` turns one record into a `KernelXid`, `FallenOffBus`, `SwitchXid` or a storage
event (`StorageEvent`, fleetwatch.collectors.sources.kmsg_storage); other
messages give None. The message is unescaped first (the kernel writes every byte below
0x20 or above 0x7e as `\xNN`, so a report the driver prints over several lines arrives as
one record with `\x0a` in it). Xid lines with or without the `PCI:` prefix older drivers
leave out, and PCI addresses with or without a domain, are read. A line that is not a
record with a timestamp, or an Xid, SXid or fallen-off-the-bus record whose fields do not
parse, gives `Unreadable` with a bounded reason (`no_timestamp`, `malformed`, `binary`)
and a sentence saying why (the collector counts it): never an exception, never an event.

Only the kernel is trusted. `<prio>` is the syslog priority, facility * 8 + level; the kernel
logs with facility 0 (`kern`), and a record a process writes to /dev/kmsg gets the user
facility (1) unless it names another, never 0 (printk_dev_write). Any root process of any
container that can open /dev/kmsg could otherwise forge an Xid and have its node drained, so a
record of another facility that reads as an event gives `Unreadable` with reason `user_space`
(counted, logged once), never the event. A record longer than the kernel ever hands out
(`MAX_RECORD` characters) is `malformed`, unread: it did not come from the kernel either, and
a line of megabytes must not cost the regexes their time.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import select
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol

from fleetwatch.catalog.nvidia_xids import NVLINK5_XIDS
from fleetwatch.collectors.sources.kmsg_storage import StorageEvent, parse_storage

log = logging.getLogger(__name__)

DEFAULT_PATH: Final = Path("/dev/kmsg")
# "<prio>,<seq>,<usec since boot>,<flags>[,...];<message>" — the /dev/kmsg record header. The
# numbers are bounded (a u64 has 20 digits) so that int() never meets a runaway digit string.
_RECORD: Final = re.compile(r"^(\d{1,20}),(\d{1,20}),(\d{1,20}),[^;]*;(.*)$")
# The kernel's own facility (LOG_KERN): prio >> 3 of every record printk wrote.
KERNEL_FACILITY: Final = 0
# The longest line /dev/kmsg hands out: one read of a record fills at most CONSOLE_EXT_LOG_MAX
# (8192) bytes, header, escaped message and dictionary together.
MAX_RECORD: Final = 8192
# The kernel escapes every byte of a message below 0x20 (newline, tab) or above 0x7e as
# "\xNN"; a literal backslash arrives as "\x5c", so each "\xNN" is exactly one byte.
_ESCAPE: Final = re.compile(r"\\x([0-9a-fA-F]{2})")
# A PCI address with or without its domain: "0000:18:00.0", "00000000:18:00", "18:00.0".
_PCI: Final = r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
# "NVRM: Xid (PCI:0000:18:00): 48, ..." and, before the driver added "PCI:",
# "NVRM: Xid (0000:03:00): 14, Channel 00000001".
_XID: Final = re.compile(
    rf"NVRM: Xid \((?:PCI:)?(?P<pci>{_PCI})\): (?P<xid>\d{{1,4}})(?:,\s*(?P<rest>.*))?$",
    re.DOTALL,
)
# The driver's own fallen-off-the-bus report, one record whose lines the driver splits:
#   "NVRM: The NVIDIA GPU 0000:18:00.0\nNVRM: (PCI ID: 10de:2901) installed in this system
#    has\nNVRM: fallen off the bus and is not responding to commands." (PCI ID optional; as
#    NVIDIA's NVSentinel reads it, whatever stands between the address and "fallen off the
#    bus": "The NVIDIA GPU 0000:b3:00.0 has fallen off the bus" too),
#   "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus." (also "GPU at PCI:...", a bus id
#    without domain, or no id at all).
_FALLEN: Final = (
    re.compile(rf"NVRM: The NVIDIA GPU (?P<pci>{_PCI})\b.{{0,200}}?fallen off the bus", re.DOTALL),
    re.compile(rf"NVRM: (?:GPU (?:at )?(?:PCI:)?(?P<pci>{_PCI}): )?GPU has fallen off the bus"),
)
# "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 ..." opens an SXid;
# the driver's follow-up lines ("12028, Severity 0 Engine instance ...", "Data {...}")
# repeat the code without a severity and are not counted again.
_SXID: Final = re.compile(
    rf"nvidia-(?P<device>nvswitch\d+): SXid \((?:PCI:)?(?P<pci>{_PCI})\): (?P<sxid>\d{{1,5}}), "
    r"(?P<rest>.*)$",
    re.DOTALL,
)
# Xid 154's text: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)".
_RECOVERY: Final = re.compile(r"recovery action changed from 0x[0-9a-fA-F]+ .*?to (0x[0-9a-fA-F]+)")
# Xids 144-150 (NVLink5): "<unit> <Fatal|Nonfatal> XC<n> i<n> Link <nn> (<intrInfo>
# <errorStatus> <debug data>...)".
_NVLINK5: Final = re.compile(
    r"^(?P<unit>[A-Za-z0-9_]+) (?P<severity>[A-Za-z-]+)\b[^(]*"
    r"\((?P<intr>0x[0-9a-fA-F]{1,8}) (?P<status>0x[0-9a-fA-F]{1,8})\b"
)
RECOVERY_XID: Final = 154
# Lines after the first of a multi-line message repeat the driver's prefix.
_CONTINUATION: Final = re.compile(r"\s*\n\s*(?:NVRM:\s*)?")
_READ_SIZE: Final = 8192
FILE_LOOK_SECONDS: Final = 1.0
"""How often a kernel log that does not say when it grows (a file, the simulation) is read."""


@dataclass(frozen=True, kw_only=True)
class NvlinkFields:
    """What an NVLink5 Xid (144-150) message says, for NVIDIA's decode table."""

    unit: str
    fatal: bool
    intr_info: int
    error_status: int


@dataclass(frozen=True, kw_only=True)
class KernelXid:
    """One Xid from the kernel log, with the record's sequence number and timestamp.

    `recovery_action`: for Xid 154, the code of the recovery action it announces (NVML's
    numbering; None when the text names none). `nvlink`: for Xids 144-150, the message's
    fields (None when they do not parse)."""

    pci_bus_id: str
    xid: int
    sequence: int
    seconds: float
    recovery_action: int | None = None
    nvlink: NvlinkFields | None = None


@dataclass(frozen=True, kw_only=True)
class FallenOffBus:
    """The driver's "GPU has fallen off the bus" line; `pci_bus_id` is "" when it names none."""

    pci_bus_id: str
    sequence: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class SwitchXid:
    """One NVSwitch SXid (the first line of its report)."""

    device: str
    pci_bus_id: str
    sxid: int
    fatal: bool
    sequence: int
    seconds: float


UnreadableReason = Literal["no_timestamp", "malformed", "binary", "user_space"]
UNREADABLE_REASONS: Final[tuple[UnreadableReason, ...]] = (
    "no_timestamp",
    "malformed",
    "binary",
    "user_space",
)


@dataclass(frozen=True, kw_only=True)
class Unreadable:
    """A line that is not a timestamped record, an Xid, SXid or fallen-off-the-bus record
    that does not parse, or an event's text in a record the kernel did not write: `reason` is
    the bounded class (a metric label), `why` says what."""

    reason: UnreadableReason
    why: str
    line: str


KernelEvent = KernelXid | FallenOffBus | SwitchXid | StorageEvent


def normalize_pci(bus_id: str) -> str:
    """`00000000:18:00.0` (NVML), `0000:18:00` or `18:00.0` (kernel log) → `0000:18:00`.

    An address without a domain is in domain 0, the only one the driver leaves out."""
    parts = bus_id.lower().split(".")[0].split(":")
    domain, bus, device = (["0000", *parts] if len(parts) == 2 else parts)[-3:]
    return f"{domain[-4:].rjust(4, '0')}:{bus}:{device}"


def unescape(message: str) -> str:
    r"""A /dev/kmsg message with its "\xNN" escapes turned back into the bytes they stand for
    (UTF-8; an invalid sequence becomes U+FFFD)."""
    if "\\x" not in message:
        return message
    raw = bytearray()
    last = 0
    for escape in _ESCAPE.finditer(message):
        raw += message[last : escape.start()].encode()
        raw.append(int(escape[1], 16))
        last = escape.end()
    raw += message[last:].encode()
    return raw.decode(errors="replace")


def _unreadable(line: str, message: str, what: str) -> Unreadable:
    """An unreadable record: `binary` when the message holds bytes no driver prints
    (control characters other than newline and tab, or invalid UTF-8), else `malformed`."""
    junk = "\ufffd" in message or any(
        (ord(c) < 0x20 and c not in "\n\t") or ord(c) == 0x7F for c in message
    )
    if junk:
        return Unreadable(reason="binary", why=f"{what} record holds binary data", line=line)
    return Unreadable(reason="malformed", why=f"{what} record does not parse", line=line)


def _recovery_action(text: str) -> int | None:
    """The code of the action an Xid 154 text changes to."""
    found = _RECOVERY.search(text)
    return None if found is None else int(found[1], 16)


def _nvlink_fields(text: str) -> NvlinkFields | None:
    """The unit, severity and first two registers of an NVLink5 Xid text."""
    found = _NVLINK5.search(text)
    if found is None:
        return None
    return NvlinkFields(
        unit=found["unit"],
        fatal=found["severity"].lower() == "fatal",
        intr_info=int(found["intr"], 16),
        error_status=int(found["status"], 16),
    )


def parse_record(line: str) -> KernelEvent | Unreadable | None:
    r"""The event in one kmsg record; None for other messages and continuation lines.

    The message is unescaped first, so a report the driver printed over several lines (one
    record, its newlines escaped as "\x0a") is matched whole. An event's text in a record of
    another facility than the kernel's is `Unreadable` (`user_space`), not an event."""
    if not line.strip() or line[0].isspace():  # blank, or a record's " KEY=value" line
        return None
    if len(line) > MAX_RECORD:
        return Unreadable(
            reason="malformed", why=f"longer than any kernel record ({MAX_RECORD})", line=line
        )
    record = _RECORD.match(line)
    if record is None:
        return Unreadable(
            reason="no_timestamp", why="not a prio,seq,usec,flags;message record", line=line
        )
    found = _event(unescape(record[4]), line, sequence=int(record[2]), seconds=int(record[3]) / 1e6)
    facility = int(record[1]) >> 3
    if found is None or facility == KERNEL_FACILITY:
        return found
    return Unreadable(
        reason="user_space",
        why=f"written to the kernel log from user space (facility {facility}), not by the kernel",
        line=line,
    )


def _event(
    message: str, line: str, *, sequence: int, seconds: float
) -> KernelEvent | Unreadable | None:
    """The event one unescaped message tells of, whoever wrote it."""
    if "NVRM: Xid" in message:
        xid = _XID.search(message)
        if xid is None or int(xid["xid"]) == 0:
            return _unreadable(line, message, "Xid")
        code, rest = int(xid["xid"]), xid["rest"] or ""
        return KernelXid(
            pci_bus_id=normalize_pci(xid["pci"]),
            xid=code,
            sequence=sequence,
            seconds=seconds,
            recovery_action=_recovery_action(rest) if code == RECOVERY_XID else None,
            nvlink=_nvlink_fields(rest) if code in NVLINK5_XIDS else None,
        )
    if "SXid" in message:
        sxid = _SXID.search(message)
        if sxid is None:
            return _unreadable(line, message, "SXid")
        severity = sxid["rest"].split(",", 1)[0].strip().lower()
        if severity not in {"fatal", "non-fatal"}:
            return None  # a follow-up line of an SXid already counted
        return SwitchXid(
            device=sxid["device"],
            pci_bus_id=normalize_pci(sxid["pci"]),
            sxid=int(sxid["sxid"]),
            fatal=severity == "fatal",
            sequence=sequence,
            seconds=seconds,
        )
    if "fallen off the bus" in message:
        joined = _CONTINUATION.sub(" ", message)
        for pattern in _FALLEN:
            fallen = pattern.search(joined)
            if fallen is not None:
                pci = normalize_pci(fallen["pci"]) if fallen["pci"] else ""
                return FallenOffBus(pci_bus_id=pci, sequence=sequence, seconds=seconds)
        if "NVRM:" in message:
            return _unreadable(line, message, "fallen-off-the-bus")
    return parse_storage(message, sequence=sequence, seconds=seconds)


def _decode(line: bytes) -> str:
    """A record's text; a line longer than any record stays longer once decoded (one
    character per byte), so that parse_record knows it for what it is."""
    if len(line) <= MAX_RECORD:
        return line.decode(errors="replace")
    return line[: MAX_RECORD + 1].decode("ascii", errors="replace")


class KernelLog(Protocol):
    """Where kernel log lines come from: /dev/kmsg, a file, or the simulated node.

    `opened_at` is `now()` when the reader opened: records stamped before it are history.
    """

    opened_at: float

    def now(self) -> float:
        """Seconds on the clock the records' timestamps use."""
        ...

    def read(self, timeout: float) -> list[str]:
        """New lines since the last call; waits up to `timeout` seconds when there are none
        (a reader that is not told of new lines, a file or the simulation, looks again
        within `FILE_LOOK_SECONDS` whatever the timeout)."""
        ...

    def close(self) -> None: ...


class KmsgReader:
    """Reads /dev/kmsg (or a file of records) from its start, never blocking past the timeout.

    On the device (a character device, which `poll` answers for) a read with nothing new
    sleeps in `poll` on it and on a pipe `close()` writes to; a file is looked at again
    every `FILE_LOOK_SECONDS`. The lock is held across a read's poll, so `close()` never
    closes a descriptor under it: the pipe wakes the poll first.
    """

    def __init__(self, *, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.opened_at = self.now()
        self._partial = b""
        self._closed = threading.Event()
        self._lock = threading.Lock()  # close() must not pull the fd from under a read
        self._closing = threading.Lock()  # one close() does it
        self._wake: tuple[int, int] | None = None
        self._poller: select.poll | None = None
        try:
            if stat.S_ISCHR(os.fstat(self._fd).st_mode):
                self._wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
                self._poller = select.poll()
                self._poller.register(self._fd, select.POLLIN)
                self._poller.register(self._wake[0], select.POLLIN)
        except OSError:
            self._closed.set()
            self._close_descriptors()
            raise

    def _drain(self) -> list[str]:
        with self._lock:
            return self._drain_locked()

    def _drain_locked(self) -> list[str]:
        chunks: list[bytes] = []
        while not self._closed.is_set():
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:  # /dev/kmsg: no more records for now
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them
                    log.warning("kernel log records were lost before being read")
                    continue
                raise
            if not data:  # end of a plain file
                break
            chunks.append(data)
        text = self._partial + b"".join(chunks)
        *lines, partial = text.split(b"\n")
        # A line longer than any record (only a file holds one) keeps only what shows it too
        # long: memory stays bounded however long the line, and parse_record skips it.
        self._partial = partial[: MAX_RECORD + 1]
        return [_decode(line) for line in lines]

    def now(self) -> float:
        return time.clock_gettime(time.CLOCK_MONOTONIC)

    def read(self, timeout: float) -> list[str]:
        if self._poller is not None:
            with self._lock:
                lines = self._drain_locked()
                if lines or self._closed.is_set():
                    return lines
                ready = self._poller.poll(max(0, round(timeout * 1000)))
                lines = self._drain_locked()
            if lines or not ready or self._closed.is_set():
                return lines
            # Ready with nothing to read (an error state of the device): do not spin on it.
        lines = self._drain()
        if not lines and not self._closed.wait(min(timeout, FILE_LOOK_SECONDS)):
            lines = self._drain()
        return lines

    def close(self) -> None:
        with self._closing:
            if self._closed.is_set():
                return
            self._closed.set()
            if self._wake is not None:
                with contextlib.suppress(BlockingIOError):  # full: the poll is woken already
                    os.write(self._wake[1], b"!")
            self._close_descriptors()

    def _close_descriptors(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._wake is not None:
                for fd in self._wake:
                    os.close(fd)
                self._wake = None
