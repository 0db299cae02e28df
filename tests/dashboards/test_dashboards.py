"""The generated dashboards: stable UIDs and variables, thresholds from rules/config.yaml,
and every query parses and reads only catalogued or recorded metrics (their drift:
tests/test_generate.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.rules.config import CONFIG_FILE, load_config
from tests.rules.promql import (
    ROOT,
    catalog_names,
    check_exprs_parse,
    dashboards_generator,
    metric_names,
    recorded_names,
)

gen = dashboards_generator()
DASHBOARDS_DIR = gen.DASHBOARDS_DIR
EXPECTED = {
    "fleet-overview": "fleetwatch-fleet",
    "training-job": "fleetwatch-training-job",
    "node-detail": "fleetwatch-node",
    "fabric": "fleetwatch-fabric",
    "stack-health": "fleetwatch-stack",
}


def committed() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS_DIR.glob("*.json"))}


GRAFANA_MACROS = (("$__rate_interval", "1m"), ("$__range_s", "3600"), ("$__range", "1h"))
"""Grafana's macros as a dashboard of the last hour fills them in."""


def all_queries() -> dict[str, str]:
    """'dashboard / panel #n' -> expr, with Grafana's interval and range macros made
    concrete (`$__range_s` before `$__range`, whose name it starts with)."""
    out: dict[str, str] = {}
    for stem, data in committed().items():
        for i, (title, expr) in enumerate(gen.panel_queries(data)):
            out[f"{stem} / {title} #{i}"] = concrete(expr)
    return out


def concrete(expr: str) -> str:
    """`expr` with Grafana's macros filled in."""
    for macro, value in GRAFANA_MACROS:
        expr = expr.replace(macro, value)
    return expr


def test_stable_uids_and_variables() -> None:
    boards = committed()
    assert {stem: data["uid"] for stem, data in boards.items()} == EXPECTED
    for stem, data in boards.items():
        names = [v["name"] for v in data["templating"]["list"]]
        first = ["datasource", "namespace"] if stem == "training-job" else ["datasource", "node"]
        assert names[:2] == first, stem
        for panel in data["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"] == "${datasource}", (stem, panel["title"])
    assert [v["name"] for v in boards["node-detail"]["templating"]["list"]] == [
        "datasource",
        "node",
        "gpu",
    ]
    assert [v["name"] for v in boards["training-job"]["templating"]["list"]] == [
        "datasource",
        "namespace",
        "training_job",
    ]


@pytest.mark.parametrize(
    ("stem", "title"),
    [("node-detail", "GPU temperature"), ("training-job", "GPU temperature against the limit")],
)
def test_temperature_threshold_comes_from_rules_config(
    tmp_path: Path, stem: str, title: str
) -> None:
    text = (
        (ROOT / CONFIG_FILE)
        .read_text()
        .replace("gpu_temperature_celsius: 78", "gpu_temperature_celsius: 81")
    )
    config_path = tmp_path / "config.yaml"
    config_path.write_text(text)
    board = gen.rendered_files(load_config(config_path))[DASHBOARDS_DIR / f"{stem}.json"]
    panel = next(p for p in json.loads(board)["panels"] if p["title"] == title)
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == 81.0
    assert "78" not in json.dumps(panel)


def _panel(stem: str, title: str) -> dict[str, Any]:
    return next(p for p in committed()[stem]["panels"] if p["title"] == title)


def test_training_job_dashboard_reads_one_job_through_the_recording_rules() -> None:
    queries = [expr for _, expr in gen.panel_queries(committed()["training-job"])]
    selector = 'namespace="$namespace", training_job="$training_job"'
    assert all(selector in expr for expr in queries), "a panel ignores the job variables"
    heatmap = _panel("training-job", "Tensor activity per GPU")
    assert heatmap["type"] == "heatmap"
    assert heatmap["targets"][0]["expr"].startswith("fleetwatch:gpu_job_tensor_active:ratio{")
    ranking = _panel("training-job", "GPUs ranked by tensor activity (straggler marked)")
    exprs = [target["expr"] for target in ranking["targets"]]
    assert any('alertname="GPUStraggler"' in expr for expr in exprs)
    assert {"id": "sortBy", "options": {"sort": [{"field": "tensor activity", "desc": True}]}} in (
        ranking["transformations"]
    )
    fabric = _panel("training-job", "NVLink and InfiniBand errors on the job's nodes")
    assert "node_fabric:fleetwatch_errors:rate1m" in fabric["targets"][0]["expr"]


def test_fleet_overview_links_to_the_training_job_dashboard() -> None:
    fleet = committed()["fleet-overview"]
    assert [link["url"] for link in fleet["links"]] == ["/d/fleetwatch-training-job"]
    jobs = _panel("fleet-overview", "Training jobs by median tensor activity")
    links = [
        link["url"]
        for override in jobs["fieldConfig"]["overrides"]
        for prop in override["properties"]
        for link in prop["value"]
    ]
    assert links == [
        "/d/fleetwatch-training-job?var-namespace=${__data.fields.namespace}"
        "&var-training_job=${__data.fields.training_job}&${__url_time_range}"
    ]


@pytest.mark.integration  # runs promtool
def test_every_query_parses(tmp_path: Path) -> None:
    queries = all_queries()
    assert len(queries) >= 30
    assert check_exprs_parse(queries, tmp_path) == ""


def test_every_metric_a_dashboard_reads_is_catalogued_or_recorded() -> None:
    known = catalog_names() | recorded_names()
    used: dict[str, set[str]] = {}
    for where, expr in all_queries().items():
        for name in metric_names(expr):
            used.setdefault(name, set()).add(where)
    assert "node:fleetwatch_gpu_tensor_active_ratio:avg" in used
    missing = {name: sorted(where) for name, where in used.items() if name not in known}
    assert missing == {}, "metrics not in docs/metrics.md nor recorded"
