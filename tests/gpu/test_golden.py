"""Golden expositions of every GPU collector on dgx-h100 and the GB200-like scenario."""

from __future__ import annotations

import pytest
from fleetwatch.collectors.base import Collector
from fleetwatch.collectors.gpm import GpmCollector
from fleetwatch.collectors.gpu import GpuCollector
from fleetwatch.collectors.nvlink import NvLinkCollector

from testbed import servers
from tests.golden import assert_golden
from tests.gpu.simnode import simulated, text


def exposition(scenario: str) -> str:
    """Two cycles (GPM needs a pair of samples), the second one rendered."""
    _, source = simulated(scenario, at=120.0)
    collectors: list[Collector] = [
        GpuCollector(source=source, expected_count=None),
        GpmCollector(source=source),
        NvLinkCollector(source=source, nvlink5=True, per_gpu=False),
    ]
    for collector in collectors:
        collector.collect()
    return "".join(text(c.collect()) for c in collectors)


@pytest.mark.parametrize("scenario", ["dgx-h100", "gb200"])
def test_golden_exposition_passes_promtool(scenario: str) -> None:
    body = exposition(scenario)
    assert_golden(f"gpu/{scenario}.txt", body)
    assert servers.promtool_check_metrics(body) == []


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
