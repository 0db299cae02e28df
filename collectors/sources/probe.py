"""The canary probe: a bounded write, fsync, read back and delete in a directory on a mount.

A checkpoint save stalls when the mount's write, flush or read path stalls; capacity and
client counters do not show that until a job hangs. The probe does a small save itself, in a
directory fleetwatch owns, and times each phase. It never writes more than `size` bytes
(written in 1 MiB chunks from one buffer), never creates the directory (a missing or
unwritable one is a failure with its reason, so a probe never lands on the wrong disk), and
removes its file whatever happens. The read drops the file's cached pages first
(`POSIX_FADV_DONTNEED` after the fsync) so it reads from the storage where the filesystem
allows, not from memory.

Every call here can block in the kernel on a hung mount: the caller runs `run_probe` on the
mount's lane (`collectors.blocking`), never on a thread that serves anything else.
"""

from __future__ import annotations

import errno
import os
import stat
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # this module runs in the mount helper, which does not load `typing`
    from typing import Final

CHUNK_BYTES: Final = 1 << 20
PHASES: Final = ("write", "fsync", "read", "delete")
# Probe failure reasons: a bounded label set, each one a person can act on.
FAILURE_REASONS: Final = (
    "missing",
    "not_a_directory",
    "not_writable",
    "wrong_filesystem",
    "read_only",
    "no_space",
    "io_error",
    "disconnected",
    "short_read",
    "mismatch",
    "error",
)
_ERRNO_REASONS: Final = {
    errno.ENOENT: "missing",
    errno.ENOTDIR: "not_a_directory",
    errno.EACCES: "not_writable",
    errno.EPERM: "not_writable",
    errno.EROFS: "read_only",
    errno.ENOSPC: "no_space",
    errno.EDQUOT: "no_space",
    errno.EIO: "io_error",
    errno.ENOTCONN: "disconnected",  # a FUSE server that died
    errno.ECONNABORTED: "disconnected",  # ... while the call was in flight
    errno.ESTALE: "disconnected",  # an NFS export that went away under the handle
}
_FILE_NAME: Final = ".fleetwatch-probe"


class ProbeFailed(Exception):
    """The probe failed: `reason` is one of `FAILURE_REASONS`, `phase` where it failed."""

    def __init__(self, reason: str, phase: str, detail: str) -> None:
        super().__init__(f"{phase}: {detail}")
        self.reason = reason
        self.phase = phase
        self.detail = detail


def _payload(size: int) -> bytes:
    """One chunk of a recognisable pattern (so a read of stale or zero pages is caught)."""
    pattern = b"fleetwatch-canary-"
    return (pattern * (min(size, CHUNK_BYTES) // len(pattern) + 1))[: min(size, CHUNK_BYTES)]


def _failure(exc: OSError, phase: str) -> ProbeFailed:
    reason = _ERRNO_REASONS.get(exc.errno or 0, "error")
    return ProbeFailed(reason, phase, exc.strerror or str(exc))


def run_probe(directory: str, size: int) -> dict[str, float]:
    """Write `size` bytes to a file in `directory`, fsync, read them back, delete the file:
    the seconds each phase took, in `PHASES` order.

    Raises `ProbeFailed` with the reason and phase. Blocks as long as the mount does.
    """
    try:
        mode = os.stat(directory).st_mode
    except OSError as exc:
        raise _failure(exc, "open") from exc
    if not stat.S_ISDIR(mode):
        raise ProbeFailed("not_a_directory", "open", f"{directory} is not a directory")
    path = os.path.join(directory, _FILE_NAME)
    chunk = _payload(size)
    seconds: dict[str, float] = {}
    phase = "write"
    try:
        started = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            left = size
            while left > 0:
                left -= os.write(fd, chunk[: min(left, len(chunk))])
            seconds["write"] = time.perf_counter() - started
            phase, started = "fsync", time.perf_counter()
            os.fsync(fd)
            seconds["fsync"] = time.perf_counter() - started
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        phase, started = "read", time.perf_counter()
        _read_back(path, size, chunk)
        seconds["read"] = time.perf_counter() - started
        phase, started = "delete", time.perf_counter()
        os.unlink(path)
        seconds["delete"] = time.perf_counter() - started
    except OSError as exc:
        if phase != "delete":
            _remove_quietly(path)
        raise _failure(exc, phase) from exc
    except ProbeFailed:
        _remove_quietly(path)
        raise
    return seconds


def _read_back(path: str, size: int, chunk: bytes) -> None:
    """Read the file and check it holds what was written."""
    with open(path, "rb") as file:
        done = 0
        while done < size:
            expected = chunk[: min(size - done, len(chunk))]
            data = file.read(len(expected))  # buffered: loops until full or end of file
            if len(data) < len(expected):
                raise ProbeFailed("short_read", "read", f"read {done + len(data)} of {size} bytes")
            if data != expected:
                raise ProbeFailed("mismatch", "read", f"bytes at {done} differ from those written")
            done += len(data)


def _remove_quietly(path: str) -> None:
    """Remove the probe file after a failure; the failure already reported is what matters."""
    try:  # noqa: SIM105 - contextlib (with collections) is 0.6 MiB of the mount helper
        os.unlink(path)
    except OSError:
        pass  # never created, or the mount refuses even that: the failure already says why
