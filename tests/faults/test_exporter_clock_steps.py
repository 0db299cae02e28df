"""The wall clock stepped backwards and forwards under a running exporter, with libfaketime.

A real `fleetwatch export --simulate dgx-h100` runs with libfaketime preloaded (Debian package
`faketime`): its wall clock (`CLOCK_REALTIME`, what `time.time()` reads) is the real one plus
the offset in a file the test rewrites mid-run, re-read every second; the monotonic clock is
left alone (`FAKETIME_DONT_FAKE_MONOTONIC`), as an NTP step or `date -s` leaves it. The test
steps the wall clock an hour back, then two hours forward, and checks what the exporter
serves around each step: every collector keeps running on its interval, the same series are
served (none dropped as stale), counters never go back, rates and ratios stay in range, the
collectors' last-success timestamps follow the wall clock (where a step should show), and the
log names each step once with its size.

Skipped, saying why, where libfaketime is not installed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.sim.loopback_servers import Server, fleetwatch_command, http_get, wait_until

pytestmark = pytest.mark.integration

LIBFAKETIME = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
INTERVAL = 2.0  # seconds between runs of each collector
TIMEOUT = 60.0  # for a condition that takes a few intervals on a loaded machine
LAST_SUCCESS = "fleetwatch_collector_last_success_timestamp_seconds"
STEP_LOG = "wall clock stepped; intervals and staleness follow the monotonic clock"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class SteppedExporter:
    """A running exporter and the file that sets its wall clock's offset from the real one."""

    def __init__(self, server: Server, offset_file: Path) -> None:
        self.server = server
        self._offset_file = offset_file

    def set_offset(self, seconds: int) -> None:
        """Step the exporter's wall clock to the real one plus `seconds`, at once."""
        staged = self._offset_file.with_suffix(".new")
        staged.write_text(f"{seconds:+d}\n")
        staged.replace(self._offset_file)  # libfaketime never reads a half-written file

    def samples(self) -> Samples:
        text = http_get(f"{self.server.url}/metrics").decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def log_lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.server.log().splitlines() if line.startswith("{")]


def last_success(samples: Samples) -> dict[str, float]:
    return {
        dict(labels)["collector"]: v
        for (name, labels), v in samples.items()
        if name == LAST_SUCCESS
    }


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[SteppedExporter]:
    if not LIBFAKETIME:
        pytest.skip("libfaketime is not installed (Debian package `faketime`)")
    offset_file = tmp_path / "faketime-offset"
    offset_file.write_text("+0\n")
    env = {
        "LD_PRELOAD": str(LIBFAKETIME[0]),
        "FAKETIME_TIMESTAMP_FILE": str(offset_file),
        # Re-read the file at most once a second: a step takes effect within a second (the
        # checks poll). Reading it at every call (FAKETIME_NO_CACHE) made each clock read a
        # file read, and the collectors overran their deadlines on a loaded machine.
        "FAKETIME_CACHE_DURATION": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    args = ["--simulate=dgx-h100", f"--collector.interval={INTERVAL:g}s"]
    with fleetwatch_command(
        tmp_path, command="export", args=args, ready_path="/readyz", env=env
    ) as server:
        yield SteppedExporter(server, offset_file)


def ran_since(exporter: SteppedExporter, since: dict[str, float], runs: int) -> Samples | None:
    """The exposition once every collector has finished `runs` runs after the readings
    `since` (wall-clock stamps taken after the last step), else None."""
    samples = exporter.samples()
    now = last_success(samples)
    if set(now) == set(since) and all(now[c] >= since[c] + (runs - 0.5) * INTERVAL for c in now):
        return samples
    return None


def after_step(exporter: SteppedExporter, *, offset: int, step: int) -> Samples:
    """Set the wall clock's offset to `offset` (a step of `step` seconds), wait until every
    collector has stamped a success in the new wall time and then run twice more; the
    exposition then."""
    before = last_success(exporter.samples())
    exporter.set_offset(offset)

    def stamped() -> dict[str, float] | None:
        now = last_success(exporter.samples())
        moved = set(now) == set(before) and all(abs(now[c] - before[c] - step) < 600 for c in now)
        return now if moved else None

    stepped = wait_until(
        stamped, timeout=TIMEOUT, what=f"every collector's success stamped {step:+d} s off"
    )
    return wait_until(
        lambda: ran_since(exporter, stepped, runs=2),
        timeout=TIMEOUT,
        what=f"two more runs of every collector after the {step:+d} s step",
    )


def test_wall_clock_steps_change_nothing_but_the_timestamps(exporter: SteppedExporter) -> None:
    first = last_success(exporter.samples())
    start = wait_until(
        lambda: ran_since(exporter, first, runs=2),
        timeout=TIMEOUT,
        what="two runs of every collector",
    )
    back = after_step(exporter, offset=-3600, step=-3600)
    forward = after_step(exporter, offset=+3600, step=+7200)
    snapshots = {"before": start, "an hour back": back, "an hour ahead": forward}

    # The same series throughout: nothing dropped as stale, nothing added.
    for when, samples in snapshots.items():
        assert set(samples) == set(start), when
    # Counters never go back; rates and ratios stay in range; every collector up.
    peak_rate = max(v for (n, _), v in start.items() if n.endswith("_per_second"))
    for (name, labels), value in start.items():
        key = (name, labels)
        values = (back[key], forward[key])
        assert all(math.isfinite(v) for v in values), key
        if name.endswith("_total"):
            assert value <= back[key] <= forward[key], key
        if name.endswith("_ratio"):
            assert all(0 <= v <= 1 for v in values), key
        if name.endswith("_per_second"):
            assert all(0 <= v <= 2 * peak_rate for v in values), key
    for when, samples in snapshots.items():
        up = {
            dict(k)["collector"]: v
            for (n, k), v in samples.items()
            if n == "fleetwatch_collector_up"
        }
        assert set(up.values()) == {1.0}, (when, up)
        hung = [k for (n, k), v in samples.items() if n == "fleetwatch_collector_hung" and v]
        assert hung == [], when
    # Where a step should show: the success stamps follow the wall clock.
    for collector, stamp in last_success(back).items():
        assert -3600 - 60 < stamp - last_success(start)[collector] < -3600 + 60, collector
    for collector, stamp in last_success(forward).items():
        assert 7200 - 60 < stamp - last_success(back)[collector] < 7200 + 60, collector
    # And in the log, once per step with its size; no collector's series dropped as stale.
    lines = exporter.log_lines()
    steps = [round(float(str(line["step_seconds"]))) for line in lines if line["msg"] == STEP_LOG]
    assert len(steps) == 2, steps
    assert abs(steps[0] + 3600) < 60, steps
    assert abs(steps[1] - 7200) < 60, steps
    assert not [line for line in lines if str(line["msg"]).startswith("dropping stale series")]
