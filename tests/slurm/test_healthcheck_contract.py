"""One policy on Slurm: a tainting alert added to the rules drains a node through
`fleetwatch slurm healthcheck` with no edit to slurm/.

The test adds an alert of its own to the rule groups (an expression, and beside its
Remediation a local check reading a threshold of config.yaml), gives it a taint reason in an
override file (docs/configuration.md), generates the remediation contract as the rules
writer does, and runs the health check as slurmd does, with `--rules.config-file` and
`--healthcheck.contract` naming them. Stand-ins, no real servers: `testbed.fake_scontrol`'s
scontrol takes the drain, and an aiohttp app served from a thread
(`testbed.tool_servers.served_in_thread`) answers both Prometheus' `/api/v1/query` (the
ALERTS series Prometheus would hold for the rule) and the exporter's `/metrics`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from fleetwatch.catalog.gpu import GPU_TEMPERATURE_CELSIUS
from fleetwatch.rules import groups
from fleetwatch.rules.config import Config, Params, load_config
from fleetwatch.rules.contract import (
    GPU_SUBJECT,
    TAINT_LABEL,
    LocalCheck,
    Threshold,
    load_contract,
)
from fleetwatch.rules.promql import GPU, Alert, Promql, Remediation
from fleetwatch.slurm.findings import from_scrape, parse_exposition
from fleetwatch.slurm.healthcheck import firing_alerts_query
from testbed.fake_scontrol import FakeSlurm
from testbed.tool_servers import served_in_thread

NODE = "gpu01"
NEW_ALERT = "GPUMemoryAboveTestLimit"
NEW_REASON = "gpu-memory-test"
THRESHOLD = "memory_temperature_celsius"  # shipped: 85
DRAIN = f"fleetwatch:{NEW_REASON} {NEW_ALERT}"
GPU_LABELS = {"gpu": "3", "uuid": "GPU-d"}
MEMORY = {"sensor": "memory"}
MEMORY_MATCHER = 'sensor="memory"'


def new_alerts(config: Config, p: Params) -> list[Alert]:
    """The alert a contributor adds: expression, threshold, taint reason and local check
    read together."""
    q = Promql(config)
    return [
        Alert(
            name=NEW_ALERT,
            expr=f"{q.exporter(GPU_TEMPERATURE_CELSIUS.name, MEMORY_MATCHER)} > {p(THRESHOLD)}",
            summary="GPU memory above the test's limit on node {{ $labels.node }}",
            description=f"The HBM of {GPU} is above {p(THRESHOLD)} °C.",
            remediation=Remediation(
                reason=NEW_REASON,
                manual="a test's reason: a person lifts it",
                local=(
                    LocalCheck(
                        family=GPU_TEMPERATURE_CELSIUS.name,
                        op=">",
                        limit=Threshold(name=THRESHOLD),
                        labels=MEMORY,
                        subject=GPU_SUBJECT,
                    ),
                ),
                repair="none",
            ),
        )
    ]


@dataclass(frozen=True)
class Rules:
    """The config and contract generated with the new alert."""

    config: Path
    contract: Path


@pytest.fixture
def rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Rules:
    """An override file giving the new alert its policy and taint (and its rule group a
    scope), and the contract the rules writer generates once the alert is in a rule group."""
    config_path = tmp_path / "override.yaml"
    config_path.write_text(
        f"alerts:\n  {NEW_ALERT}: {{severity: critical, for: 0s, taint: {NEW_REASON}}}\n"
        "rule_groups:\n  fleetwatch-test: node\n"
    )
    monkeypatch.setattr(
        groups, "ALERT_GROUPS", (*groups.ALERT_GROUPS, ("fleetwatch-test", (new_alerts,)))
    )
    config = load_config(override=config_path)
    # The rule Prometheus evaluates carries the taint label its ALERTS series carry.
    (rule,) = [
        rule
        for group in groups.alert_groups(config)
        for rule in group["rules"]
        if rule["alert"] == NEW_ALERT
    ]
    assert rule["labels"][TAINT_LABEL] == NEW_REASON
    contract_path = tmp_path / "fleetwatch.remediation.yaml"
    contract_path.write_text(groups.dump_contract(groups.remediation_contract(config)))
    assert NEW_ALERT in load_contract(contract_path).local
    return Rules(config=config_path, contract=contract_path)


@dataclass
class StandIn:
    """What the in-thread server answers, and the queries it was asked."""

    celsius: float = 70.0
    prometheus_up: bool = True
    firing: list[dict[str, str]] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)


def stand_in_app(state: StandIn) -> web.Application:
    """The exporter's `/metrics` and Prometheus' `/api/v1/query`, from `state`."""

    async def metrics(request: web.Request) -> web.Response:
        labels = ",".join(f'{k}="{v}"' for k, v in (GPU_LABELS | MEMORY).items())
        return web.Response(text=f"{GPU_TEMPERATURE_CELSIUS}{{{labels}}} {state.celsius}\n")

    async def query(request: web.Request) -> web.Response:
        state.queries.append(request.query["query"])
        if not state.prometheus_up:
            return web.Response(status=503, text="Service Unavailable")
        body: dict[str, Any] = {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [{"metric": m, "value": [0, "1"]} for m in state.firing],
            },
        }
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/v1/query", query)
    return app


@pytest.fixture
def stand_in() -> Iterator[tuple[StandIn, str]]:
    state = StandIn()
    with served_in_thread(stand_in_app(state)) as url:
        yield state, url


def healthcheck(
    fake: FakeSlurm, rules: Rules, url: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """The health check as slurmd runs it on NODE, scontrol being the fake's."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetwatch",
            "slurm",
            "healthcheck",
            f"--exporter.url={url}",
            f"--rules.config-file={rules.config}",
            f"--healthcheck.contract={rules.contract}",
            *args,
        ],
        env={
            **os.environ,
            "PATH": f"{fake.directory}{os.pathsep}{os.environ['PATH']}",
            "SLURMD_NODENAME": NODE,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


FIRING = {
    "__name__": "ALERTS",
    "alertname": NEW_ALERT,
    "alertstate": "firing",
    TAINT_LABEL: NEW_REASON,
    "severity": "critical",
    "job": "fleetwatch",
    "node": NODE,
    **GPU_LABELS,
}


def test_a_new_alert_firing_in_prometheus_drains(
    rules: Rules, stand_in: tuple[StandIn, str], tmp_path: Path
) -> None:
    """Prometheus answers: its firing alert is the judgement (the scrape, healthy here, is
    not read)."""
    state, url = stand_in
    state.firing = [FIRING]
    fake = FakeSlurm(tmp_path / "slurm")
    done = healthcheck(fake, rules, url, f"--prometheus.url={url}")
    assert done.returncode == 0, done.stderr
    assert state.queries == [firing_alerts_query(NODE)]
    assert f"read from the firing alerts in {url}" in done.stdout
    assert fake.node(NODE)["reason"] == DRAIN
    assert "DRAIN" not in fake.node("gpu02")["state"]


def test_prometheus_answering_no_alert_is_healthy_whatever_one_scrape_shows(
    rules: Rules, stand_in: tuple[StandIn, str], tmp_path: Path
) -> None:
    state, url = stand_in
    state.celsius = 95.0
    fake = FakeSlurm(tmp_path / "slurm")
    done = healthcheck(fake, rules, url, f"--prometheus.url={url}")
    assert done.returncode == 0, done.stderr
    assert f"node {NODE} healthy (the firing alerts in {url})" in done.stdout
    assert fake.updates() == []


def test_without_prometheus_the_new_alerts_local_check_drains(
    rules: Rules, stand_in: tuple[StandIn, str], tmp_path: Path
) -> None:
    """Prometheus does not answer (503): one scrape, judged by the alert's local check with
    the threshold of the config the check runs with."""
    state, url = stand_in
    state.celsius, state.prometheus_up = 95.0, False
    fake = FakeSlurm(tmp_path / "slurm")
    done = healthcheck(fake, rules, url, f"--prometheus.url={url}")
    assert done.returncode == 0, done.stderr
    assert f"{url}: " in done.stderr
    assert "judging one scrape of the exporter" in done.stderr
    assert (
        f"{NEW_ALERT}: GPU 3 (GPU-d): {GPU_TEMPERATURE_CELSIUS} 95 > 85 (thresholds.{THRESHOLD})"
    ) in done.stdout
    assert fake.node(NODE)["reason"] == DRAIN


def test_the_threshold_of_the_config_moves_the_local_check(rules: Rules) -> None:
    """The check reads the threshold by name from the config it runs with: raised above the
    GPU's memory temperature by the override, the same scrape is healthy."""
    scraped = parse_exposition(
        f'{GPU_TEMPERATURE_CELSIUS}{{gpu="3",uuid="GPU-d",sensor="memory"}} 95\n'
    )
    contract = load_contract(rules.contract)
    assert [
        f.drain_reason
        for f in from_scrape(scraped, contract, load_config(override=rules.config)).findings
    ] == [DRAIN]
    rules.config.write_text(rules.config.read_text() + f"thresholds:\n  {THRESHOLD}: 100\n")
    assert from_scrape(scraped, contract, load_config(override=rules.config)).findings == []
