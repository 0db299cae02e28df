"""The whole node's exposition: golden file, catalog agreement, promtool, real Prometheus.

Collectors run in-process on a simulated node at a fixed simulated time, so the golden
exposition is reproducible; the integration test runs the real `fleetwatch export`
process and a real Prometheus scraping it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleetwatch.collectors import COLLECTORS
from fleetwatch.exporter.engine import SELF_METRICS
from fleetwatch.exporter.export import close_collectors, create_collectors
from fleetwatch.exporter.hardware import simulated_hardware
from fleetwatch.exporter.render import Renderer
from fleetwatch.exporter.settings import ExportSettings
from fleetwatch.sim import servers
from fleetwatch.sim.scenario import load_scenario
from fleetwatch.sim.world import SimulatedNode

from fleetwatch.cli import build_parser
from testbed.clock import FixedClock
from testbed.servers import prom_query, promtool_check_metrics
from tests.golden import GOLDEN_DIR, assert_golden

CATALOG = Path(__file__).parents[2] / "docs" / "metrics.md"
FAMILY = re.compile(r"^# TYPE (\S+) (\w+)$", re.MULTILINE)


def collect_node(scenario: str, at: float, workdir: Path, *flags: str) -> str:
    """Every default collector's exposition for `scenario` at simulated time `at`."""
    node = SimulatedNode(scenario=load_scenario(scenario), clock=FixedClock(at))
    root = workdir / f"sysfs-{scenario}-{at:g}"
    args = build_parser().parse_args(["export", f"--simulate={scenario}", *flags])
    hardware = simulated_hardware(node, root, ExportSettings.from_args(args, COLLECTORS))
    collectors = create_collectors(hardware.context, hardware.settings)
    try:
        parts = [Renderer().render(c.collect()) for c in collectors.values()]
    finally:
        close_collectors(collectors)
    return b"".join(parts).decode()


def catalog_names() -> set[str]:
    names = re.findall(r"^\| `(fleetwatch_[a-z0-9_]+)`", CATALOG.read_text(), re.MULTILINE)
    assert names, f"no metric rows found in {CATALOG}"
    return set(names)


def test_golden_dgx_h100(tmp_path: Path) -> None:
    text = collect_node("dgx-h100", 600.0, tmp_path)
    assert "fleetwatch_gpu_temperature_celsius" in text
    assert_golden("exposition-dgx-h100.txt", text)


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
    assert sorted(declared - catalog) == [], "families missing from docs/metrics.md"
    assert sorted(catalog - declared) == [], "docs/metrics.md lists families nothing emits"


@pytest.mark.parametrize(("scenario", "at"), [("dgx-h100", 600.0), ("demo", 56.0)])
def test_emitted_families_are_catalogued(scenario: str, at: float, tmp_path: Path) -> None:
    text = collect_node(scenario, at, tmp_path)
    emitted = {name for name, _type in FAMILY.findall(text)}
    assert emitted, "nothing emitted"
    assert sorted(emitted - catalog_names()) == [], "emitted but not in docs/metrics.md"


@pytest.fixture(scope="module")
def live(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[servers.Server, servers.Server]]:
    """A real exporter on dgx-h100 and a real Prometheus scraping it as node `node-a`."""
    workdir = tmp_path_factory.mktemp("live")
    with servers.fleetwatch_export(
        workdir / "exporter", simulate="dgx-h100", args=["--collection-interval=1s"]
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
        tmp_path, simulate="demo", args=["--collection-interval=1s"]
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
