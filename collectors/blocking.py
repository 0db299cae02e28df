"""Calls that can block in the kernel forever, run where a blocked one delays nothing else.

A hard NFS mount whose server is gone (or a FUSE server that stopped answering) blocks every
call on it inside the kernel: `statvfs`, a read, an fsync, for as long as the server is
away. `Lane` is one long-lived daemon thread per key (a mount point) running one call at a
time: a call submitted while the previous one is still blocked is refused, not queued, so
calls never stack (at most one stuck call per mount); the caller waits only as long as it
chooses and reads the result later. A call in flight longer than the deadline makes the lane
hung and is counted once; the lane recovers by itself when the call returns. The thread is
a daemon, so a call still stuck does not keep the process from exiting on SIGTERM.

Never one thread per attempt: a lane's thread serves every call for its key, and a stuck
lane starts no other. Where the blocking call runs in another process (the mount helper),
`ReplyLane` keeps the same rules without a thread: the call is sent, and the reply, read by
one thread for all lanes, ends it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What the lane's last finished call gave: a value, or the exception it raised."""

    value: T | None
    error: BaseException | None
    finished_at: float


class LaneState(Generic[T]):
    """One key's call slot: one call at a time, never stacked; its outcome and hung count.

    What runs the call is the subclass's: `Lane` a thread of its own, `ReplyLane` whoever
    answers (another process, through a reader thread shared by every lane).
    """

    def __init__(self, name: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._clock = clock
        self._cond = threading.Condition()
        self._started_at: float | None = None
        self._outcome: Outcome[T] | None = None
        self._stuck_counted = False
        self._closed = False
        self.stuck_calls = 0  # calls that passed the deadline, each counted once

    def _begin(self) -> bool:
        """Mark a call started (with the condition held); False while one is in flight."""
        if self._closed or self._started_at is not None:
            return False
        self._started_at = self._clock()
        self._stuck_counted = False
        return True

    def _finish(self, value: T | None, error: BaseException | None) -> None:
        """The call in flight ended: keep its outcome, the lane is idle again."""
        with self._cond:
            self._outcome = Outcome(value, error, self._clock())
            self._started_at = None
            self._cond.notify_all()

    def wait(self, deadline: float) -> bool:
        """Wait until the lane is idle or the monotonic `deadline` passes; True when idle."""
        with self._cond:
            while self._started_at is not None:
                left = deadline - self._clock()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def busy_for(self) -> float | None:
        """Seconds the call in flight has been running; None when idle."""
        with self._cond:
            return None if self._started_at is None else self._clock() - self._started_at

    def hung(self, deadline: float) -> bool:
        """True while the call in flight has run longer than `deadline` seconds (the first
        time it is seen so, it is counted in `stuck_calls`)."""
        with self._cond:
            if self._started_at is None or self._clock() - self._started_at <= deadline:
                return False
            if not self._stuck_counted:
                self._stuck_counted = True
                self.stuck_calls += 1
            return True

    def outcome(self) -> Outcome[T] | None:
        """The last finished call's outcome (None before the first one finishes)."""
        with self._cond:
            return self._outcome

    def close(self) -> None:
        """Start no further call (a call in flight is left to end by itself)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` for what runs the calls to end; True when it has."""
        return True


class Lane(LaneState[T]):
    """One key's worker thread: one call at a time, never stacked, abandoned when stuck."""

    def __init__(self, name: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name, clock=clock)
        self._call: Callable[[], T] | None = None
        self._thread = threading.Thread(target=self._serve, name=f"lane-{name}", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], T]) -> bool:
        """Start `call` on the lane; False (and nothing started) while one is in flight."""
        with self._cond:
            if not self._begin():
                return False
            self._call = call
            self._cond.notify_all()
            return True

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` for the thread to end (after `close`); True when it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while self._call is None and not self._closed:
                    self._cond.wait()
                if self._call is None:
                    return
                call, self._call = self._call, None
            value: T | None = None
            error: BaseException | None = None
            try:
                value = call()
            except Exception as exc:  # handed to the reader through the outcome
                error = exc
            self._finish(value, error)


class ReplyLane(LaneState[T]):
    """A lane whose calls run elsewhere (the mount helper process): no thread of its own.

    `submit(start)` calls `start(done)`, which sends the call and returns at once; whoever
    receives the answer calls `done` once, from any thread. Same rules as `Lane`: one call at
    a time, a stuck one blocks only this lane, and counts once as stuck.
    """

    def submit(
        self, start: Callable[[Callable[[T | None, BaseException | None], None]], None]
    ) -> bool:
        """Start a call through `start`; False (and nothing started) while one is in flight."""
        with self._cond:
            if not self._begin():
                return False
        try:
            start(self._finish)
        except Exception as exc:  # could not even be sent: that call's outcome
            self._finish(None, exc)
        return True
