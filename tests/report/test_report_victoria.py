"""The report gives the same findings from Prometheus and from VictoriaMetrics.

One simulated history (sim/fleet.py) goes into a real Prometheus (backfilled with promtool)
and into a real VictoriaMetrics (Debian's 1.79, through its import API); the report runs
against each with the same flags and its finding tables must name the same GPUs, ports,
jobs and actions. Where the engines legitimately differ in a number (VictoriaMetrics'
`increase` does not extrapolate; it looks back one scrape interval rather than Prometheus'
5 minutes, so a backfilled alert does not linger), the test says so.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from fleetwatch.cli import main
from fleetwatch.sim.fleet import FleetSpec, write_openmetrics, write_victoria_import
from testbed.servers import history_store

pytestmark = pytest.mark.integration

SPEC = FleetSpec(nodes=8, gpus_per_node=8, ib_ports_per_node=8, hours=4)
# Tables whose rows are findings or the fleet's inventory: the same keys from both engines.
KEYED = {
    "actions": ("action", "target"),
    "thermal_hot_gpus": ("node", "gpu"),
    "thermal_outliers": ("node", "gpu"),
    "gpu_temperatures": ("node", "gpu"),
    "activity_by_node": ("node",),
    "idle_allocated_gpus": ("node", "gpu"),
    "stragglers": ("node", "gpu"),
    "idle_in_job": ("node", "gpu"),
    "jobs": ("namespace", "training_job"),
    "job_slowdowns": ("namespace", "training_job"),
    "ib_port_errors": ("node", "device", "port", "error"),
    "ib_flaps": ("node", "device", "port"),
    "ib_saturated_counters": ("node", "device", "port"),
    "ib_degraded_ports": ("node", "device", "port"),
    "xid_events": ("node", "gpu", "xid"),
    "gpus_lost": ("node", "gpu"),
    "ecc_errors": ("node", "gpu"),
    "nodes_missing_gpus": ("node",),
    "node_tainted_time": ("node",),
}


def report(url: str, out: Path) -> Path:
    status = main(
        [
            "report",
            f"--prometheus.url={url}",
            f"--since={int(SPEC.hours)}h",
            f"--until={SPEC.end}",
            "--step=60s",
            "--query.batch-nodes=3",
            f"--out={out}",
            "--log.format=text",
        ]
    )
    assert status == 0
    return out


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("engines")
    lines = io.BytesIO()
    write_victoria_import(SPEC, lines, chunk_nodes=SPEC.nodes)
    with (
        history_store(
            "prometheus",
            root,
            openmetrics=lambda path: write_openmetrics(SPEC, path),
            victoria=list,
        ) as prom,
        history_store(
            "victoriametrics",
            root,
            openmetrics=lambda path: None,
            victoria=lambda: (json.loads(line) for line in lines.getvalue().splitlines()),
        ) as vm,
    ):
        yield report(prom.url, root / "prom-out"), report(vm.url, root / "vm-out")


def table(out: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(out / "tables" / f"{name}.csv", dtype=str, keep_default_na=False)


@pytest.mark.parametrize("name", sorted(KEYED))
def test_same_findings_from_both_engines(outputs: tuple[Path, Path], name: str) -> None:
    prom, vm = (table(out, name)[list(KEYED[name])] for out in outputs)
    pd.testing.assert_frame_equal(prom, vm)


def test_same_tables_and_nothing_missing(outputs: tuple[Path, Path]) -> None:
    prom, vm = outputs
    assert sorted(p.name for p in (prom / "tables").iterdir()) == sorted(
        p.name for p in (vm / "tables").iterdir()
    )
    for out in outputs:
        assert "Incomplete data" not in (out / "summary.md").read_text()
