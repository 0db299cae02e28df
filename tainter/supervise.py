"""Supervised background loops: a failure is logged, counted and retried, never fatal.

The tainter's loops (reconcile, breaker state, leader election) must keep running through
anything a dependency answers, and a loop that is wedged (an await that never returns)
must not look healthy. Each loop records when it last completed an iteration, failed or
not, and when it last succeeded; `/healthz` fails when any loop has not completed one for
`stall_intervals` of its intervals (plus a grace for slow iterations), so the kubelet
restarts the process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fleetwatch.tainter.metrics import TainterMetrics

log = logging.getLogger(__name__)


@dataclass
class LoopState:
    """One loop's progress, on the monotonic clock."""

    name: str
    interval: float
    last_completed: float
    last_success: float | None = None


class Supervisor:
    """Runs and watches the process's background loops."""

    def __init__(
        self,
        *,
        metrics: TainterMetrics,
        stall_intervals: float = 5.0,
        stall_grace: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self._stall_intervals = stall_intervals
        self._stall_grace = stall_grace
        self._clock = clock
        self._loops: dict[str, LoopState] = {}

    def stalled(self) -> list[str]:
        """Loops that have not completed an iteration in time, with how long ago."""
        now = self._clock()
        return [
            f"{state.name} loop: no iteration completed for {now - state.last_completed:.0f}s"
            for state in self._loops.values()
            if now - state.last_completed
            > self._stall_intervals * state.interval + self._stall_grace
        ]

    async def run(
        self,
        name: str,
        body: Callable[[], Awaitable[None]],
        *,
        interval: float,
        wake: asyncio.Event | None = None,
    ) -> None:
        """Run `body` now and then every `interval` seconds (sooner when `wake` is set),
        forever. Exceptions are logged with their traceback, counted in
        `fleetwatch_tainter_reconcile_errors_total{loop}`, and retried next interval."""
        state = LoopState(name=name, interval=interval, last_completed=self._clock())
        self._loops[name] = state
        while True:
            if wake is not None:
                wake.clear()
            try:
                await body()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # supervision: every failure is logged and retried
                self._metrics.loop_errors.labels(loop=name).inc()
                log.error(
                    "background loop iteration failed; retrying",
                    exc_info=exc,
                    extra={"loop": name, "error": repr(exc), "retry_in_s": interval},
                )
            else:
                state.last_success = self._clock()
                self._metrics.loop_last_success.labels(loop=name).set(time.time())
            state.last_completed = self._clock()
            if wake is None:
                await asyncio.sleep(interval)
                continue
            try:
                await asyncio.wait_for(wake.wait(), timeout=interval)
            except TimeoutError:
                continue  # the interval passed: run again
