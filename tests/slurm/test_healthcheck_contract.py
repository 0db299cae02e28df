"""One policy on Slurm: a tainting alert added to the rules drains a node through
`fleetwatch slurm healthcheck` with no edit to slurm/.

The test adds an alert of its own to the rule groups (an expression, a taint reason in
config.yaml, and beside its Remediation a local check reading a threshold of config.yaml),
generates the remediation contract as `./dev.sh generate` does, and runs the health check
as slurmd does, with `--healthcheck.contract` and `--healthcheck.rules-config` naming what
was generated. Stand-ins, no real servers: `testbed.fake_scontrol`'s scontrol takes the drain,
and an aiohttp app served from a thread (`testbed.servers.served_in_thread`) answers both
Prometheus' `/api/v1/query` (the ALERTS series Prometheus would hold for the rule) and the
exporter's `/metrics`.
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

from fleetwatch.catalog.gpu import GPU_POWER_WATTS
from fleetwatch.rules import groups
from fleetwatch.rules.config import Config, Params, load_config, shipped_text
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
from testbed.servers import served_in_thread

NODE = "gpu01"
NEW_ALERT = "GPUPowerAboveTestLimit"
NEW_REASON = "gpu-power-test"
THRESHOLD = "test_power_watts"
DRAIN = f"fleetwatch:{NEW_REASON} {NEW_ALERT}"
GPU_LABELS = {"gpu": "3", "uuid": "GPU-d"}


def new_alerts(config: Config, p: Params) -> list[Alert]:
    """The alert a contributor adds: expression, threshold, taint reason and local check
    read together."""
    q = Promql(config)
    return [
        Alert(
            name=NEW_ALERT,
            expr=f"{q.exporter(GPU_POWER_WATTS.name)} > {p(THRESHOLD)}",
            summary="GPU above the test's power limit on node {{ $labels.node }}",
            description=f"{GPU} draws more than {p(THRESHOLD)} W.",
            remediation=Remediation(
                reason=NEW_REASON,
                manual="a test's reason: a person lifts it",
                local=(
                    LocalCheck(
                        family=GPU_POWER_WATTS.name,
                        op=">",
                        limit=Threshold(name=THRESHOLD),
                        subject=GPU_SUBJECT,
                    ),
                ),
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
    """config.yaml with the new alert's policy and threshold, and the contract the rules
    generator writes once the alert is in a rule group."""
    text = shipped_text("config.yaml")
    for key, line in (
        ("thresholds", f"  {THRESHOLD}: 500"),
        ("alerts", f"  {NEW_ALERT}: {{severity: critical, for: 0s, taint: {NEW_REASON}}}"),
        ("rule_groups", "  fleetwatch-test: node"),
    ):
        assert f"\n{key}:\n" in text
        text = text.replace(f"\n{key}:\n", f"\n{key}:\n{line}\n", 1)
    config_path = tmp_path / "config.yaml"
    config_path.write_text(text)
    monkeypatch.setattr(
        groups, "ALERT_GROUPS", (*groups.ALERT_GROUPS, ("fleetwatch-test", (new_alerts,)))
    )
    config = load_config(config_path)
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

    watts: float = 300.0
    prometheus_up: bool = True
    firing: list[dict[str, str]] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)


def stand_in_app(state: StandIn) -> web.Application:
    """The exporter's `/metrics` and Prometheus' `/api/v1/query`, from `state`."""

    async def metrics(request: web.Request) -> web.Response:
        labels = ",".join(f'{k}="{v}"' for k, v in GPU_LABELS.items())
        return web.Response(text=f"{GPU_POWER_WATTS}{{{labels}}} {state.watts}\n")

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
            f"--healthcheck.rules-config={rules.config}",
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
    state.watts = 700.0
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
    state.watts, state.prometheus_up = 700.0, False
    fake = FakeSlurm(tmp_path / "slurm")
    done = healthcheck(fake, rules, url, f"--prometheus.url={url}")
    assert done.returncode == 0, done.stderr
    assert f"{url}: " in done.stderr
    assert "judging one scrape of the exporter" in done.stderr
    assert (
        f"{NEW_ALERT}: GPU 3 (GPU-d): fleetwatch_gpu_power_watts 700 > 500 (thresholds.{THRESHOLD})"
    ) in done.stdout
    assert fake.node(NODE)["reason"] == DRAIN


def test_the_threshold_of_the_config_moves_the_local_check(rules: Rules) -> None:
    """The check reads the threshold by name from the config it runs with: raised above the
    GPU's power, the same scrape is healthy."""
    scraped = parse_exposition(f'{GPU_POWER_WATTS}{{gpu="3",uuid="GPU-d"}} 700\n')
    contract = load_contract(rules.contract)
    assert [
        f.drain_reason for f in from_scrape(scraped, contract, load_config(rules.config)).findings
    ] == [DRAIN]
    rules.config.write_text(
        rules.config.read_text().replace(f"  {THRESHOLD}: 500\n", f"  {THRESHOLD}: 800\n")
    )
    assert from_scrape(scraped, contract, load_config(rules.config)).findings == []
