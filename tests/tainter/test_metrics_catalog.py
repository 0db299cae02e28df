"""The tainter's metric families are exactly the `fleetwatch_tainter_*` rows of
docs/metrics.md, and its exposition passes `promtool check metrics`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fleetwatch.tainter.metrics import TainterMetrics
from prometheus_client import generate_latest

from testbed.servers import promtool_check_metrics

CATALOG = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_every_tainter_family_is_catalogued_and_nothing_else() -> None:
    metrics = TainterMetrics()
    exposed = {
        (family.name + "_total" if family.type == "counter" else family.name)
        for family in metrics.registry.collect()
    }
    catalogued = set(re.findall(r"^\| `(fleetwatch_tainter_[a-z_]+)`", CATALOG.read_text(), re.M))
    assert exposed == catalogued


@pytest.mark.integration  # runs promtool
def test_exposition_passes_promtool() -> None:
    metrics = TainterMetrics()
    metrics.loop_errors.labels(loop="reconcile").inc()
    metrics.policy_refusals.labels(why="noexecute").inc()
    metrics.leader.set(1)
    assert promtool_check_metrics(generate_latest(metrics.registry).decode()) == []
