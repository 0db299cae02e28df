"""Kernel-log Xid reader: `NVRM: Xid (PCI:0000:18:00): 79, ...` lines from /dev/kmsg.

NVML delivers Xid events only to an event set registered at the time; the kernel log also
holds the Xids raised before the exporter started (or while it was down). `KmsgReader`
reads /dev/kmsg records without blocking (each read returns one record, `EPIPE` means
records were overwritten before we read them), and also reads a plain text file of
lines, which is what tests give it. `parse_xid` turns one record or line into a
`KernelXid`; anything else (other messages, malformed Xid lines) gives None.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

log = logging.getLogger(__name__)

# "<prio>,<seq>,<usec since boot>,<flags>[,...];<message>" — the /dev/kmsg record header.
_RECORD: Final = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_XID: Final = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?\): "
    r"(?P<xid>\d{1,4})(?:,|$)"
)
_READ_SIZE: Final = 8192


@dataclass(frozen=True, kw_only=True)
class KernelXid:
    """One Xid from the kernel log; `sequence`/`seconds` come from the kmsg record header."""

    pci_bus_id: str
    xid: int
    sequence: int | None = None
    seconds: float | None = None


def normalize_pci(bus_id: str) -> str:
    """`00000000:18:00.0` (NVML) or `0000:18:00` (kernel log) → `0000:18:00`."""
    domain, bus, device = bus_id.lower().split(".")[0].split(":")[-3:]
    return f"{domain[-4:].rjust(4, '0')}:{bus}:{device}"


def parse_xid(line: str) -> KernelXid | None:
    """The Xid in a kmsg record or plain log line, or None when the line holds none."""
    sequence: int | None = None
    seconds: float | None = None
    record = _RECORD.match(line)
    if record is not None:
        sequence, seconds, line = int(record[2]), int(record[3]) / 1e6, record[4]
    match = _XID.search(line)
    if match is None:
        return None
    xid = int(match["xid"])
    if xid == 0:
        return None
    return KernelXid(
        pci_bus_id=normalize_pci(match["pci"]), xid=xid, sequence=sequence, seconds=seconds
    )


class KernelLog(Protocol):
    """Where kernel log lines come from: /dev/kmsg, a file, or the simulated node."""

    def read(self, timeout: float) -> list[str]:
        """New lines since the last call; waits up to `timeout` seconds when there are none."""
        ...

    def close(self) -> None: ...


class KmsgReader:
    """Reads /dev/kmsg (or a text file) from its start, never blocking past the timeout."""

    def __init__(self, *, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
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
