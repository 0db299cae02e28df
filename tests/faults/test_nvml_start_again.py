"""NVML's start tried again: a driver not loaded yet, a start that failed, a GPU that could
not be identified, all show within one cycle once NVML answers (they stayed away for good)."""

from __future__ import annotations

import logging

import pynvml
import pytest

from fleetwatch.collectors.gpu import GpuCollector
from fleetwatch.collectors.sources.nvml_calls import NvmlError
from tests.gpu.simnode import samples, simulated

VISIBLE = "fleetwatch_gpus_visible"


def visible(collector: GpuCollector) -> float | None:
    return samples(collector.collect(), VISIBLE).get(())


def test_a_driver_loaded_after_the_exporter_is_found(caplog: pytest.LogCaptureFixture) -> None:
    fake, source = simulated()
    fake.fail("nvmlInit", error=pynvml.NVMLError_DriverNotLoaded)
    collector = GpuCollector(source=source, expected_count=8)
    with caplog.at_level(logging.WARNING):
        assert visible(collector) == 0
        assert visible(collector) == 0
    assert len([r for r in caplog.records if "no NVIDIA driver" in r.getMessage()]) == 1
    fake.clear_failures()  # the driver is loaded
    assert visible(collector) == 8


def test_a_start_that_failed_is_tried_again() -> None:
    fake, source = simulated()
    fake.fail("nvmlDeviceGetCount", error=pynvml.NVMLError_Timeout)
    collector = GpuCollector(source=source, expected_count=8)
    with pytest.raises(NvmlError, match="nvmlDeviceGetCount failed: Timeout"):
        collector.collect()  # the engine reports the collector down, with this reason
    fake.clear_failures()
    assert visible(collector) == 8
    assert fake.init_calls == 1  # NVML started once; only what failed is asked again


def test_a_gpu_not_identified_at_start_comes_back(caplog: pytest.LogCaptureFixture) -> None:
    fake, source = simulated()
    fake.fail("nvmlDeviceGetUUID", error=pynvml.NVMLError_Unknown, gpu=5)
    collector = GpuCollector(source=source, expected_count=8)
    with caplog.at_level(logging.WARNING):
        assert visible(collector) == 7
        assert visible(collector) == 7
    assert len([r for r in caplog.records if "cannot identify" in r.getMessage()]) == 1
    fake.clear_failures()
    families = collector.collect()
    assert samples(families, VISIBLE) == {(): 8.0}
    info = samples(families, "fleetwatch_gpu_info")
    assert sorted(dict(labels)["gpu"] for labels in info) == [str(i) for i in range(8)]
