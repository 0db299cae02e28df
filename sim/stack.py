"""The whole alerting path on loopback, as real processes, around one simulated node.

A simulated Kubernetes cluster (its API, the node's kubelet PodResources socket and
kube-state-metrics' pod labels, from the scenario's `pods:`), the exporter on the scenario,
Prometheus scraping all three with the shipped rules, Alertmanager with the shipped taint route
pointed at the tainter, and the tainter writing to the simulated cluster. `fleetwatch demo`
runs it as shipped; the end-to-end test and the alert-to-taint bench run it with their own
rule files and tainter timings. Every server goes on the caller's ExitStack, which stops
them all in reverse order.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from fleetwatch.rules.config import (
    ALERTS_FILE,
    GLOBAL_FILE,
    RECORDING_FILE,
    load_config,
    shipped_text,
)
from fleetwatch.sim.loopback_servers import (
    Server,
    alertmanager,
    fleetwatch_command,
    fleetwatch_export,
    free_port,
    prometheus,
    wait_until,
)
from fleetwatch.sim.scenario import load_scenario

ALERTMANAGER_ROUTE: Final = "alertmanager.yml"
KUBECONFIG: Final = "simulated-kubeconfig.yaml"
WEBHOOK_BEARER_FILE: Final = "webhook-token"
SERVERS: Final = ("cluster", "exporter", "prometheus", "alertmanager", "tainter")


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What to start. The exporter and the simulated cluster always run; Prometheus,
    Alertmanager and the tainter when asked (the tainter needs both of the others)."""

    scenario: str  # a built-in scenario name or a scenario file
    node: str
    interval: str = "5s"  # Prometheus' scrape and rule evaluation interval
    collection_interval: str = "2s"  # the exporter's
    rule_files: Sequence[Path] | None = None  # None: the rules the package ships
    tainter_args: Sequence[str] = ()  # added to the tainter's wiring flags
    with_prometheus: bool = True
    with_alertmanager: bool = True
    with_tainter: bool = True
    ports: Mapping[str, int] = field(default_factory=dict)  # preferred, by name in SERVERS


@dataclass
class Stack:
    """The servers that run, and the simulated node they watch."""

    node_name: str
    workdir: Path
    cluster: Server
    exporter: Server
    prometheus: Server | None
    alertmanager: Server | None
    tainter: Server | None

    @property
    def kubeconfig(self) -> Path:
        """The simulated cluster's kubeconfig (no token: anyone on loopback may read it)."""
        return self.workdir / KUBECONFIG

    def urls(self) -> dict[str, str]:
        """The base URL of each server that runs, by its name in SERVERS."""
        running = {name: getattr(self, name) for name in SERVERS}
        return {name: server.url for name, server in running.items() if server is not None}

    def node(self) -> dict[str, Any]:
        """The simulated node as the cluster's API serves it now."""
        url = f"{self.cluster.url}/api/v1/nodes/{self.node_name}"
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            node: dict[str, Any] = json.load(response)
            return node

    def taints(self) -> list[dict[str, Any]]:
        """The node's `spec.taints`."""
        taints: list[dict[str, Any]] = self.node()["spec"].get("taints") or []
        return taints

    def taint_keys(self) -> list[str]:
        return [t["key"] for t in self.taints()]


def tainter_process(
    workdir: Path,
    *,
    port: int,
    prometheus_url: str,
    alertmanager_url: str,
    args: Sequence[str],
) -> contextlib.AbstractContextManager[Server]:
    """`fleetwatch taint` on `port` with a fresh webhook token (`workdir /
    WEBHOOK_BEARER_FILE`, which `alertmanager_config` points Alertmanager at), reading
    Prometheus and Alertmanager at their URLs, with `args` added (its backend, timings)."""
    token = workdir / WEBHOOK_BEARER_FILE
    token.write_text(os.urandom(16).hex())
    return fleetwatch_command(
        workdir / "tainter",
        command="taint",
        port=port,
        args=[
            f"--web.token-file={token}",
            f"--prometheus.url={prometheus_url}",
            f"--alertmanager.url={alertmanager_url}",
            *args,
        ],
    )


def alertmanager_config(*, tainter_url: str, token_file: Path) -> dict[str, Any]:
    """The shipped Alertmanager route with its webhook pointed at `tainter_url`."""
    config: dict[str, Any] = yaml.safe_load(shipped_text(ALERTMANAGER_ROUTE))
    for receiver in config.get("receivers", []):
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{tainter_url}/alerts"
            authorization = hook.setdefault("http_config", {}).setdefault("authorization", {})
            authorization["credentials_file"] = str(token_file)
    return config


def shipped_rules(workdir: Path) -> list[Path]:
    """The alert and recording rules the package ships, both scopes (one Prometheus runs
    them all), written to `workdir`."""
    paths = []
    for name in (ALERTS_FILE.name, RECORDING_FILE.name, GLOBAL_FILE.name):
        path = workdir / name
        path.write_text(shipped_text(name), encoding="utf-8")
        paths.append(path)
    return paths


def scrape_configs(
    *, node: str, exporter: Server, cluster: Server, tainter: Server | None
) -> list[dict[str, Any]]:
    """A scrape job for every server the rules and dashboards watch, each under the job
    name the shipped rules select (`selectors:` in rules/config.yaml, as the chart's
    ServiceMonitors name them): the exporter (with its node's `node` label), the simulated
    cluster's kube-state-metrics and, when it runs, the tainter. A server left unscraped
    reads as down: FleetwatchTainterDown would page while the tainter works."""
    jobs = load_config().scrape_jobs()
    configs: list[dict[str, Any]] = [
        {
            "job_name": jobs["exporter"],
            "static_configs": [{"targets": [exporter.address], "labels": {"node": node}}],
        },
        {
            "job_name": jobs["kube_state_metrics"],
            "static_configs": [{"targets": [cluster.address]}],
        },
    ]
    if tainter is not None:
        configs.append(
            {"job_name": jobs["tainter"], "static_configs": [{"targets": [tainter.address]}]}
        )
    return configs


def start_stack(workdir: Path, servers: contextlib.ExitStack, plan: Plan) -> Stack:
    """Start what `plan` asks for, each ready before the next; `servers` stops them all.

    Ports are chosen first, so the tainter can be told where Prometheus and Alertmanager
    will listen and every server starts with its final configuration.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    ports: dict[str, int] = {}
    for name in SERVERS:
        port = free_port(plan.ports.get(name, 0))
        while port in ports.values():  # free now, but another server's until it starts
            port = free_port()
        ports[name] = port
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    with_alertmanager = plan.with_alertmanager and plan.with_prometheus
    with_tainter = plan.with_tainter and with_alertmanager
    socket = workdir / f"{plan.node}.sock"
    kubeconfig = workdir / KUBECONFIG
    cluster = servers.enter_context(
        fleetwatch_command(
            workdir / "cluster",
            command="simulate-cluster",
            ready_path="/readyz",
            port=ports["cluster"],
            args=[
                f"--kubelet.scenario={plan.node}={plan.scenario}",
                f"--kubelet.socket-dir={workdir}",
                f"--out.kubeconfig={kubeconfig}",
            ],
        )
    )
    wait_until(kubeconfig.exists, timeout=10, what="the simulated cluster's kubeconfig")
    exporter = servers.enter_context(
        fleetwatch_export(
            workdir / "exporter",
            simulate=plan.scenario,
            port=ports["exporter"],
            args=[
                f"--collector.interval={plan.collection_interval}",
                # As a node's DaemonSet is told its GPU count: a GPU that falls off the bus
                # shows against it, and the report's reliability section reads it.
                f"--collector.gpu.expected-count={load_scenario(plan.scenario).gpus}",
                f"--collector.podresources.socket={socket}",
                f"--collector.podresources.refresh-interval={plan.collection_interval}",
            ],
        )
    )
    tainter = None
    if with_tainter:
        tainter = servers.enter_context(
            tainter_process(
                workdir,
                port=ports["tainter"],
                prometheus_url=urls["prometheus"],
                alertmanager_url=urls["alertmanager"],
                args=[f"--kubeconfig={kubeconfig}", *plan.tainter_args],
            )
        )
    am = None
    if with_alertmanager:
        config: dict[str, Any] = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
        if tainter is not None:
            config = alertmanager_config(
                tainter_url=tainter.url, token_file=workdir / WEBHOOK_BEARER_FILE
            )
        am = servers.enter_context(
            alertmanager(workdir / "alertmanager", config=config, port=ports["alertmanager"])
        )
    prom = None
    if plan.with_prometheus:
        prom = servers.enter_context(
            prometheus(
                workdir / "prometheus",
                port=ports["prometheus"],
                rule_files=shipped_rules(workdir) if plan.rule_files is None else plan.rule_files,
                alertmanager_urls=[am.url] if am else [],
                scrape_interval=plan.interval,
                evaluation_interval=plan.interval,
                scrape_configs=scrape_configs(
                    node=plan.node, exporter=exporter, cluster=cluster, tainter=tainter
                ),
            )
        )
    return Stack(
        node_name=plan.node,
        workdir=workdir,
        cluster=cluster,
        exporter=exporter,
        prometheus=prom,
        alertmanager=am,
        tainter=tainter,
    )
