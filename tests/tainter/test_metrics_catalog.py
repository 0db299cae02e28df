"""The tainter's metric families are exactly those of the catalog's tainter module (the
`fleetwatch_tainter_*` rows of docs/metrics.md), the build's and the web config's (shared with
the exporter), and its exposition passes
`promtool check metrics`."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from fleetwatch import __version__
from fleetwatch.catalog import tainter
from fleetwatch.catalog.exporter import (
    BUILD_INFO,
    WEB_CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS,
    WEB_CONFIG_RELOAD_ERRORS_TOTAL,
)
from fleetwatch.tainter.metrics import TainterMetrics
from testbed.tool_servers import promtool_check_metrics


def test_every_tainter_family_is_catalogued_and_nothing_else() -> None:
    metrics = TainterMetrics()
    exposed = {
        (family.name + "_total" if family.type == "counter" else family.name)
        for family in metrics.registry.collect()
    }
    shared = (
        BUILD_INFO,
        WEB_CONFIG_RELOAD_ERRORS_TOTAL,
        WEB_CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS,
    )
    families = (*tainter.FAMILIES, *shared)
    assert exposed == {spec.name for spec in families}
    for family in metrics.registry.collect():
        spec = next(s for s in families if s.family_name == family.name)
        assert (family.type, family.documentation) == (spec.kind, spec.help)


def test_the_build_is_exported() -> None:
    (build,) = (f for f in TainterMetrics().registry.collect() if f.name == BUILD_INFO.name)
    (sample,) = build.samples
    assert (sample.labels["version"], sample.value) == (__version__, 1.0)


@pytest.mark.integration  # runs promtool
def test_exposition_passes_promtool() -> None:
    metrics = TainterMetrics()
    metrics.loop_errors.labels(loop="reconcile").inc()
    metrics.policy_refusals.labels(why="noexecute").inc()
    metrics.leader.set(1)
    assert promtool_check_metrics(generate_latest(metrics.registry).decode()) == []
