"""The tainter's metric families are exactly those of the catalog's tainter module (the
`fleetwatch_tainter_*` rows of docs/metrics.md), and its exposition passes
`promtool check metrics`."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from fleetwatch.catalog import tainter
from fleetwatch.tainter.metrics import TainterMetrics
from testbed.tool_servers import promtool_check_metrics


def test_every_tainter_family_is_catalogued_and_nothing_else() -> None:
    metrics = TainterMetrics()
    exposed = {
        (family.name + "_total" if family.type == "counter" else family.name)
        for family in metrics.registry.collect()
    }
    assert exposed == {spec.name for spec in tainter.FAMILIES}
    for family in metrics.registry.collect():
        spec = next(s for s in tainter.FAMILIES if s.family_name == family.name)
        assert (family.type, family.documentation) == (spec.kind, spec.help)


@pytest.mark.integration  # runs promtool
def test_exposition_passes_promtool() -> None:
    metrics = TainterMetrics()
    metrics.loop_errors.labels(loop="reconcile").inc()
    metrics.policy_refusals.labels(why="noexecute").inc()
    metrics.leader.set(1)
    assert promtool_check_metrics(generate_latest(metrics.registry).decode()) == []
