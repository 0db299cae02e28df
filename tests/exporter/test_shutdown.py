"""Shutdown is bounded: SIGTERM while collections are in flight always ends the process,
and a shutdown that blocks past its deadline is logged and exits non-zero.
"""

from __future__ import annotations

import io
import logging
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from fleetwatch.exporter.shutdown import EXIT_SHUTDOWN_TIMEOUT, ShutdownDeadline
from fleetwatch.sim import loopback_servers as servers

# Real exporter processes, signalled: 40 s in all, kept out of the fast lane.
pytestmark = [pytest.mark.timeout(600), pytest.mark.integration]


class RecordedExit:
    """Stands in for os._exit: records the status instead of ending the test run."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.called = threading.Event()

    def __call__(self, status: int) -> None:
        self.status = status
        self.called.set()


def test_a_blocked_shutdown_logs_what_ran_and_exits_non_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    exit_process = RecordedExit()
    deadline = ShutdownDeadline(seconds=0.05, exit_process=exit_process)
    blocker = threading.Event()
    stuck = threading.Thread(target=blocker.wait, name="collector-gpu", daemon=True)
    stuck.start()
    try:
        deadline.step("closing the hardware context (NVML)")
        deadline.begin()
        assert exit_process.called.wait(10), "the deadline never fired"
    finally:
        blocker.set()
    assert exit_process.status == EXIT_SHUTDOWN_TIMEOUT
    (record,) = [
        r for r in caplog.records if r.getMessage() == "shutdown deadline exceeded, exiting"
    ]
    assert record.__dict__["step"] == "closing the hardware context (NVML)"
    assert "collector-gpu" in record.__dict__["threads"].split(",")


def test_a_log_stream_that_cannot_flush_does_not_stop_the_exit() -> None:
    """The deadline flushes the root handlers before it exits: a closed stream (stderr gone,
    a broken pipe) raised out of the timer thread and the process never exited."""
    stream = io.TextIOWrapper(io.BytesIO())
    handler = logging.StreamHandler(stream)
    stream.close()
    root = logging.getLogger()
    root.addHandler(handler)
    exit_process = RecordedExit()
    try:
        ShutdownDeadline(seconds=0.01, exit_process=exit_process).begin()
        assert exit_process.called.wait(10), "the deadline never fired"
    finally:
        root.removeHandler(handler)
    assert exit_process.status == EXIT_SHUTDOWN_TIMEOUT


def test_a_finished_shutdown_cannot_fire_later() -> None:
    exit_process = RecordedExit()
    deadline = ShutdownDeadline(seconds=0.2, exit_process=exit_process)
    deadline.begin()
    deadline.finish()  # joins the timer thread: after this, nothing can call exit
    assert not exit_process.called.is_set()
    assert not any(t.name == "shutdown-deadline" for t in threading.enumerate())


@pytest.mark.parametrize("attempt", range(20))
def test_sigterm_while_collections_are_in_flight_exits_in_time(
    tmp_path: Path, attempt: int
) -> None:
    """Every collector every 100 ms (InfiniBand runs take milliseconds): SIGTERM lands
    while runs are in flight and results are being handed back; repeated to catch races."""
    args = ["--collector.interval=100ms", "--shutdown.timeout=10s"]
    with servers.fleetwatch_export(tmp_path, simulate="dgx-h100", args=args) as server:
        server.process.send_signal(signal.SIGTERM)
        try:
            status = server.process.wait(timeout=15)  # the process's own deadline is 10 s
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit 15 s after SIGTERM (attempt {attempt}):\n{server.log()}")
        assert status == 0, server.log()
        assert '"msg": "shutting down"' in server.log()
        assert "shutdown deadline exceeded" not in server.log()
