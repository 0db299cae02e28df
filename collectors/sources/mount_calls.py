"""Calls on mounts (statvfs, the canary probe) made in a helper process, never in the exporter.

A call on a hung mount can block in the kernel where not even SIGKILL ends it: a FUSE
request the server has read but not answered is waited for uninterruptibly, and a process
with one such thread cannot exit, so a thread of the exporter stuck there would hold a
DaemonSet rollout until the mount answered. The calls therefore run in one helper process
(`mount_helper.HELPER_ARGV`), a mount's calls one at a time inside it; the
exporter's side only sends on a pipe (`MountCalls.start`) and one thread reads the replies
(`MountCalls.call` waits for one), which never blocks an exit. When the
exporter stops, the helper sees its stdin close and exits as soon as no call is stuck (a
stuck one keeps only the helper, in the kernel, until the mount answers).

Callers name mounts and probe directories by the host's paths; `MountCalls` reaches them
under its `rootfs` (`--path.rootfs`: `/` on a plain node, where a container mounts the host's
root in a DaemonSet), so the helper is sent the paths as this process sees them.

The protocol (frames of `marshal` data) is `mount_helper`'s.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fleetwatch.collectors.sources.mount_helper import (
    HELPER_ARGV,
    STATVFS_FIELDS,
    read_frame,
    write_frame,
)
from fleetwatch.collectors.sources.mounts import reach
from fleetwatch.collectors.sources.probe import ProbeFailed


@dataclass(frozen=True, kw_only=True)
class Capacity:
    """A mount's statvfs, in bytes and inodes; `read_only` from its ST_RDONLY flag."""

    size_bytes: int
    free_bytes: int
    available_bytes: int
    inodes: int
    inodes_free: int
    read_only: bool


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    """One successful probe: seconds per phase (`PHASES` order) and bytes moved each way.
    Made here from the helper's reply, not in `probe`, which runs in the helper and loads
    neither `dataclasses` nor `collections` there."""

    seconds: dict[str, float]
    size: int


@dataclass(frozen=True, kw_only=True)
class MountReading:
    """One call's result: capacity or the statvfs error's symbolic name, and the probe."""

    capacity: Capacity | None
    error: str | None
    probe: ProbeResult | ProbeFailed | None


class MountCaller(Protocol):
    """What the storage collector makes its calls on mounts through: `MountCalls` on a real
    node, a stand-in under simulation."""

    def call(self, mountpoint: str, probe: tuple[str, int] | None) -> MountReading:
        """statvfs on `mountpoint`, then the probe if given; blocks while the mount does."""
        ...

    def close(self) -> None:
        """Release what the calls hold; never waits for a stuck call."""
        ...


class HelperFailed(Exception):
    """The helper process died or answered garbage: the call's result is unknown."""


def _capacity(fields: dict[str, int]) -> Capacity:
    frsize = fields["f_frsize"]
    return Capacity(
        size_bytes=fields["f_blocks"] * frsize,
        free_bytes=fields["f_bfree"] * frsize,
        available_bytes=fields["f_bavail"] * frsize,
        inodes=fields["f_files"],
        inodes_free=fields["f_ffree"],
        read_only=bool(fields["f_flag"] & os.ST_RDONLY),
    )


def _reading(reply: dict[str, Any]) -> MountReading:
    """A reply line decoded; KeyError/TypeError/ValueError on a malformed one."""
    probe: ProbeResult | ProbeFailed | None = None
    found = reply["probe"]
    if found is not None and "failed" in found:
        probe = ProbeFailed(str(found["failed"]), str(found["phase"]), str(found["detail"]))
    elif found is not None:
        seconds = {str(k): float(v) for k, v in found["seconds"].items()}
        probe = ProbeResult(seconds=seconds, size=int(found["size"]))
    stat = reply["statvfs"]
    return MountReading(
        capacity=None if stat is None else _capacity({k: int(stat[k]) for k in STATVFS_FIELDS}),
        error=reply["error"],
        probe=probe,
    )


Done = Callable[[MountReading | None, BaseException | None], None]
"""How a started call ends: (the reading, None), or (None, `HelperFailed`)."""


class _Waiter:
    """`call`'s end of a started call: an event and what it ended with."""

    def __init__(self) -> None:
        self.ended = threading.Event()
        self.reading: MountReading | None = None
        self.error: BaseException | None = None

    def __call__(self, reading: MountReading | None, error: BaseException | None) -> None:
        self.reading, self.error = reading, error
        self.ended.set()


class MountCalls:
    """The exporter's side: sends calls to the helper and hands each reply back.

    `start` sends a call and returns; the one thread that reads the helper's replies ends it
    (`done`), so no thread of the exporter waits per mount (`blocking.ReplyLane`). `call`
    blocks its caller on an event, never in the filesystem. The helper is started on first
    use and again after it died; a call in flight when it died fails with `HelperFailed`.
    """

    def __init__(self, rootfs: Path = Path("/"), argv: list[str] | None = None) -> None:
        self._rootfs = str(rootfs)
        self._argv = argv or [sys.executable, *HELPER_ARGV]
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._pending: dict[int, Done] = {}
        self._next_id = 0
        self._closed = False

    def call(self, mountpoint: str, probe: tuple[str, int] | None) -> MountReading:
        """statvfs on `mountpoint`, then the probe if given, in the helper; waits for it.
        Both are host paths, reached under `rootfs`."""
        waiter = _Waiter()
        self.start(mountpoint, probe, waiter)
        waiter.ended.wait()
        if waiter.error is not None:
            raise waiter.error
        assert waiter.reading is not None
        return waiter.reading

    def start(self, mountpoint: str, probe: tuple[str, int] | None, done: Done) -> None:
        """Send `call`'s request and return; `done` is called once with its result, by the
        helper's reply reader. Raises `HelperFailed` (and never calls `done`) when the
        request could not be sent."""
        reached = reach(mountpoint, self._rootfs)
        sent = None if probe is None else (reach(probe[0], self._rootfs), probe[1])
        with self._lock:
            if self._closed:
                raise HelperFailed("closed")
            process = self._helper()
            self._next_id += 1
            ident = self._next_id
            self._pending[ident] = done
            try:
                assert process.stdin is not None
                write_frame(process.stdin, {"id": ident, "mountpoint": reached, "probe": sent})
            except OSError as exc:
                self._pending.pop(ident, None)
                raise HelperFailed(f"could not send to the mount helper: {exc}") from exc

    def _helper(self) -> subprocess.Popen[bytes]:
        """The running helper, started when there is none (called with the lock held)."""
        if self._process is not None and self._process.poll() is None:
            return self._process
        process = subprocess.Popen(
            self._argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C meant for the exporter is not the helper's
        )
        self._process = process
        reader = threading.Thread(
            target=self._read_replies, args=(process,), name="mount-helper-replies", daemon=True
        )
        reader.start()
        return process

    def _read_replies(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        while True:
            try:
                reply = read_frame(process.stdout)
            except (ValueError, EOFError, TypeError):
                process.kill()  # out of step: a new helper answers the next call
                break
            if reply is None:
                break
            try:
                done = self._pending.pop(int(reply["id"]))
            except (ValueError, KeyError, TypeError):
                continue  # not a reply to a request of ours: the waiting call times out
            try:
                reading = _reading(reply)
            except (KeyError, TypeError, ValueError) as exc:
                done(None, HelperFailed(f"malformed reply from the mount helper: {exc!r}"))
            else:
                done(reading, None)
        with self._lock:  # the helper is gone: every call still waiting fails now
            if self._process is process:
                self._process = None
            orphans = list(self._pending.values())
            self._pending.clear()
        for done in orphans:
            done(None, HelperFailed("the mount helper process exited"))

    def close(self) -> None:
        """Close the helper's stdin (it exits when no call is stuck); never waits for it."""
        with self._lock:
            self._closed = True
            process = self._process
        if process is not None and process.stdin is not None:
            # An error here means the helper already exited: nothing to tell it.
            with contextlib.suppress(OSError):
                process.stdin.close()
