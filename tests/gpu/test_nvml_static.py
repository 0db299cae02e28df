"""A GPU's board-fixed values (temperature thresholds, maximum PCIe link) are read once,
not every cycle, and never kept from a call that failed: the next cycle asks again."""

from __future__ import annotations

import pynvml

from fleetwatch.collectors.sources.nvml import THRESHOLDS
from tests.gpu.simnode import simulated

STATIC_CALLS = (
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
)


def test_board_values_are_read_once() -> None:
    fake, source = simulated()
    gpu = source.gpus()[0]
    first = source.read_gpu(gpu)
    for call in STATIC_CALLS:  # asked again, each would now fail and be counted
        fake.fail(call, error=pynvml.NVMLError_Unknown)
    again = source.read_gpu(gpu)
    assert again.failures == ()
    assert again.thresholds_celsius == first.thresholds_celsius
    assert set(again.thresholds_celsius) == set(THRESHOLDS)
    assert None not in again.thresholds_celsius.values()
    assert (again.pcie_generation_max, again.pcie_width_max) == (5.0, 16.0)


def test_a_failed_board_read_is_retried_next_cycle() -> None:
    fake, source = simulated()
    gpu = source.gpus()[0]
    fake.fail("nvmlDeviceGetMaxPcieLinkWidth", error=pynvml.NVMLError_Unknown)
    failed = source.read_gpu(gpu)
    assert failed.pcie_width_max is None
    assert [f.call for f in failed.failures] == ["nvmlDeviceGetMaxPcieLinkWidth"]
    fake.clear_failures()
    assert source.read_gpu(gpu).pcie_width_max == 16.0
