"""Golden expositions of every GPU collector on dgx-h100 and the GB200-like scenario (the
Xid collector's from NVML: no Xid yet, each GPU listening).

The gb200 golden includes the NVLink-fabric families, with GPU 2's fabric degraded.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pynvml
import pytest

from fleetwatch.collectors.base import Collector
from fleetwatch.collectors.gpm import GpmCollector
from fleetwatch.collectors.gpu import GpuCollector
from fleetwatch.collectors.nvlink import NvLinkCollector
from fleetwatch.collectors.sources.nvml import FabricReading, NvmlSource
from fleetwatch.collectors.xid import XidCollector, XidLedger
from fleetwatch.sim.fabric_faults import FabricDegraded
from tests.golden import assert_golden
from tests.gpu.simnode import samples, simulated, text


def exposition(scenario: str) -> str:
    """Two cycles (GPM needs a pair of samples), the second one rendered."""
    _, source = simulated(scenario, at=120.0)
    collectors: list[Collector] = [
        GpuCollector(source=source, expected_count=None),
        GpmCollector(source=source),
        NvLinkCollector(source=source, nvlink5=True, per_gpu=False),
        XidCollector(source=source, kernel_log=None, ledger=XidLedger(window=5.0)),
    ]
    try:
        for collector in collectors:
            collector.collect()
        return "".join(text(c.collect()) for c in collectors)
    finally:
        for collector in collectors:
            collector.close()


@pytest.mark.parametrize("scenario", ["dgx-h100", "gb200"])
def test_golden_exposition(scenario: str) -> None:
    """(promtool checks every golden file: tests/exporter/test_exposition.py.)"""
    assert_golden(f"gpu/{scenario}.txt", exposition(scenario))


def test_dgx_h100_series_budget() -> None:
    series = [line for line in exposition("dgx-h100").splitlines() if not line.startswith("#")]
    assert 1000 < len(series) < 1500


def test_gb200_has_18_links_and_nvlink5_counters() -> None:
    body = exposition("gb200")
    links = {
        line.split('link="')[1].split('"')[0] for line in body.splitlines() if "nvlink_up{" in line
    }
    assert links == {str(n) for n in range(18)}
    assert 'error="symbol",gpu="1",link="17"' in body
    assert 'fleetwatch_nvlink_errors_total{error="symbol",gpu="1",link="17"' in body


def test_gb200_fabric_degraded_gpu_reads_1_and_the_others_0() -> None:
    body = exposition("gb200")
    degraded = {
        line.split('gpu="')[1].split('"')[0]: line.rsplit(" ", 1)[1]
        for line in body.splitlines()
        if line.startswith("fleetwatch_gpu_fabric_degraded{")
    }
    assert degraded == {"0": "0.0", "1": "0.0", "2": "1.0", "3": "0.0"}
    assert body.count('clique_id="32766"') == 4


def test_fabric_degraded_fault_ends_after_its_seconds() -> None:
    fault = FabricDegraded(at=10.0, gpu=0, seconds=20.0)
    for at, expected in ((5.0, 0.0), (15.0, 1.0), (40.0, 0.0)):
        _, source = simulated("dgx-h100", at=at, faults=(fault,), extra={"fabric_clique_id": 1})
        families = GpuCollector(source=source, expected_count=None).collect()
        values = samples(families, "fleetwatch_gpu_fabric_degraded")
        assert [v for k, v in values.items() if ("gpu", "0") in k] == [expected], at


class CountingNvml:
    """The fake NVML, counting how often each `nvml*` function is looked up (= called)."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            self.calls[name] += 1
        return getattr(self.lib, name)


def test_no_fabric_means_absent_series_and_one_call_per_gpu() -> None:
    fake, _ = simulated("dgx-h100")
    counting = CountingNvml(fake)
    collector = GpuCollector(source=NvmlSource(lib=counting), expected_count=None)
    for _ in range(3):
        body = text(collector.collect())
        assert "fleetwatch_gpu_fabric" not in body
    assert counting.calls["nvmlDeviceGetGpuFabricInfoV"] == 8


def test_fabric_timeout_is_a_failure_not_a_zero() -> None:
    fake, source = simulated("gb200")
    fake.fail("nvmlDeviceGetGpuFabricInfoV", error=pynvml.NVMLError_Timeout, gpu=1)
    families = GpuCollector(source=source, expected_count=None).collect()
    degraded = samples(families, "fleetwatch_gpu_fabric_degraded")
    assert sorted(dict(k)["gpu"] for k in degraded) == ["0", "2", "3"]
    errors = samples(families, "fleetwatch_gpu_nvml_errors_total")
    assert [dict(k)["call"] for k in errors] == ["nvmlDeviceGetGpuFabricInfoV"]
    fake.clear_failures()
    families = GpuCollector(source=source, expected_count=None).collect()
    assert len(samples(families, "fleetwatch_gpu_fabric_degraded")) == 4


@pytest.mark.parametrize(
    ("state", "status", "mask", "degraded"),
    [
        (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS, 0, False),
        (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_ERROR_UNKNOWN, 0, True),
        # Status means nothing before registration completes.
        (pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_ERROR_UNKNOWN, 0, False),
        (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS, 0b10_10_10_01, True),
        (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS, 0b10_01_10_10, True),
        # Route recovery in progress alone is not "degraded".
        (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS, 0b10_10_01_10, False),
    ],
)
def test_fabric_degraded_from_status_and_health_mask(
    state: int, status: int, mask: int, degraded: bool
) -> None:
    reading = FabricReading(
        cluster_uuid="c", clique_id=1, state=state, status=status, health_mask=mask
    )
    assert reading.degraded is degraded
