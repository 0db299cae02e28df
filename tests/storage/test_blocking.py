"""Lanes: one call at a time per key, never stacked, hung after a deadline, recovered."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from fleetwatch.collectors.blocking import Lane, ReplyLane


def test_a_blocked_call_is_never_stacked_and_is_counted_once() -> None:
    release = threading.Event()
    calls: list[int] = []

    def blocked() -> int:
        calls.append(1)
        release.wait(30)
        return 7

    lane: Lane[int] = Lane("m")
    try:
        assert lane.submit(blocked)
        assert not lane.wait(time.monotonic() + 0.05)
        for _ in range(20):
            assert not lane.submit(blocked)  # refused while the first is in flight
        deadline = time.monotonic() + 10
        while not lane.hung(0.05):
            assert time.monotonic() < deadline, "the lane never turned hung"
            time.sleep(0.01)
        for _ in range(5):
            assert lane.hung(0.05)
        assert lane.stuck_calls == 1
        assert len(calls) == 1
        release.set()
        assert lane.wait(time.monotonic() + 10)
        assert not lane.hung(0.05)
        outcome = lane.outcome()
        assert outcome is not None
        assert outcome.value == 7
        assert lane.submit(lambda: 8)  # recovered: takes calls again
        assert lane.wait(time.monotonic() + 10)
        assert lane.stuck_calls == 1
    finally:
        release.set()
        lane.close()
        assert lane.join(5)


def test_an_exception_is_handed_back() -> None:
    def failing() -> int:
        raise OSError(5, "Input/output error")

    lane: Lane[int] = Lane("m")
    assert lane.submit(failing)
    assert lane.wait(time.monotonic() + 10)
    outcome = lane.outcome()
    assert outcome is not None
    assert isinstance(outcome.error, OSError)
    lane.close()
    assert lane.join(5)


def test_close_does_not_wait_for_a_stuck_call() -> None:
    release = threading.Event()
    lane: Lane[bool] = Lane("m")
    assert lane.submit(lambda: release.wait(30))
    lane.close()
    assert not lane.join(0.1)  # left behind, a daemon thread
    assert not lane.submit(lambda: True)
    release.set()
    assert lane.join(10)


def test_a_reply_lane_runs_one_call_at_a_time_without_a_thread() -> None:
    """The helper's calls: sent, ended by whoever reads the reply; the same rules as a
    thread lane (never stacked, hung once past the deadline, recovered by the reply)."""
    started: list[Callable[[int | None, BaseException | None], None]] = []
    threads = threading.active_count()
    lane: ReplyLane[int] = ReplyLane("m")
    assert threading.active_count() == threads
    assert lane.submit(started.append)
    assert not lane.wait(time.monotonic() + 0.05)
    assert not lane.submit(started.append)  # refused while the first is in flight
    assert len(started) == 1
    deadline = time.monotonic() + 10
    while not lane.hung(0.05):
        assert time.monotonic() < deadline, "the lane never turned hung"
        time.sleep(0.01)
    assert lane.hung(0.05)
    assert lane.stuck_calls == 1
    replier = threading.Thread(target=started[0], args=(7, None))  # the reply reader
    replier.start()
    assert lane.wait(time.monotonic() + 10)
    replier.join()
    outcome = lane.outcome()
    assert outcome is not None
    assert (outcome.value, outcome.error) == (7, None)
    assert not lane.hung(0.05)
    assert lane.submit(started.append)  # recovered: takes calls again
    started[1](None, OSError(5, "Input/output error"))
    outcome = lane.outcome()
    assert outcome is not None
    assert isinstance(outcome.error, OSError)
    lane.close()
    assert not lane.submit(started.append)


def test_a_reply_lane_call_that_cannot_be_sent_is_its_outcome() -> None:
    def unsent(_done: Callable[[int | None, BaseException | None], None]) -> None:
        raise OSError(32, "Broken pipe")

    lane: ReplyLane[int] = ReplyLane("m")
    assert lane.submit(unsent)
    assert lane.wait(time.monotonic())
    outcome = lane.outcome()
    assert outcome is not None
    assert isinstance(outcome.error, OSError)
    assert lane.busy_for() is None
