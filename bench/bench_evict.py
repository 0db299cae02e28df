"""Taint-to-eviction latency on a real Kubernetes API server (`KUBEBUILDER_ASSETS`).

Starts kube-apiserver and etcd on loopback (testbed/kube_apiserver.py), creates `--nodes` GPU nodes
each running one opted-in GPU pod of its own training job, and runs the tainter's
controller with the node condition and removal from the run (`--evict.reasons
gpu-overheat`, `--evict.max-per-minute 1000`) through the real kubernetes_asyncio client.
Prints, per node, the time from the taint written (the node patch answered) to the
eviction answered (201), p50/p99/max: first one notification at a time, then all nodes
in one notification (a storm). The API server, etcd and this process share the machine.

    KUBEBUILDER_ASSETS=... .venv/bin/python -m bench.bench_evict [--nodes 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fleetwatch.rules.config import load_config
from fleetwatch.tainter.breaker import Breaker
from fleetwatch.tainter.condition import ConditionKeeper
from fleetwatch.tainter.controller import Controller
from fleetwatch.tainter.election import Leadership
from fleetwatch.tainter.evict import EVICT_LABEL, Evictor
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.kube_objects import NodeView, Taint
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import AlertState, parse_webhook
from fleetwatch.tainter.settings import (
    BreakerPolicy,
    ControllerSettings,
    EvictionSettings,
    NodeConditionSettings,
)
from fleetwatch.tainter.sources import NoEvidence
from fleetwatch.tainter.taint_policy import TaintPolicy
from testbed.kube_apiserver import ADMIN, ApiServer, api_server, bound_pod

NAMESPACE = "bench"
JOB_LABEL = "jobset.sigs.k8s.io/jobset-name"


class Timed(KubeNodeApi):
    """The real client, noting when each node's taint write and each pod's eviction
    were answered."""

    tainted: dict[str, float]
    evicted: dict[str, float]

    async def patch_node(
        self,
        name: str,
        *,
        resource_version: str,
        taints: Sequence[Taint] | None,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> NodeView:
        node = await super().patch_node(
            name,
            resource_version=resource_version,
            taints=taints,
            labels=labels,
            annotations=annotations,
        )
        self.tainted.setdefault(name, time.perf_counter())
        return node

    async def evict_pod(self, *, namespace: str, name: str) -> None:
        await super().evict_pod(namespace=namespace, name=name)
        self.evicted[name.removeprefix("train-")] = time.perf_counter()


def prepare(server: ApiServer, nodes: int) -> None:
    """`nodes` ready GPU nodes, each running one opted-in pod of its own job."""
    server.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    server.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": NAMESPACE},
        }
    )
    for index in range(nodes):
        name = f"gpu-{index}"
        server.call("POST", "/api/v1/nodes", {"metadata": {"name": name}})
        server.call(
            "PATCH",
            f"/api/v1/nodes/{name}",
            {"spec": {"taints": None}},
            content_type="application/merge-patch+json",
        )
        labels = {EVICT_LABEL: "true", JOB_LABEL: f"job-{index}"}
        pod = server.call(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            bound_pod(f"train-{name}", namespace=NAMESPACE, node=name, labels=labels),
        )
        pod["status"] = {"phase": "Running"}
        server.call("PUT", f"/api/v1/namespaces/{NAMESPACE}/pods/train-{name}/status", pod)


def alerts(nodes: Sequence[str]) -> list[AlertState]:
    body: dict[str, Any] = {
        "version": "4",
        "status": "firing",
        "alerts": [
            {
                "status": "firing",
                "labels": {
                    "alertname": "GPUOverheating",
                    "node": node,
                    "gpu": "0",
                    "fleetwatch_taint": "gpu-overheat",
                },
                "startsAt": "2025-01-01T00:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "fingerprint": f"fp-{node}",
            }
            for node in nodes
        ],
    }
    return parse_webhook(body)


def summary(what: str, api: Timed, nodes: Sequence[str]) -> None:
    latencies = sorted((api.evicted[n] - api.tainted[n]) * 1000 for n in nodes)
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    print(
        f"{what}: {len(latencies)} nodes, taint-to-eviction p50 "
        f"{statistics.median(latencies):.1f} ms, p99 {p99:.1f} ms, max {latencies[-1]:.1f} ms"
    )


async def measure(server: ApiServer, nodes: int) -> None:
    api = await Timed.connect(kubeconfig=server.kubeconfig(ADMIN), timeout=10.0)
    assert isinstance(api, Timed)
    api.tainted, api.evicted = {}, {}
    metrics = TainterMetrics()
    leadership = Leadership(renew_deadline=None)
    settings = ControllerSettings(hold_seconds=0.0)
    controller = Controller(
        api=api,
        breaker=Breaker(policy=BreakerPolicy(max_new_taints=nodes, max_fraction=1.0)),
        evidence=NoEvidence(),
        alerts=None,
        metrics=metrics,
        settings=settings,
        policy=TaintPolicy(declared_reasons=None),
        after_sync=(
            ConditionKeeper(
                api=api,
                leadership=leadership,
                metrics=metrics,
                settings=NodeConditionSettings(),
                retry=settings.retry,
                dry_run=False,
            ),
            Evictor(
                api=api,
                leadership=leadership,
                metrics=metrics,
                settings=EvictionSettings(reasons=frozenset({"gpu-overheat"}), max_per_minute=1000),
                job_label_keys=load_config().job_label_keys,
                retry=settings.retry,
                dry_run=False,
                owner=settings.owner,
            ),
        ),
    )
    try:
        half = nodes // 2
        one_by_one = [f"gpu-{i}" for i in range(half)]
        for node in one_by_one:
            await controller.handle_alerts(alerts([node]))
        summary("one notification per node", api, one_by_one)
        storm = [f"gpu-{i}" for i in range(half, nodes)]
        await controller.handle_alerts(alerts(storm))
        summary("all in one notification", api, storm)
    finally:
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=40)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder, api_server(Path(folder)) as server:
        print(f"kube-apiserver ready in {server.startup_seconds:.1f} s")
        prepare(server, args.nodes)
        asyncio.run(measure(server, args.nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
