"""fleetwatch's Grafana dashboards (grafanalib) as the JSON text the Helm chart ships.

Thresholds (the 78 °C line, the HBM limit) and the exporter's job selector come from
rules/config.yaml through the rules package, so a dashboard never disagrees with the alerts.
`rendered_files(config)` returns each dashboard's path and text; the one generate step
(`./dev.sh generate`, generate.py at the root) writes them, and `panel_queries(data)` lists a
dashboard's queries for the tests.

The JSON lives once, in helm/fleetwatch/dashboards/: the chart reads it with `.Files.Glob`,
which sees only files inside the chart. Dashboards (stable UIDs, variables datasource / node /
gpu, or namespace / training_job), one module each:
- fleet_overview.py  fleetwatch-fleet: tensor activity vs utilization, heat, taints, Xids, hot
                     spots, training jobs (each linking to the Training job dashboard)
- training_job.py    fleetwatch-training-job: which GPU the job waits for, idle GPUs, heat,
                     fabric errors and taints on the job's nodes
- node_detail.py     fleetwatch-node: temperatures, clocks, power, NVLink matrix, InfiniBand ports
- fabric.py          fleetwatch-fabric: InfiniBand error rates, flaps, degraded links,
                     saturation, NVLink
- stack_health.py    fleetwatch-stack: collectors, scrapes, tainter actions and breaker
panels.py holds the layout and panel builders they share, queries.py the PromQL they take
from the rules.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from grafanalib.core import Dashboard

from dashboards import fabric, fleet_overview, node_detail, stack_health, training_job
from dashboards.panel_promql import Queries
from fleetwatch.rules.config import Config

ROOT: Final = Path(__file__).resolve().parents[1]
DASHBOARDS_DIR: Final = ROOT / "helm" / "fleetwatch" / "dashboards"
BOARDS: Final[dict[str, Callable[[Queries], Dashboard]]] = {
    "fleet-overview": fleet_overview.build,
    "training-job": training_job.build,
    "node-detail": node_detail.build,
    "fabric": fabric.build,
    "stack-health": stack_health.build,
}
"""Every dashboard by file stem."""


def dashboards(config: Config) -> dict[str, Dashboard]:
    """Every dashboard by file stem, built from a validated rules config."""
    q = Queries(config)
    return {stem: build(q) for stem, build in BOARDS.items()}


def _json_data(obj: Any) -> Any:
    """json.dumps' fallback: grafanalib objects serialise through their public to_json_data."""
    to_json_data = getattr(obj, "to_json_data", None)
    if to_json_data is None:
        raise TypeError(f"{type(obj).__name__} is not a grafanalib object")
    return to_json_data()


def to_json(board: Dashboard) -> str:
    """A dashboard as the committed JSON text: sorted keys, two-space indent, final newline."""
    return json.dumps(board.to_json_data(), default=_json_data, indent=2, sort_keys=True) + "\n"


def rendered_files(config: Config) -> dict[Path, str]:
    """Each dashboard's JSON file in the chart and its text."""
    return {
        DASHBOARDS_DIR / f"{stem}.json": to_json(board)
        for stem, board in dashboards(config).items()
    }


def _walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _walk_panels(panel.get("panels", []))


def panel_queries(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of a dashboard's JSON."""
    return [
        (panel["title"], target["expr"])
        for panel in _walk_panels(data.get("panels", []))
        for target in panel.get("targets", [])
        if target.get("expr")
    ]
