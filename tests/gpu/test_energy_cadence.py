"""The energy counter is read once every `--collector.gpu.energy-interval`, not every cycle
(on hardware the call costs the driver milliseconds of CPU a GPU): between reads the last
value is exported, a failed read is made again the next cycle, and a GPU that appears is
read at once."""

from __future__ import annotations

import pynvml

from fleetwatch.collectors.families import SeriesFamily
from fleetwatch.collectors.gpu import GpuCollector
from fleetwatch.collectors.sources.nvml import NvmlSource
from testbed.clock import FixedClock
from tests.gpu.simnode import ControlledNvml, samples, simulated

ENERGY = "fleetwatch_gpu_energy_joules_total"
ERRORS = "fleetwatch_gpu_nvml_errors_total"


def energy(families: list[SeriesFamily]) -> dict[str, float]:
    return {dict(labels)["gpu"]: value for labels, value in samples(families, ENERGY).items()}


class Stopwatch:
    """The collector's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cadenced(interval: float) -> tuple[ControlledNvml, NvmlSource, GpuCollector, Stopwatch]:
    """A gpu collector on the simulated dgx-h100 reading energy every `interval`."""
    fake, source = simulated(at=100.0)
    clock = Stopwatch()
    collector = GpuCollector(
        source=source, expected_count=None, energy_interval=interval, clock=clock
    )
    return fake, source, collector, clock


def test_energy_is_read_once_an_interval_and_its_last_value_kept_between() -> None:
    fake, _, collector, clock = cadenced(30.0)
    first = energy(collector.collect())
    assert len(first) == 8
    assert all(value > 0 for value in first.values())
    # Asked again within the interval, the call would now fail and be counted.
    fake.fail("nvmlDeviceGetTotalEnergyConsumption", error=pynvml.NVMLError_Unknown)
    fake.node.clock = FixedClock(200.0)  # the GPUs went on drawing power
    clock.now += 29.9
    kept = collector.collect()
    assert energy(kept) == first
    assert samples(kept, ERRORS) == {}
    clock.now += 0.1  # due: read, fails, absent and counted like any failed reading
    failed = collector.collect()
    assert energy(failed) == {}
    assert {dict(labels)["call"] for labels in samples(failed, ERRORS)} == {
        "nvmlDeviceGetTotalEnergyConsumption"
    }
    fake.clear_failures()
    clock.now += 1.0  # the failed read is made again the next cycle, not an interval later
    again = energy(collector.collect())
    assert set(again) == set(first)
    assert all(again[gpu] > first[gpu] for gpu in first)


def test_every_cycle_when_the_interval_is_the_collection_interval() -> None:
    fake, _, collector, clock = cadenced(5.0)
    first = energy(collector.collect())
    fake.node.clock = FixedClock(200.0)
    clock.now += 5.0
    assert all(value > first[gpu] for gpu, value in energy(collector.collect()).items())


def test_a_gpu_that_appears_is_read_at_once() -> None:
    _, source, collector, clock = cadenced(30.0)
    listed = source.gpus()
    source._gpus = listed[:4]  # GPUs 4-7 not listed yet (hot-plugged, or NVML started again)
    assert set(energy(collector.collect())) == {"0", "1", "2", "3"}
    source._gpus = listed
    clock.now += 5.0
    assert set(energy(collector.collect())) == {str(gpu) for gpu in range(8)}
