"""The whole node's exposition: the collector goldens together, catalog, promtool, Prometheus.

Each collector has its own golden file (tests/golden/gpu, pci, infiniband), and
nothing here restates their values: the whole exposition, collected by the engine on a
simulated node, must hold exactly the series of those goldens plus the engine's
self-metrics. The integration tests run promtool on every golden and on a live
exporter's scrape, and a real Prometheus scraping a real `fleetwatch export` process.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetwatch.catalog import ALL
from fleetwatch.cli import build_parser
from fleetwatch.collectors import COLLECTORS
from fleetwatch.exporter.engine import SELF_METRICS, Engine, ScheduledCollector
from fleetwatch.exporter.export import close_collectors, create_collectors
from fleetwatch.exporter.hardware import simulated_hardware
from fleetwatch.exporter.settings import ExportSettings
from fleetwatch.sim import servers
from fleetwatch.sim.scenario import load_scenario
from fleetwatch.sim.world import SimulatedNode
from testbed.clock import FixedClock
from testbed.servers import prom_query, promtool_check_metrics
from tests.exporter.node import collect_node
from tests.golden import GOLDEN_DIR

FAMILY = re.compile(r"^# TYPE (\S+) (\w+)$", re.MULTILINE)
# The collector goldens of the dgx-h100 scenario: together, the node's whole exposition.
DGX_H100_GOLDENS = ("gpu/dgx-h100.txt", "pci/dgx-h100.prom", "infiniband/dgx-h100.prom")


def catalog_names() -> set[str]:
    """Every family the metric catalog declares (what docs/metrics.md is generated from)."""
    return {spec.name for spec in ALL}


def series_of(text: str) -> set[str]:
    """Each sample's `name{labels}`, without its value: what the exposition holds, not
    what it reads."""
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")}


def families_of(text: str) -> set[tuple[str, str]]:
    return set(FAMILY.findall(text))


async def engine_exposition(scenario: str, at: float, workdir: Path) -> str:
    """The engine's exposition of every default collector on `scenario`, once every
    collector is up and the GPM families (which need two samples) are there."""
    node = SimulatedNode(scenario=load_scenario(scenario), clock=FixedClock(at))
    args = build_parser().parse_args(["export", f"--simulate={scenario}"])
    hardware = simulated_hardware(node, workdir, ExportSettings.from_args(args, COLLECTORS))
    collectors = create_collectors(hardware.context, hardware.settings)
    engine = Engine(
        collectors=[
            ScheduledCollector(name=name, collector=collector, interval=0.2, timeout=10.0)
            for name, collector in collectors.items()
        ],
        max_staleness=60.0,
        hang_timeout=30.0,
        version="test",
    )
    await engine.start()
    try:
        deadline = asyncio.get_running_loop().time() + 30
        while not (
            all(state.up for state in engine.states)
            and b"\nfleetwatch_gpu_tensor_active_ratio{" in engine.exposition()
        ):
            assert asyncio.get_running_loop().time() < deadline, "not every family within 30s"
            await asyncio.sleep(0.05)
        return engine.exposition().decode()
    finally:
        await engine.stop()
        close_collectors(collectors)


async def test_exposition_is_the_collector_goldens_plus_self_metrics(tmp_path: Path) -> None:
    text = await engine_exposition("dgx-h100", 600.0, tmp_path)
    goldens = "".join((GOLDEN_DIR / name).read_text() for name in DGX_H100_GOLDENS)
    self_names = {m.family_name for m in SELF_METRICS}
    own = {(n, t) for n, t in families_of(text) if n.removesuffix("_total") not in self_names}
    assert own == families_of(goldens)
    collected = {s for s in series_of(text) if not s.startswith("fleetwatch_collector_")}
    collected -= {s for s in collected if s.startswith("fleetwatch_build_info")}
    assert sorted(collected ^ series_of(goldens)) == []
    emitted_self = {n.removesuffix("_total") for n, _ in families_of(text)} & self_names
    assert emitted_self == self_names
    for collector in COLLECTORS:
        assert f'fleetwatch_collector_up{{collector="{collector.name}"}} 1.0' in text


def test_every_collector_declares_its_metrics() -> None:
    for spec in COLLECTORS:
        assert spec.metrics, f"collector {spec.name} declares no metrics in its CollectorSpec"


def tainter_names() -> set[str]:
    """Exposition names of the tainter's families (served by `fleetwatch taint`)."""
    from fleetwatch.tainter.metrics import TainterMetrics

    suffix = {"counter": "_total"}
    return {f.name + suffix.get(f.type, "") for f in TainterMetrics().registry.collect()}


def test_catalog_lists_exactly_what_fleetwatch_can_emit() -> None:
    declared = {m.name for spec in COLLECTORS for m in spec.metrics}
    declared |= {m.name for m in SELF_METRICS} | tainter_names()
    catalog = catalog_names()
    assert sorted(declared - catalog) == [], "families missing from fleetwatch.catalog"
    assert sorted(catalog - declared) == [], "fleetwatch.catalog declares families nothing emits"


@pytest.mark.parametrize(
    ("scenario", "at"), [("dgx-h100", 600.0), ("gb200", 600.0), ("demo", 56.0)]
)
def test_emitted_families_are_catalogued(scenario: str, at: float, tmp_path: Path) -> None:
    """Every family a simulated node's exporter emits is in the catalog, with its type."""
    text = collect_node(scenario, at, tmp_path)
    emitted = dict(FAMILY.findall(text))
    assert emitted, "nothing emitted"
    # A TYPE line names a counter with or without `_total` (OpenMetrics or 0.0.4 text).
    catalog = {name: spec.kind for spec in ALL for name in (spec.name, spec.family_name)}
    assert sorted(set(emitted) - set(catalog)) == [], "emitted but not in fleetwatch.catalog"
    assert {name: catalog[name] for name in emitted} == emitted


@pytest.fixture(scope="module")
def live(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[servers.Server, servers.Server]]:
    """A real exporter on dgx-h100 and a real Prometheus scraping it as node `node-a`."""
    workdir = tmp_path_factory.mktemp("live")
    with servers.fleetwatch_export(
        workdir / "exporter", simulate="dgx-h100", args=["--collector.interval=1s"]
    ) as exporter:
        target = exporter.url.removeprefix("http://")
        scrape = [
            {
                "job_name": "fleetwatch",
                "static_configs": [{"targets": [target], "labels": {"node": "node-a"}}],
            }
        ]
        with servers.prometheus(workdir / "prometheus", scrape_configs=scrape) as prom:
            yield exporter, prom


@pytest.mark.integration
def test_prometheus_scrapes_temperatures_with_node_label(
    live: tuple[servers.Server, servers.Server],
) -> None:
    _exporter, prom = live
    expr = 'fleetwatch_gpu_temperature_celsius{sensor="gpu"}'
    result = servers.wait_until(lambda: prom_query(prom, expr) or None, timeout=30, what=expr)
    assert len(result) == 8
    assert {r["metric"]["node"] for r in result} == {"node-a"}
    assert {r["metric"]["gpu"] for r in result} == {str(i) for i in range(8)}
    for r in result:
        assert 55 < float(r["value"][1]) < 75
    up = prom_query(prom, 'up{job="fleetwatch"}')
    assert [float(r["value"][1]) for r in up] == [1.0]


@pytest.mark.integration
def test_live_exposition_passes_promtool(live: tuple[servers.Server, servers.Server]) -> None:
    exporter, _prom = live
    body = servers.http_get(exporter.url + "/metrics")
    assert promtool_check_metrics(body.decode()) == []
    assert b"fleetwatch_collector_up" in body


@pytest.mark.integration
@pytest.mark.parametrize(
    "golden",
    sorted(p.relative_to(GOLDEN_DIR).as_posix() for p in GOLDEN_DIR.rglob("*") if p.is_file()),
)
def test_every_golden_exposition_passes_promtool(golden: str) -> None:
    text = (GOLDEN_DIR / golden).read_text()
    assert text.startswith("# HELP fleetwatch_")
    assert promtool_check_metrics(text) == []


@pytest.mark.integration
def test_the_demos_scrape_passes_promtool(tmp_path: Path) -> None:
    """The demo scenario's exporter once its first faults have happened (NVLink errors,
    an InfiniBand flap, a lost GPU and its Xid 79 all start within a minute)."""
    with servers.fleetwatch_export(
        tmp_path, simulate="demo", args=["--collector.interval=1s"]
    ) as exporter:

        def after_the_xid() -> bytes | None:
            text = servers.http_get(exporter.url + "/metrics")
            return text if b"fleetwatch_gpu_xid_errors_total{" in text else None

        body = servers.wait_until(
            after_the_xid,
            timeout=90,
            interval=1.0,
            what="the demo's Xid 79",
        )
    assert promtool_check_metrics(body.decode()) == []


@pytest.mark.integration
def test_serving_line_names_the_collectors_turned_off(tmp_path: Path) -> None:
    """Where the chart turns a source off (no privilege for it), the log says so."""
    with servers.fleetwatch_export(
        tmp_path, simulate="dgx-h100", args=["--no-collector.podresources", "--no-collector.gpm"]
    ) as exporter:
        serving = servers.wait_until(
            lambda: next(
                (
                    json.loads(line)
                    for line in exporter.log().splitlines()
                    if line.startswith("{") and json.loads(line)["msg"] == "serving"
                ),
                None,
            ),
            timeout=30,
            what="the serving log line",
        )
    assert serving["disabled"] == "gpm,podresources"
    assert "podresources" not in serving["collectors"].split(",")
