"""rules/alertmanager.yml routes every shipped alert as the design says, by Alertmanager's own
routing (`amtool config routes test`): what the tainter acts on goes to the tainter and never
to the pager; what the automation cannot handle pages."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from fleetwatch.sim.loopback_servers import require_binary
from tests.rules.promql import RULES_DIR

AMTOOL = "/usr/bin/amtool"
CONFIG = RULES_DIR / "alertmanager.yml"
TAINTER, AUTOMATED = "fleetwatch-tainter", "fleetwatch-automated"
PAGER, DEFAULT = "pager", "default"
PAGES = {
    "FleetwatchExporterAbsent",
    "FleetwatchExporterDown",
    "FleetwatchTaintBreakerOpen",
    "FleetwatchTaintRefused",
    "FleetwatchTainterDown",
    "GPUOverheatingFleetWide",
    "NVLinkDomainDegraded",
}
"""Alerts that must page: the automation cannot act (or cannot see), or many nodes at once."""


def receivers(labels: dict[str, str]) -> set[str]:
    """The receivers Alertmanager's routing tree picks for an alert with `labels`."""
    result = subprocess.run(
        [
            require_binary(AMTOOL),
            "config",
            "routes",
            "test",
            f"--config.file={CONFIG}",
            *(f"{name}={value}" for name, value in labels.items()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return set(result.stdout.strip().split(","))


def shipped_alerts() -> list[dict[str, Any]]:
    groups = [
        group
        for name in ("fleetwatch.rules.yaml", "fleetwatch.global.yaml")
        for group in yaml.safe_load((RULES_DIR / name).read_text())["groups"]
    ]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def alert_labels(name: str) -> dict[str, str]:
    (rule,) = [r for r in shipped_alerts() if r["alert"] == name]
    return {"alertname": name, "node": "node-1", **rule["labels"]}


def test_an_overheating_gpu_reaches_the_tainter_and_not_the_pager() -> None:
    labels = alert_labels("GPUOverheating")
    assert labels["fleetwatch_taint"] == "gpu-overheat"
    assert receivers(labels) == {TAINTER, AUTOMATED}


def test_an_open_breaker_pages() -> None:
    assert receivers(alert_labels("FleetwatchTaintBreakerOpen")) == {PAGER}


@pytest.mark.parametrize("alert", [rule["alert"] for rule in shipped_alerts()])
def test_every_shipped_alert_pages_only_when_the_automation_cannot_act(alert: str) -> None:
    labels = alert_labels(alert)
    got = receivers(labels)
    if "fleetwatch_taint" in labels:
        assert got == {TAINTER, AUTOMATED}
    elif labels["severity"] == "critical":
        assert got == {PAGER}
    else:
        assert got == {DEFAULT}
    assert (PAGER in got) == (alert in PAGES)
