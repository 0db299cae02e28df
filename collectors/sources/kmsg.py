"""Kernel-log reader: NVRM Xid, fallen-off-the-bus and NVSwitch SXid records from /dev/kmsg.

NVML delivers Xid events only to an event set registered at the time; the kernel log also
holds what was logged before the exporter started (or while it was down). `KmsgReader`
reads /dev/kmsg records without blocking (each read returns one record, `EPIPE` means
records were overwritten before we read them); a regular file of records in the same
format (tests use them) is read the same way: from its start, then whatever is appended.

Every /dev/kmsg record is `<prio>,<seq>,<usec>,<flags>[,...];<message>`, continuation lines
(` KEY=value`) after it. `<usec>` is the kernel's `local_clock()` at logging time, in
microseconds: the clock `CLOCK_MONOTONIC` follows (both stop during suspend, unlike
`CLOCK_BOOTTIME`). A reader notes `CLOCK_MONOTONIC` when it opens the log (`opened_at`):
records stamped before it are history, logged before the exporter was there to see them.

`parse_record` turns one record into a `KernelXid`, `FallenOffBus` or `SwitchXid`; other
messages give None. A line that is not a record with a timestamp, or an Xid or SXid
record whose fields do not parse, gives `Unreadable` (the collector counts it): never an
exception, never an event.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol

log = logging.getLogger(__name__)

DEFAULT_PATH: Final = Path("/dev/kmsg")
# "<prio>,<seq>,<usec since boot>,<flags>[,...];<message>" — the /dev/kmsg record header.
_RECORD: Final = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_PCI: Final = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?"
_XID: Final = re.compile(rf"NVRM: Xid \(PCI:(?P<pci>{_PCI})\): (?P<xid>\d{{1,4}})(?:,|$)")
# "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus." (also "GPU at PCI:...", or no id).
_FALLEN: Final = re.compile(
    rf"NVRM: (?:GPU (?:at )?(?:PCI:)?(?P<pci>{_PCI}): )?GPU has fallen off the bus"
)
# "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 ..." opens an SXid;
# the driver's follow-up lines ("12028, Severity 0 Engine instance ...", "Data {...}")
# repeat the code without a severity and are not counted again.
_SXID: Final = re.compile(
    rf"nvidia-(?P<device>nvswitch\d+): SXid \(PCI:(?P<pci>{_PCI})\): (?P<sxid>\d{{1,5}}), "
    r"(?P<rest>.*)$"
)
_READ_SIZE: Final = 8192


@dataclass(frozen=True, kw_only=True)
class KernelXid:
    """One Xid from the kernel log, with the record's sequence number and timestamp."""

    pci_bus_id: str
    xid: int
    sequence: int
    seconds: float


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


@dataclass(frozen=True, kw_only=True)
class Unreadable:
    """A line that is not a timestamped record, or an Xid/SXid record that does not parse."""

    reason: Literal["no_timestamp", "malformed"]
    line: str


KernelEvent = KernelXid | FallenOffBus | SwitchXid


def normalize_pci(bus_id: str) -> str:
    """`00000000:18:00.0` (NVML) or `0000:18:00` (kernel log) → `0000:18:00`."""
    domain, bus, device = bus_id.lower().split(".")[0].split(":")[-3:]
    return f"{domain[-4:].rjust(4, '0')}:{bus}:{device}"


def parse_record(line: str) -> KernelEvent | Unreadable | None:
    """The event in one kmsg record; None for other messages and continuation lines."""
    if not line.strip() or line[0].isspace():  # blank, or a record's " KEY=value" line
        return None
    record = _RECORD.match(line)
    if record is None:
        return Unreadable(reason="no_timestamp", line=line)
    sequence, seconds, message = int(record[2]), int(record[3]) / 1e6, record[4]
    if "NVRM: Xid" in message:
        xid = _XID.search(message)
        if xid is None or int(xid["xid"]) == 0:
            return Unreadable(reason="malformed", line=line)
        return KernelXid(
            pci_bus_id=normalize_pci(xid["pci"]),
            xid=int(xid["xid"]),
            sequence=sequence,
            seconds=seconds,
        )
    if "SXid" in message:
        sxid = _SXID.search(message)
        if sxid is None:
            return Unreadable(reason="malformed", line=line)
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
    fallen = _FALLEN.search(message)
    if fallen is not None:
        pci = normalize_pci(fallen["pci"]) if fallen["pci"] else ""
        return FallenOffBus(pci_bus_id=pci, sequence=sequence, seconds=seconds)
    return None


class KernelLog(Protocol):
    """Where kernel log lines come from: /dev/kmsg, a file, or the simulated node.

    `opened_at` is `now()` when the reader opened: records stamped before it are history.
    """

    opened_at: float

    def now(self) -> float:
        """Seconds on the clock the records' timestamps use."""
        ...

    def read(self, timeout: float) -> list[str]:
        """New lines since the last call; waits up to `timeout` seconds when there are none."""
        ...

    def close(self) -> None: ...


class KmsgReader:
    """Reads /dev/kmsg (or a file of records) from its start, never blocking past the timeout."""

    def __init__(self, *, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.opened_at = self.now()
        self._partial = b""
        self._closed = threading.Event()
        self._lock = threading.Lock()  # close() must not pull the fd from under a read

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
        *lines, self._partial = text.split(b"\n")
        return [line.decode(errors="replace") for line in lines]

    def now(self) -> float:
        return time.clock_gettime(time.CLOCK_MONOTONIC)

    def read(self, timeout: float) -> list[str]:
        lines = self._drain()
        if not lines and not self._closed.wait(timeout):
            lines = self._drain()
        return lines

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
