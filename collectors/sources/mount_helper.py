"""The mount helper process: `python -c "from fleetwatch.collectors.sources.mount_helper
import main; main()"` (`HELPER_ARGV`).

Serves `mount_calls` requests from stdin until it closes (the exporter stopped or died), then
exits at once: a call still stuck in the kernel on a hung mount is abandoned with the
process, which the kernel ends when that call returns. The exporter's side
(`mount_calls.MountCalls`) starts it and imports only its protocol's field list from here.

It is a process on every node with network mounts, so it loads only what its calls need:
os, errno, marshal, the C modules `_thread` and `_queue`, and the probe. Not `threading` and
`queue` (with `collections`, `functools` and `heapq` that they load: 0.8 MiB), not `runpy`
(`python -m`: `importlib.util` and `contextlib`, 0.6 MiB), not `typing`, not `json` (which
loads `re`). About 9 MiB resident idle where a bare interpreter is 8.8 MiB here. It starts
with site, without `-I -S`: those save 0.1 to 0.3 MiB, and `-I` would ignore a `PYTHONPATH`
the exporter runs from (the helper must run the exporter's code), `-S` would not find an
installed package.

Calls run on a pool of threads that grows only when calls wait while every thread is busy
(`serve`), and a mount's calls run one at a time, in order (a call on a mount with one in
flight waits behind it): a mount stuck in the kernel holds one thread, never more, and 50
mounts that answer at once need one or two threads, not 50 (about 14 KiB resident each).

The protocol is frames of `marshal` data (the helper is the same interpreter as the
exporter, so the format is too), each behind its length: a request
`{"id", "mountpoint", "probe": (DIR, BYTES) | None}`, a reply `{"id", "statvfs": {...} | None,
"error": "ENOENT" | None, "probe": {...} | None}`.
"""

from __future__ import annotations

import _queue
import _thread
import errno
import marshal
import os
import sys
import time

from fleetwatch.collectors.sources.probe import ProbeFailed, run_probe

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not loaded in the helper for annotations alone
    from typing import IO, Any, Final

_LENGTH_BYTES: Final = 4

STATVFS_FIELDS: Final = (
    "f_frsize",
    "f_blocks",
    "f_bfree",
    "f_bavail",
    "f_files",
    "f_ffree",
    "f_flag",
)
"""The statvfs fields a reply carries, by name."""

GROW_AFTER: Final = 0.02
"""Seconds calls wait, with no thread free to take one, before the pool grows by a thread."""

HELPER_ARGV: Final = ("-c", "from fleetwatch.collectors.sources.mount_helper import main; main()")
"""The interpreter's arguments that start the helper (`-c`, not `-m`, which loads `runpy`)."""


def write_frame(out: IO[bytes], message: dict[str, Any]) -> None:
    """Write one message (a dict of str, int, float, None, tuples, dicts) and flush."""
    data = marshal.dumps(message)
    out.write(len(data).to_bytes(_LENGTH_BYTES, "little") + data)
    out.flush()


def read_frame(source: IO[bytes]) -> Any:
    """The next message; None at the end of the stream. ValueError (or EOFError, TypeError
    from `marshal`) on a frame that is cut short or not marshal data."""
    head = source.read(_LENGTH_BYTES)
    if not head:
        return None
    size = int.from_bytes(head, "little")
    data = source.read(size)
    if len(head) < _LENGTH_BYTES or len(data) < size:
        raise ValueError("a frame cut short")
    return marshal.loads(data)  # noqa: S302 - a pipe between the exporter and its own helper


def serve_call(request: dict[str, Any]) -> dict[str, Any]:
    """Run one request and build its reply."""
    reply: dict[str, Any] = {"id": request["id"], "statvfs": None, "error": None, "probe": None}
    try:
        stat = os.statvfs(request["mountpoint"])
        reply["statvfs"] = {name: getattr(stat, name) for name in STATVFS_FIELDS}
    except OSError as exc:
        reply["error"] = errno.errorcode.get(exc.errno or 0, "error")
    probe = request.get("probe")
    if probe is not None:
        try:
            size = int(probe[1])
            reply["probe"] = {"seconds": run_probe(str(probe[0]), size), "size": size}
        except ProbeFailed as failed:
            reply["probe"] = {
                "failed": failed.reason,
                "phase": failed.phase,
                "detail": failed.detail,
            }
    return reply


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """Read requests until EOF and run each on the pool; a mount's calls one at a time.

    The pool starts with one thread and grows by one whenever calls wait while no thread
    took one for `GROW_AFTER` seconds (every thread is in a call that long: a slow or stuck
    mount), so a burst of fast calls (every mount each cycle) runs on one or two threads and
    a stuck mount delays the others by `GROW_AFTER`, never up to their deadline.
    """
    write_lock = _thread.allocate_lock()
    lock = _thread.allocate_lock()  # guards the counts and `behind`
    wake = _thread.allocate_lock()  # released when calls wait: the grower looks
    wake.acquire()
    work: _queue.SimpleQueue[dict[str, Any]] = _queue.SimpleQueue()
    # Mounts with a call in flight, each with the calls that arrived behind it.
    behind: dict[str, list[dict[str, Any]]] = {}
    queued = taken = 0  # calls waiting on `work` now; calls taken from it so far

    def worker() -> None:
        nonlocal queued, taken
        while True:
            request: dict[str, Any] | None = work.get()
            with lock:
                queued -= 1
                taken += 1
            while request is not None:
                reply = serve_call(request)
                with write_lock:
                    write_frame(replies, reply)
                point = str(request["mountpoint"])
                with lock:
                    waiting = behind[point]
                    request = waiting.pop(0) if waiting else None
                    if request is None:
                        del behind[point]

    def grow() -> None:
        while True:
            wake.acquire()
            while True:
                with lock:
                    seen = taken
                time.sleep(GROW_AFTER)
                with lock:
                    if not queued:
                        break
                    if taken == seen:
                        _thread.start_new_thread(worker, ())

    _thread.start_new_thread(worker, ())
    _thread.start_new_thread(grow, ())
    while (request := read_frame(requests)) is not None:
        point = str(request["mountpoint"])
        with lock:
            if point in behind:
                behind[point].append(request)
                continue
            behind[point] = []
            queued += 1
        work.put(request)
        if wake.locked():  # this thread alone releases it: no race between test and release
            wake.release()


def main() -> None:
    """The helper's entry point: serve stdin, then exit without waiting for stuck calls."""
    serve(sys.stdin.buffer, sys.stdout.buffer)
    os._exit(0)  # workers stuck in the kernel are abandoned, not waited for
