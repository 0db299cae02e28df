"""The exporter's wall clock watch: a step is logged once with its size, a slew never; and the
one reading that compares wall-clock times (a dcgm-exporter job mapping's age against boot
time) is not fooled by a step forward once it read the mapping as live."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from fleetwatch.exporter.wallclock import WatchedWallClock
from fleetwatch.slurm import mapping


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


def test_a_dcgm_mapping_read_live_is_not_expired_by_a_step_forward(tmp_path: Path) -> None:
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    now = time.time()
    written = now - uptime + 60  # a minute after boot
    gpu3 = tmp_path / "3"
    gpu3.write_text("4242\n")
    os.utime(gpu3, (written, written))
    first = mapping.read(tmp_path, now=now)
    assert [job.job_id for job in first.jobs] == ["4242"]
    stepped = now + 3600  # the wall clock an hour ahead: boot time reads an hour later
    assert mapping.read(tmp_path, now=stepped).expired == 1  # what a fresh reader sees
    again = mapping.read(tmp_path, now=stepped, seen_live=first.dcgm_live)
    assert ([job.job_id for job in again.jobs], again.expired) == (["4242"], 0)
    os.utime(gpu3, (written - 1, written - 1))  # rewritten: judged afresh
    assert mapping.read(tmp_path, now=stepped, seen_live=first.dcgm_live).expired == 1
