"""The mount helper process: `python -m fleetwatch.collectors.sources.mount_helper`.

Serves `mount_calls` requests from stdin until it closes (the exporter stopped or died), then
exits at once: a call still stuck in the kernel on a hung mount is abandoned with the
process, which the kernel ends when that call returns. The exporter's side
(`mount_calls.MountCalls`) starts it and imports only its protocol's field list from here.

It is a process on every node with network mounts, so it imports only what its calls need
(os, errno, marshal, threading, queue and the probe; not `typing`, not `json`, which loads
`re`): about 10 MiB resident idle where a bare `python3 -I -S` is 8.3 MiB here, against 15
MiB when it imported the exporter-side module (dataclasses, subprocess, pathlib and the mount
table parser). It starts with site, without `-I -S`: those save 0.1 to 0.3 MiB, and `-I`
would ignore a `PYTHONPATH` the exporter runs from (the helper must run the exporter's code),
`-S` would not find an installed package.

The protocol is frames of `marshal` data (the helper is the same interpreter as the
exporter, so the format is too), each behind its length: a request
`{"id", "mountpoint", "probe": (DIR, BYTES) | None}`, a reply `{"id", "statvfs": {...} | None,
"error": "ENOENT" | None, "probe": {...} | None}`.
"""

from __future__ import annotations

import errno
import marshal
import os
import queue
import sys
import threading

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
            result = run_probe(str(probe[0]), int(probe[1]))
            reply["probe"] = {"seconds": result.seconds, "size": result.size}
        except ProbeFailed as failed:
            reply["probe"] = {
                "failed": failed.reason,
                "phase": failed.phase,
                "detail": failed.detail,
            }
    return reply


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """Read requests until EOF; each mount's calls run in order on that mount's thread."""
    write_lock = threading.Lock()
    queues: dict[str, queue.SimpleQueue[dict[str, Any]]] = {}

    def worker(calls: queue.SimpleQueue[dict[str, Any]]) -> None:
        while True:
            reply = serve_call(calls.get())
            with write_lock:
                write_frame(replies, reply)

    while (request := read_frame(requests)) is not None:
        point = str(request["mountpoint"])
        calls = queues.get(point)
        if calls is None:
            calls = queues[point] = queue.SimpleQueue()
            threading.Thread(target=worker, args=(calls,), name=point, daemon=True).start()
        calls.put(request)


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
    os._exit(0)  # daemon workers stuck in the kernel are abandoned, not waited for
