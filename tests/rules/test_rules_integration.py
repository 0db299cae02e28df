"""The generated rules and dashboards against a real Prometheus scraping a simulated node.

One Prometheus (shipped scrape and evaluation intervals) loads the generated rules and
scrapes `fleetwatch export --simulate` running a scenario with a hot GPU, NVLink faults and
InfiniBand faults. The tests check that exactly the expected alerts fire, with the right
labels and annotations, that every dashboard query returns data, and they print the
seconds from the first exported sample above the threshold to GPUOverheating firing.

`for` durations longer than 10s are shortened to 10s here (through the generator's
substitution API) so the module runs in about a minute; GPUOverheating keeps its shipped
`for`, since its latency is the figure this test measures.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from dashboards.write_dashboards import DASHBOARDS_DIR
from fleetwatch.rules.config import load_config
from fleetwatch.rules.groups import alert_groups, dump_groups, recording_groups
from fleetwatch.sim.loopback_servers import (
    Server,
    fleetwatch_export,
    http_get,
    prom_alerts,
    prometheus,
    wait_until,
)
from testbed.tool_servers import prom_query
from tests.rules.live import NEEDS_CHECKPOINT_MOUNT, NEEDS_NVL72_DOMAIN, cap_for
from tests.rules.promql import dashboards_generator

pytestmark = pytest.mark.integration

NODE = "sim-node-1"
FAULT_AT = 12
SCENARIO = {
    "gpus": 8,
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "nvlinks_per_gpu": 18,
    "infiniband": [
        {"device": "mlx5_0", "ports": 1, "rate_gbps": 400, "expected_rate_gbps": 400},
        # RoCE: MAD tools do not reach it, so its PMA counters stay pinned when saturated.
        {"device": "mlx5_1", "ports": 1, "rate_gbps": 400, "link_layer": "Ethernet"},
        {"device": "mlx5_2", "ports": 1, "rate_gbps": 400},
        {"device": "mlx5_3", "ports": 1, "rate_gbps": 400},
    ],
    "baseline": {"temperature_celsius": 62, "memory_temperature_celsius": 70},
    "faults": [
        {"at": FAULT_AT, "kind": "temperature", "gpu": 3, "celsius": 84},
        {
            "at": FAULT_AT,
            "kind": "nvlink_errors",
            "gpu": 5,
            "link": 2,
            "error": "crc_flit",
            "per_second": 10,
        },
        {"at": FAULT_AT, "kind": "nvlink_down", "gpu": 6, "link": 4},
        {"at": FAULT_AT, "kind": "ib_port_down", "device": "mlx5_3", "port": 1},
        {
            "at": FAULT_AT,
            "kind": "ib_errors",
            "device": "mlx5_2",
            "port": 1,
            "error": "symbol",
            "per_second": 50,
        },
        # A 4-bit counter: saturates within seconds.
        {
            "at": FAULT_AT,
            "kind": "ib_errors",
            "device": "mlx5_1",
            "port": 1,
            "error": "excessive_buffer_overrun",
            "per_second": 5,
        },
        # An application Xid: shows in the Xid panel, is not critical.
        {"at": FAULT_AT, "kind": "xid", "gpu": 1, "xid": 13},
    ],
}
# Panels that read the taint controller's own metrics: it is not part of this test (its
# queries are still parsed and checked against the catalog in tests/dashboards).
NEEDS_TAINTER = {"Taint operations", "Webhook requests", "Tainted nodes", "Circuit breaker open"}
# Panels of training jobs: this node runs none (test_training_jobs_integration.py runs one).
NEEDS_TRAINING_JOB = {"Training jobs by median tensor activity"}
NEEDS_INTERRUPTION = {
    "Interruptions per 1,000 node-days by kind (over the range)",
    "Training jobs by interruptions in the range",
}
"""Panels of interruptions (rules/tests/goodput.test.yaml tests their records): the stack
interrupts no training job."""
NEEDS_REPAIR = {
    "Repairs in flight",
    "Repairs",
    "Repairs that did not hold",
    "Time back in service (p50, p90)",
}
"""Panels of repairs after the drain: the stack's tainter runs with `--repair.mode=off` (the
default), so it repairs nothing; tests/slurm/test_repair_real.py repairs for real."""
NEEDS_XID_EVENT_FAILURE = {"Xid event calls failed (NVML)"}
"""Its counter exists once an NVML event call failed, which this stack's node never does
(tests/faults/nvml_error_drive.py and tests/gpu/test_xid.py make them fail)."""
SKIPPED_PANELS = (
    (NEEDS_TAINTER | NEEDS_TRAINING_JOB | NEEDS_CHECKPOINT_MOUNT | NEEDS_NVL72_DOMAIN)
    | NEEDS_INTERRUPTION
    | NEEDS_REPAIR
    | NEEDS_XID_EVENT_FAILURE
)
NUMBER = r"[0-9]+(?:\.[0-9]+)?"


@dataclass
class Stack:
    prom: Server
    exporter: Server
    seconds_to_fire: float


def _exported_temperature(exporter: Server, gpu: str) -> float | None:
    pattern = re.compile(
        r'^fleetwatch_gpu_temperature_celsius\{(?=[^}]*gpu="' + gpu + r'")(?=[^}]*sensor="gpu")'
        r"[^}]*\} (\S+)$",
        re.MULTILINE,
    )
    match = pattern.search(http_get(f"{exporter.url}/metrics").decode())
    return float(match.group(1)) if match else None


def _firing(prom: Server) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for alert in prom_alerts(prom):
        if alert["state"] == "firing":
            out.setdefault(alert["labels"]["alertname"], []).append(alert)
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("rules-integration")
    config = load_config()
    alerts_path = workdir / "alerts.yaml"
    alerts_path.write_text(dump_groups(alert_groups(config, cap_for)))
    recording_path = workdir / "recording.yaml"
    recording_path.write_text(dump_groups(recording_groups(config)))
    scenario = workdir / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    with fleetwatch_export(
        workdir / "exporter", simulate=str(scenario), args=["--collector.interval=1s"]
    ) as exporter:
        target = exporter.url.removeprefix("http://")
        scrape = {
            "job_name": "fleetwatch",
            "static_configs": [{"targets": [target], "labels": {"node": NODE}}],
        }
        with prometheus(
            workdir / "prometheus",
            scrape_configs=[scrape],
            rule_files=[alerts_path, recording_path],
            scrape_interval=config.scrape_interval,
            evaluation_interval=config.evaluation_interval,
        ) as prom:
            hot = wait_until(
                lambda: (t := _exported_temperature(exporter, "3")) is not None and t > 78,
                timeout=FAULT_AT + 30,
                what="GPU 3 above 78 °C at the exporter",
                interval=0.05,
            )
            first_hot = time.monotonic()
            assert hot
            wait_until(
                lambda: "GPUOverheating" in _firing(prom),
                timeout=60,
                what="GPUOverheating firing",
                interval=0.05,
            )
            seconds = time.monotonic() - first_hot
            print(
                f"\nfirst exported sample above 78 °C -> GPUOverheating firing: {seconds:.1f} s"
                f" (scrape {config.scrape_interval}, evaluation {config.evaluation_interval},"
                f" for {config.alerts['GPUOverheating'].for_})"
            )
            yield Stack(prom=prom, exporter=exporter, seconds_to_fire=seconds)


EXPECTED_ALERTS = {
    "GPUOverheating",
    "GPUMemoryOverheating",
    "NVLinkDown",
    "NVLinkErrorsRising",
    "InfiniBandPortDown",
    "InfiniBandErrorRateHigh",
    "InfiniBandErrorCountHigh",
    "InfiniBandCounterSaturated",
}
NO_TAINTER = {"FleetwatchTainterDown"}
"""This stack runs no tainter while GPUOverheating asks for a taint: that pages (pending or
firing, depending on how long the faults have been active)."""


@pytest.fixture(scope="module")
def firing(stack: Stack) -> dict[str, list[dict[str, Any]]]:
    """The firing alerts once every expected one fires (and one more evaluation after)."""
    seen: list[set[str]] = [set()]

    def all_expected_fire() -> bool:
        seen[0] = set(_firing(stack.prom))
        return seen[0] >= EXPECTED_ALERTS

    try:
        wait_until(all_expected_fire, timeout=90, what="every expected alert firing")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; missing {sorted(EXPECTED_ALERTS - seen[0])}") from exc
    evaluated = time.monotonic()
    wait_until(lambda: time.monotonic() - evaluated > 6, timeout=10, what="one more evaluation")
    return _firing(stack.prom)


def _gpu_uuid(prom: Server, gpu: str) -> str:
    series = prom_query(prom, f'fleetwatch_gpu_temperature_celsius{{gpu="{gpu}",sensor="gpu"}}')
    assert series, f"no temperature series for GPU {gpu}"
    uuid: str = series[0]["metric"]["uuid"]
    return uuid


def _one(firing: dict[str, list[dict[str, Any]]], name: str) -> dict[str, Any]:
    alerts = firing[name]
    assert len(alerts) == 1, f"{name}: expected one alert, got {[a['labels'] for a in alerts]}"
    return alerts[0]


def _runbook(name: str) -> str:
    return f"https://github.com/fleetwatch/fleetwatch/blob/main/rules/runbooks/{name}.md"


def test_gpu_overheating_fires_with_taint_labels_and_values(
    stack: Stack, firing: dict[str, list[dict[str, Any]]]
) -> None:
    uuid = _gpu_uuid(stack.prom, "3")
    alert = _one(firing, "GPUOverheating")
    instance = stack.exporter.url.removeprefix("http://")
    assert alert["labels"] == {
        "alertname": "GPUOverheating",
        "severity": "warning",
        "fleetwatch_taint": "gpu-overheat",
        "job": "fleetwatch",
        "instance": instance,
        "node": NODE,
        "gpu": "3",
        "uuid": uuid,
        "sensor": "gpu",
    }
    assert alert["annotations"] == {
        "summary": f"GPU overheating on node {NODE}",
        "description": f"GPU 3 ({uuid}) on node {NODE} is at 84.0 °C, past the overheat policy "
        "of its model (above 78 °C; NVIDIA B200: within 5 °C of its slowdown limit; NVIDIA "
        "GB200: within 5 °C of its slowdown limit).",
        "runbook_url": _runbook("GPUOverheating"),
    }
    memory = _one(firing, "GPUMemoryOverheating")
    assert memory["labels"]["gpu"] == "3"
    assert memory["labels"]["sensor"] == "memory"
    assert memory["annotations"]["description"] == (
        f"The HBM of GPU 3 ({uuid}) on node {NODE} is at 92.0 °C, above 85 °C."
    )


def test_fabric_alerts_name_the_faulty_link_and_port(
    stack: Stack, firing: dict[str, list[dict[str, Any]]]
) -> None:
    down = _one(firing, "NVLinkDown")
    assert (down["labels"]["gpu"], down["labels"]["link"], down["labels"]["node"]) == (
        "6",
        "4",
        NODE,
    )
    assert down["annotations"]["description"] == f"NVLink 4 of GPU 6 on node {NODE} is down."
    rising = _one(firing, "NVLinkErrorsRising")
    assert {k: rising["labels"][k] for k in ("gpu", "link", "error", "severity")} == {
        "gpu": "5",
        "link": "2",
        "error": "crc_flit",
        "severity": "warning",
    }
    match = re.fullmatch(
        f"NVLink 2 of GPU 5 on node {NODE} counts ({NUMBER}) crc_flit errors per second.",
        rising["annotations"]["description"],
    )
    assert match, rising["annotations"]["description"]
    # The rate window can still reach back before the fault began (10/s injected): the
    # value is above the 1/s threshold and never above the injected rate plus jitter.
    assert 1 < float(match.group(1)) <= 15
    port = _one(firing, "InfiniBandPortDown")
    assert (port["labels"]["device"], port["labels"]["port"]) == ("mlx5_3", "1")
    assert port["annotations"]["summary"] == f"InfiniBand port down on node {NODE}"
    rate = _one(firing, "InfiniBandErrorRateHigh")
    assert (rate["labels"]["device"], rate["labels"]["error"]) == ("mlx5_2", "symbol")
    match = re.fullmatch(
        f"InfiniBand port mlx5_2/1 on node {NODE} counts ({NUMBER}) symbol errors per second.",
        rate["annotations"]["description"],
    )
    assert match, rate["annotations"]["description"]
    # Likewise: above the 10/s threshold, never above the 50/s injected plus jitter.
    assert 10 < float(match.group(1)) <= 75
    counts = {
        (a["labels"]["device"], a["labels"]["error"]) for a in firing["InfiniBandErrorCountHigh"]
    }
    assert counts == {("mlx5_2", "symbol"), ("mlx5_1", "excessive_buffer_overrun")}
    saturated = _one(firing, "InfiniBandCounterSaturated")
    assert (saturated["labels"]["device"], saturated["labels"]["error"]) == (
        "mlx5_1",
        "excessive_buffer_overrun",
    )
    for alerts in firing.values():
        for alert in alerts:
            assert alert["annotations"]["runbook_url"] == _runbook(alert["labels"]["alertname"])


def test_nothing_else_fires_or_is_pending(
    stack: Stack, firing: dict[str, list[dict[str, Any]]]
) -> None:
    assert set(firing) - NO_TAINTER == EXPECTED_ALERTS
    others = {a["labels"]["alertname"] for a in prom_alerts(stack.prom)} - EXPECTED_ALERTS
    assert others == NO_TAINTER


def test_every_dashboard_query_returns_data(
    stack: Stack, firing: dict[str, list[dict[str, Any]]]
) -> None:
    del firing  # the faults are active and their alerts firing: fault panels have data
    dashboards = dashboards_generator()
    empty: list[str] = []
    checked = 0
    for path in sorted(DASHBOARDS_DIR.glob("*.json")):
        if path.stem == "training-job":
            continue
        data = json.loads(path.read_text())
        for title, expr in dashboards.panel_queries(data):
            if title in SKIPPED_PANELS:
                continue
            concrete = (
                expr.replace("$__rate_interval", "1m")
                .replace("$__range_s", "3600")
                .replace("$__range", "1h")
                .replace("$node", ".*")
                .replace("$gpu", ".*")
            )
            checked += 1
            if not prom_query(stack.prom, concrete):
                empty.append(f"{path.stem} / {title}: {concrete}")
    assert checked >= 30
    assert empty == []
