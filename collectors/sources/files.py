"""Opening sysfs files safely: never block, and only regular files.

A sysfs attribute is a regular file that answers at once. Anything else found in its
place (a FIFO left by a test harness or an attacker with write access to a bind mount,
a character device, a directory) could block `open` or `read` forever and stall the
collector; `open_regular` refuses it with `NotRegularFile`, a per-file problem like any
other read error. `ReadProblem` is how a reader reports such a file (or one holding
garbage) to its collector, which counts and logs it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from fleetwatch.logs import LogOnce


@dataclass(frozen=True, kw_only=True)
class ReadProblem:
    """A value that was skipped for a reason a person should see (garbage, I/O error)."""

    path: str
    reason: str


class ReadProblems:
    """Files skipped so far (`total`), each logged once per file and reason with `message`:
    a stuck file is not news every cycle."""

    def __init__(self, once: LogOnce, message: str) -> None:
        self._once = once
        self._message = message
        self.total = 0

    def report(self, problems: Iterable[ReadProblem]) -> None:
        for problem in problems:
            self.total += 1
            self._once.warning(
                (problem.path, problem.reason),
                self._message,
                path=problem.path,
                reason=problem.reason,
            )


class NotRegularFile(OSError):
    """The path is not a regular file (a FIFO, a device, a socket or a directory)."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str) -> int:
    """A read-only, non-blocking descriptor of the regular file at `path`.

    `O_NONBLOCK` makes opening a FIFO return at once instead of waiting for a writer;
    `fstat` on the descriptor (not the path, which could change in between) then
    refuses everything that is not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(f"not a regular file: {_kind(mode)}")
    return fd


def read_regular(path: str, size: int) -> bytes:
    """Up to `size` bytes from the start of the regular file at `path` (see `open_regular`)."""
    fd = open_regular(path)
    try:
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)
