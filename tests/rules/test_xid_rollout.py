"""Rolling out the kernel-log Xid source alerts on new Xids only, end to end.

A real `fleetwatch export --simulate=dgx-h100 --collector.xid.source=kmsg` reads a kernel
log (a file in /dev/kmsg's record format) that already holds an hour-old critical Xid, as
every node with an Xid since its last boot does when the source is enabled fleet-wide. A
real Prometheus scrapes it with the shipped rules at the shipped intervals. The old Xid must
fire nothing over several rule evaluations (it would taint the node `xid-critical`); an
Xid logged after the exporter started must fire GPUXidCritical for that GPU and Xid.

Every `for` is set to 0s: the strictest reading, where one evaluation that matched would
show as a pending or firing alert.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.collectors.sources.kmsg import normalize_pci
from fleetwatch.durations import parse_duration
from fleetwatch.rules.config import load_config
from fleetwatch.rules.groups import alert_groups, dump_groups
from fleetwatch.sim.fake_nvml import simulated_pci_bus_id
from fleetwatch.sim.servers import (
    Server,
    fleetwatch_export,
    http_get,
    prom_alerts,
    prometheus,
    wait_until,
)
from testbed.servers import prom_query
from tests.gpu.kmsglines import an_hour_ago, record

pytestmark = pytest.mark.integration

NODE = "rollout-node"
ALERT = "GPUXidCritical"
GPU = 2
CRITICAL_XID = 48  # double-bit ECC error: NVIDIA asks for a GPU reset
EVALUATIONS = 3


@dataclass
class Rollout:
    prom: Server
    exporter: Server
    kmsg: Path
    evaluation_seconds: float


def _no_wait(name: str, default: str) -> str:
    """Every alert fires on its first matching evaluation; thresholds stay as shipped."""
    return "0s" if name.endswith(".for") else default


def xid_message(xid: int) -> str:
    return f"NVRM: Xid (PCI:{normalize_pci(simulated_pci_bus_id(GPU))}): {xid}, pid=4242, DBE"


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rollout]:
    workdir = tmp_path_factory.mktemp("xid-rollout")
    config = load_config()
    alerts = workdir / "alerts.yaml"
    alerts.write_text(dump_groups(alert_groups(config, _no_wait)))
    recording = workdir / "recording.yaml"
    recording.write_text(
        files("fleetwatch.rules").joinpath("fleetwatch.recording.yaml").read_text()
    )
    kmsg = workdir / "kmsg"
    kmsg.write_text(record(1, an_hour_ago(), xid_message(CRITICAL_XID)))
    args = [
        "--collector.interval=1s",
        "--collector.xid.source=kmsg",
        f"--collector.xid.kmsg-path={kmsg}",
    ]
    with fleetwatch_export(workdir / "exporter", simulate="dgx-h100", args=args) as exporter:
        scrape = {
            "job_name": "fleetwatch",
            "static_configs": [
                {"targets": [exporter.url.removeprefix("http://")], "labels": {"node": NODE}}
            ],
        }
        with prometheus(
            workdir / "prometheus",
            scrape_configs=[scrape],
            rule_files=[alerts, recording],
            scrape_interval=config.scrape_interval,
            evaluation_interval=config.evaluation_interval,
        ) as prom:
            yield Rollout(
                prom=prom,
                exporter=exporter,
                kmsg=kmsg,
                evaluation_seconds=parse_duration(config.evaluation_interval),
            )


def _last_evaluation(prom: Server) -> str | None:
    """When Prometheus last evaluated the alert, as it says it; None before the first."""
    body = json.loads(http_get(f"{prom.url}/api/v1/rules?type=alert"))
    for group in body["data"]["groups"]:
        for rule in group["rules"]:
            if rule["name"] == ALERT and not rule["lastEvaluation"].startswith("0001-"):
                return str(rule["lastEvaluation"])
    return None


def _alerts(prom: Server) -> list[dict[str, Any]]:
    return [a for a in prom_alerts(prom) if a["labels"]["alertname"] == ALERT]


def test_kernel_log_rollout_alerts_on_new_xids_only(rollout: Rollout) -> None:
    prom = rollout.prom
    # The old record read and scraped, whichever family the exporter put it in.
    read = '{__name__=~"fleetwatch_gpu_xid_history_errors|fleetwatch_gpu_xid_errors_total"}'
    wait_until(lambda: prom_query(prom, read) or None, timeout=60, what="the old Xid scraped")

    # Old news: several evaluations after the history was scraped, nothing pending or firing.
    before = _last_evaluation(prom)
    evaluations: set[str] = set()
    seen: list[dict[str, Any]] = []

    def evaluated_enough() -> bool:
        seen.extend(_alerts(prom))
        last = _last_evaluation(prom)
        if last is not None and last != before:
            evaluations.add(last)
        return len(evaluations) >= EVALUATIONS

    wait_until(
        evaluated_enough,
        timeout=(EVALUATIONS + 2) * rollout.evaluation_seconds + 30,
        what=f"{EVALUATIONS} evaluations of {ALERT} after the history was scraped",
        interval=0.2,
    )
    assert [a["labels"] for a in seen] == []
    # ALERTS holds a sample for every evaluation that found the alert pending or firing,
    # including any the polling above fell between.
    assert prom_query(prom, f'ALERTS{{alertname="{ALERT}"}}[5m]') == []
    assert prom_query(prom, "fleetwatch_gpu_xid_errors_total") == []
    history = prom_query(prom, "fleetwatch_gpu_xid_history_errors")
    assert [(s["metric"]["gpu"], s["metric"]["xid"]) for s in history] == [
        (str(GPU), str(CRITICAL_XID))
    ]
    uuid = history[0]["metric"]["uuid"]

    # News: the same Xid logged after the exporter started fires for that GPU and Xid.
    with rollout.kmsg.open("a") as kmsg:
        kmsg.write(record(2, time.monotonic(), xid_message(CRITICAL_XID)))
    firing = wait_until(
        lambda: [a for a in _alerts(prom) if a["state"] == "firing"] or None,
        timeout=4 * rollout.evaluation_seconds + 30,
        what=f"{ALERT} firing for the new Xid",
        interval=0.2,
    )
    assert [a["labels"] for a in firing] == [
        {
            "alertname": ALERT,
            "severity": "critical",
            "fleetwatch_taint": "xid-critical",
            "job": "fleetwatch",
            "instance": rollout.exporter.url.removeprefix("http://"),
            "node": NODE,
            "gpu": str(GPU),
            "uuid": uuid,
            "xid": str(CRITICAL_XID),
        }
    ]
