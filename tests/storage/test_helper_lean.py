"""The mount helper is a process on every node with network mounts: it loads only what its
calls need, never the exporter-side modules."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fleetwatch.collectors.sources.mount_calls import (
    Done,
    HelperFailed,
    MountCalls,
    MountReading,
    ProbeResult,
)
from fleetwatch.collectors.sources.probe import PHASES
from fleetwatch.sim.loopback_servers import wait_until

LOADED_BY_THE_HELPER = """
import sys
import fleetwatch.collectors.sources.mount_helper
print("\\n".join(sorted(sys.modules)))
"""


def test_the_helper_loads_only_what_its_calls_need() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOADED_BY_THE_HELPER],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    modules = set(done.stdout.split())
    assert {"fleetwatch.collectors.sources.probe", "marshal", "_thread", "_queue"} <= modules
    # What the exporter's side of the calls loads (1 to 2 MiB each in the helper), typing
    # and json (re): 0.5 and 0.7 MiB, threading, queue and contextlib with collections.
    unwanted = {
        "typing",
        "json",
        "threading",
        "queue",
        "collections",
        "contextlib",
        "runpy",
        "dataclasses",
        "subprocess",
        "pathlib",
        "fleetwatch.collectors.sources.mount_calls",
        "fleetwatch.collectors.sources.mounts",
    }
    assert modules & unwanted == set()


def test_calls_through_the_helper(tmp_path: Path) -> None:
    """A real helper: statvfs and the probe on a directory, the error of a missing path,
    each reply back to its call."""
    calls = MountCalls()
    try:
        found = calls.call(str(tmp_path), (str(tmp_path), 8192))
        missing = calls.call(str(tmp_path / "absent"), None)
    finally:
        calls.close()
    assert found.capacity is not None
    assert found.capacity.size_bytes > 0
    assert found.error is None
    assert isinstance(found.probe, ProbeResult)
    assert (found.probe.size, list(found.probe.seconds)) == (8192, list(PHASES))
    assert (missing.capacity, missing.error, missing.probe) == (None, "ENOENT", None)


def test_a_reply_out_of_step_fails_the_call(tmp_path: Path) -> None:
    """A helper that answers garbage (not a frame) is ended, and the call in flight fails
    with HelperFailed rather than waiting for a reply that cannot come."""
    garbage = tmp_path / "garbage.py"
    garbage.write_text(
        "import sys\nsys.stdin.buffer.read(1)\nsys.stdout.buffer.write(b'\\xff' * 9)\n"
    )
    calls = MountCalls(argv=[sys.executable, str(garbage)])
    try:
        with pytest.raises(HelperFailed):
            calls.call(str(tmp_path), None)
    finally:
        calls.close()


def _helper_pids() -> list[int]:
    """This process's mount helpers (children whose command line names the helper)."""
    found = []
    for task in Path("/proc/self/task").iterdir():
        for child in (task / "children").read_text().split():
            if b"mount_helper" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(int(child))
    return found


def test_a_stuck_mount_holds_one_thread_and_its_calls_wait_in_order(tmp_path: Path) -> None:
    """A probe stuck in the kernel (opening a FIFO nobody reads blocks, as a write on a hung
    mount does) holds one thread of the helper: that mount's next calls wait behind it, in
    order, another mount's calls are answered meanwhile on one more thread, and the stuck
    mount's calls all end once the call returns."""
    stuck, free = tmp_path / "stuck", tmp_path / "free"
    stuck.mkdir()
    free.mkdir()
    os.mkfifo(stuck / ".fleetwatch-probe")
    ended: list[tuple[str, int]] = []
    lock = threading.Lock()

    def recorder(name: str, n: int) -> Done:
        def done(reading: MountReading | None, error: BaseException | None) -> None:
            assert error is None, error
            with lock:
                ended.append((name, n))

        return done

    def count(name: str) -> int:
        with lock:
            return sum(1 for found, _ in ended if found == name)

    calls = MountCalls()
    try:
        for n in range(3):
            calls.start(str(stuck), (str(stuck), 4096), recorder("stuck", n))
        for n in range(3):
            calls.start(str(free), None, recorder("free", n))
        wait_until(lambda: count("free") == 3, timeout=30, what="the free mount's calls")
        (helper,) = _helper_pids()
        assert count("stuck") == 0
        # The reader, the pool's grower and two workers: one stuck, one for the free mount.
        assert len(list(Path(f"/proc/{helper}/task").iterdir())) == 4
        with (stuck / ".fleetwatch-probe").open("rb") as fifo:
            fifo.read()  # the stuck open returns; the probe then fails (no fsync on a FIFO)
        wait_until(lambda: count("stuck") == 3, timeout=30, what="the stuck mount's calls")
    finally:
        calls.close()
    assert [n for name, n in ended if name == "stuck"] == [0, 1, 2]
    assert [n for name, n in ended if name == "free"] == [0, 1, 2]
