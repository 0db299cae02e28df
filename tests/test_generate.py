"""The one generate step (`./dev.sh generate`, generate.py): the committed rules, runbook
index, dashboards and chart parts are what it writes, and `--check` finds drift without
writing."""

from __future__ import annotations

from pathlib import Path

import pytest

import generate
from dashboards.write_dashboards import DASHBOARDS_DIR


def test_committed_files_are_what_the_generate_step_writes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert generate.main(["--check"]) == 0, capsys.readouterr().err


def test_the_step_covers_rules_dashboards_and_chart() -> None:
    files = generate.rendered_files(generate.checkout_config())
    names = {str(path.relative_to(generate.ROOT)) for path in files}
    assert {
        "rules/fleetwatch.rules.yaml",
        "rules/fleetwatch.recording.yaml",
        "rules/fleetwatch.global.yaml",
        "rules/fleetwatch.remediation.yaml",
        "docs/runbooks.md",
        "helm/fleetwatch/dashboards/fleet-overview.json",
        "helm/fleetwatch/templates/prometheusrule.yaml",
        "helm/fleetwatch/values.yaml",
        "helm/fleetwatch/values.schema.json",
    } <= names
    assert not list((generate.ROOT / "dashboards").glob("*.json")), "dashboards are committed once"


def test_check_reports_drift_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        (generate.ROOT / "rules" / "config.yaml")
        .read_text()
        .replace("gpu_temperature_celsius: 78", "gpu_temperature_celsius: 80")
    )
    paths = list(generate.rendered_files(generate.checkout_config()))
    before = {path: path.read_bytes() for path in paths}
    assert generate.main(["--check", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    for name in ("fleetwatch.rules.yaml", "node-detail.json", "values.yaml"):
        assert f"{name} is out of date: run ./dev.sh generate" in err
    assert {path: path.read_bytes() for path in paths} == before


def test_a_dashboard_no_generator_writes_is_reported() -> None:
    files = generate.rendered_files(generate.checkout_config())
    dropped = DASHBOARDS_DIR / "fabric.json"
    assert generate.orphans(files) == []
    assert generate.orphans({p: t for p, t in files.items() if p != dropped}) == [dropped]


def test_a_bad_config_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("selectors: {}\n")
    assert generate.main(["--check", "--config", str(config)]) == 2
    assert str(config) in capsys.readouterr().err
