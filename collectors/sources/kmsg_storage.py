"""Storage events in the kernel log: NFS servers not responding and back, hung tasks, ext4
and XFS errors and read-only remounts, NVMe timeouts and resets, Lustre client evictions.

`parse_storage(message)` reads one unescaped /dev/kmsg message (the Xid reader,
`fleetwatch.collectors.sources.kmsg`, hands over every message that is no Xid, SXid or
fallen-off-the-bus report) and gives a `StorageEvent`, or None for any other message. The
texts are the kernel's own (as real logs show them):

- fs/nfs: `nfs: server SERVER not responding, still trying`, `... not responding, timed
  out`, `nfs: server SERVER OK`;
- kernel/hung_task.c: `INFO: task NAME:PID blocked for more than N seconds.`;
- fs/ext4: `EXT4-fs error (device DEV): ...`, `EXT4-fs (DEV): Remounting filesystem
  read-only`;
- fs/xfs: `XFS (DEV): ... Shutting down filesystem` or `... Filesystem has been shut down`
  (shutdown), `XFS (DEV): Corruption ...` and `XFS (DEV): metadata I/O error ...` (error);
- drivers/nvme/host: `nvme nvmeN: I/O ... QID Q timeout, aborting|reset controller`
  (timeout), `nvme nvmeN: controller is down; will reset: ...` (reset);
- Lustre (LCONSOLE_ERROR 167): `...: This client was evicted by TARGET; in progress
  operations using this service will fail.`

Every label is bounded: a server, device, controller or target of this node, and a `kind`
from a fixed set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

EventKind = Literal[
    "nfs_not_responding",
    "nfs_ok",
    "hung_task",
    "filesystem",
    "nvme",
    "lustre_eviction",
]

_NFS: Final = re.compile(r"\bnfs: server (?P<server>\S+) (?P<state>not responding|OK)\b")
_HUNG_TASK: Final = re.compile(r"\bINFO: task .+:\d+ blocked for more than \d+ seconds\.")
_EXT4_ERROR: Final = re.compile(r"\bEXT4-fs error \(device (?P<device>[^)\s]+)\)")
_EXT4_READ_ONLY: Final = re.compile(
    r"\bEXT4-fs \((?P<device>[^)\s]+)\): Remounting filesystem read-only"
)
_XFS: Final = re.compile(r"\bXFS \((?P<device>[^)\s]+)\): (?P<rest>.*)$", re.DOTALL)
_XFS_SHUTDOWN: Final = re.compile(r"Shutting down filesystem|Filesystem has been shut down")
_XFS_ERROR: Final = re.compile(r"Corruption|metadata I/O error|I/O Error Detected")
_NVME_TIMEOUT: Final = re.compile(r"\bnvme (?P<device>nvme\d+): I/O .*\bQID \d+ timeout\b")
_NVME_RESET: Final = re.compile(r"\bnvme (?P<device>nvme\d+): controller is down; will reset")
_LUSTRE_EVICTED: Final = re.compile(r"This client was evicted by (?P<target>[^;\s]+)")


@dataclass(frozen=True, kw_only=True)
class StorageEvent:
    """One storage event: its kind and bounded labels (`subject`: the server, device,
    controller or target; `fs` and `detail` where the kind has them), and the record's
    sequence number and timestamp (seconds on the kernel log's clock)."""

    kind: EventKind
    subject: str = ""
    fs: str = ""
    detail: str = ""
    sequence: int
    seconds: float


def parse_storage(message: str, *, sequence: int, seconds: float) -> StorageEvent | None:
    """The storage event in one unescaped kernel-log message, or None."""

    def event(kind: EventKind, subject: str = "", fs: str = "", detail: str = "") -> StorageEvent:
        return StorageEvent(
            kind=kind, subject=subject, fs=fs, detail=detail, sequence=sequence, seconds=seconds
        )

    if (found := _NFS.search(message)) is not None:
        ok = found["state"] == "OK"
        return event("nfs_ok" if ok else "nfs_not_responding", found["server"])
    if _HUNG_TASK.search(message) is not None:
        return event("hung_task")
    if (found := _EXT4_READ_ONLY.search(message)) is not None:
        return event("filesystem", found["device"], "ext4", "read_only_remount")
    if (found := _EXT4_ERROR.search(message)) is not None:
        return event("filesystem", found["device"], "ext4", "error")
    if (found := _XFS.search(message)) is not None:
        if _XFS_SHUTDOWN.search(found["rest"]) is not None:
            return event("filesystem", found["device"], "xfs", "shutdown")
        if _XFS_ERROR.search(found["rest"]) is not None:
            return event("filesystem", found["device"], "xfs", "error")
        return None
    if (found := _NVME_TIMEOUT.search(message)) is not None:
        return event("nvme", found["device"], detail="timeout")
    if (found := _NVME_RESET.search(message)) is not None:
        return event("nvme", found["device"], detail="reset")
    if (found := _LUSTRE_EVICTED.search(message)) is not None:
        return event("lustre_eviction", found["target"])
    return None
