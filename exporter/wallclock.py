"""The wall clock, watched for steps: what the exporter stamps on `*_timestamp_seconds`.

Every interval in the exporter follows the monotonic clock, which nobody sets: collection
schedules, deadlines, hang detection and staleness (`time.monotonic`, asyncio's loop clock),
the kernel log's record stamps (`CLOCK_MONOTONIC`), InfiniBand link-flap windows and the
storage collector's probe schedule. An NTP step, a person's `date -s` or a VM resumed with an
old clock moves only the wall clock, so none of them runs early, late or twice, and no
reading is dropped as stale.

The wall clock is read only for values that mean a time of day
(`fleetwatch_collector_last_success_timestamp_seconds`): those follow a step, as they should.
So that a step is not silent, `WatchedWallClock` notices one as a change in the distance between
the two clocks and logs it once, with its size; the slow correction NTP makes by slewing
(at most 0.5 ms per second) never reaches `tolerance` between two readings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class WatchedWallClock:
    """`time.time()`, logging each step of the wall clock against the monotonic clock."""

    def __init__(
        self,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        tolerance: float = 1.0,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._tolerance = tolerance
        self._offset: float | None = None  # wall - monotonic at the last reading

    def now(self) -> float:
        """The wall-clock time; a step since the last reading is logged once."""
        wall = self._wall()
        offset = wall - self._monotonic()
        if self._offset is not None and abs(offset - self._offset) > self._tolerance:
            log.warning(
                "wall clock stepped; intervals and staleness follow the monotonic clock",
                extra={"step_seconds": round(offset - self._offset, 3)},
            )
        self._offset = offset
        return wall
