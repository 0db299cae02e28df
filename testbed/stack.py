"""The whole alerting path on loopback, as real processes: a simulated cluster, an exporter
whose GPU 3 heats past 78 °C and cools again, Prometheus with the repository's rules, the
tainter, and Alertmanager with the shipped taint route. Used by the end-to-end test and
the alert-to-taint bench.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.servers import (
    Server,
    alertmanager,
    fleetwatch_command,
    fleetwatch_export,
    prometheus,
    wait_until,
)

REPO = Path(__file__).resolve().parents[1]
NODE = "e2e-node"
SCENARIO = {
    "description": "GPU 3 heats to 84 °C, then cools to 60 °C",
    "gpus": 4,
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "nvlinks_per_gpu": 2,
    "infiniband": [{"device": "mlx5_0", "ports": 1, "rate_gbps": 400, "link_layer": "InfiniBand"}],
    "baseline": {"temperature_celsius": 62, "tensor_active": 0.55},
    "faults": [
        {"at": 5, "kind": "temperature", "gpu": 3, "celsius": 84, "ramp_seconds": 5},
        {"at": 35, "kind": "temperature", "gpu": 3, "celsius": 60, "ramp_seconds": 3},
    ],
}


@dataclass
class Stack:
    exporter: Server
    prometheus: Server
    alertmanager: Server
    tainter: Server
    cluster_url: str
    cluster_token: str

    def node(self) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.cluster_url}/api/v1/nodes/{NODE}",
            headers={"Authorization": f"Bearer {self.cluster_token}"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            node: dict[str, Any] = json.load(response)
            return node

    def taint_keys(self) -> list[str]:
        return [t["key"] for t in self.node()["spec"].get("taints") or []]


def shipped_alertmanager_config(*, tainter_url: str, token_file: Path) -> dict[str, Any]:
    """rules/alertmanager.yml with the receiver pointed at this test's tainter."""
    config: dict[str, Any] = yaml.safe_load((REPO / "rules" / "alertmanager.yml").read_text())
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{tainter_url}/alerts"
            hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    return config


def fast_rules(workdir: Path) -> list[Path]:
    """The repo's rule files, with GPUOverheating's keep_firing_for shortened to 5s."""
    rules = yaml.safe_load((REPO / "rules" / "fleetwatch.rules.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "GPUOverheating":
                rule["keep_firing_for"] = "5s"
    path = workdir / "fleetwatch.rules.yaml"
    path.write_text(yaml.safe_dump(rules, allow_unicode=True))
    return [path, REPO / "rules" / "fleetwatch.recording.yaml"]


def start_stack(workdir: Path, stack: contextlib.ExitStack, *, interval: str, hold: str) -> Stack:
    """Every server, started in dependency order; `stack` stops them all."""
    scenario = workdir / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    token = workdir / "webhook-token"
    token.write_text("e2e-webhook-token\n")
    kubeconfig = workdir / "kubeconfig.yaml"
    stack.enter_context(
        fleetwatch_command(
            workdir / "cluster",
            command="simulate-cluster",
            ready_path="/readyz",
            args=[f"--node={NODE}", f"--kubeconfig-out={kubeconfig}"],
        )
    )
    wait_until(kubeconfig.exists, timeout=10, what="the simulated cluster's kubeconfig")
    exporter = stack.enter_context(
        fleetwatch_export(
            workdir / "exporter", simulate=str(scenario), args=["--collection-interval=1s"]
        )
    )
    tainter_args = [
        f"--web.token-file={token}",
        f"--kubeconfig={kubeconfig}",
        f"--untaint.hold={hold}",
        "--reconcile-interval=2s",
        "--breaker.max-nodes=10",
        "--breaker.max-fraction=1",
    ]
    prom = stack.enter_context(
        prometheus(
            workdir / "prometheus",
            rule_files=fast_rules(workdir),
            scrape_interval=interval,
            evaluation_interval=interval,
            scrape_configs=[
                {
                    "job_name": "fleetwatch",
                    "static_configs": [
                        {
                            "targets": [exporter.url.removeprefix("http://")],
                            "labels": {"node": NODE},
                        }
                    ],
                }
            ],
        )
    )
    tainter = stack.enter_context(
        fleetwatch_command(
            workdir / "tainter",
            command="taint",
            args=[*tainter_args, f"--prometheus-url={prom.url}"],
        )
    )
    am = stack.enter_context(
        alertmanager(
            workdir / "alertmanager",
            config=(shipped_alertmanager_config(tainter_url=tainter.url, token_file=token)),
        )
    )
    point_prometheus_at(prom, am.url, workdir / "prometheus")
    kube = yaml.safe_load(kubeconfig.read_text())
    return Stack(
        exporter=exporter,
        prometheus=prom,
        alertmanager=am,
        tainter=tainter,
        cluster_url=kube["clusters"][0]["cluster"]["server"],
        cluster_token=kube["users"][0]["user"].get("token", ""),
    )


def point_prometheus_at(prom: Server, alertmanager_url: str, workdir: Path) -> None:
    """Add the Alertmanager to the running Prometheus' config and reload it."""
    config_path = workdir / "prometheus.yml"
    config = yaml.safe_load(config_path.read_text())
    config["alerting"] = {
        "alertmanagers": [
            {"static_configs": [{"targets": [alertmanager_url.removeprefix("http://")]}]}
        ]
    }
    config_path.write_text(yaml.safe_dump(config))
    request = urllib.request.Request(f"{prom.url}/-/reload", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
