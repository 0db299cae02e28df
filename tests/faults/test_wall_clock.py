"""The exporter's wall clock watch: a step is logged once with its size, a slew never."""

from __future__ import annotations

import logging

import pytest

from fleetwatch.exporter.wallclock import WatchedWallClock


class Clocks:
    """A wall and a monotonic clock the test moves: `tick` moves both, `step` the wall one."""

    def __init__(self) -> None:
        self.wall, self.monotonic = 1_800_000_000.0, 5_000.0

    def tick(self, seconds: float) -> None:
        self.wall += seconds
        self.monotonic += seconds

    def step(self, seconds: float) -> None:
        self.wall += seconds


def steps_logged(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [
        float(r.__dict__["step_seconds"])
        for r in caplog.records
        if r.getMessage().startswith("wall clock stepped")
    ]


def test_a_step_is_logged_once_with_its_size(caplog: pytest.LogCaptureFixture) -> None:
    clocks = Clocks()
    watch = WatchedWallClock(wall=lambda: clocks.wall, monotonic=lambda: clocks.monotonic)
    with caplog.at_level(logging.WARNING):
        assert watch.now() == clocks.wall
        clocks.tick(5)
        watch.now()
        clocks.step(-3600)
        assert watch.now() == clocks.wall  # the wall time, stepped: a timestamp follows it
        clocks.tick(5)
        watch.now()
        clocks.step(7200)
        watch.now()
    assert steps_logged(caplog) == [-3600.0, 7200.0]


def test_ntp_slewing_is_not_a_step(caplog: pytest.LogCaptureFixture) -> None:
    """NTP corrects by at most 500 ppm: over a day of 5 s readings, no step is logged."""
    clocks = Clocks()
    watch = WatchedWallClock(wall=lambda: clocks.wall, monotonic=lambda: clocks.monotonic)
    with caplog.at_level(logging.WARNING):
        for _ in range(17_280):
            clocks.tick(5)
            clocks.step(5 * 500e-6)
            watch.now()
    assert steps_logged(caplog) == []
