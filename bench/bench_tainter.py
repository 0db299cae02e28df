"""Tainter alert storm: 2,000 nodes' alerts at once against the fake Kubernetes API.

Prints webhook latency (p50/p99/max), taints per second until the breaker trips,
whether exactly the cap was tainted, and the process's memory before and at its peak.
Everything runs in this process on loopback: the fake API, the tainter app (real
kubernetes_asyncio client, generated kubeconfig) and the webhook senders, so the figures
include the fake API's own CPU cost.

With --latency it measures alert-to-taint latency instead, through real Prometheus (5 s
scrape and evaluation, the repo's rules) and real Alertmanager (the shipped route): from
the first exporter sample of GPU 3 above 78 °C to the taint on the simulated node.

    .venv/bin/python bench/bench_tainter.py [--nodes 2000] [--cap 200] [--senders 200]
    .venv/bin/python bench/bench_tainter.py --latency
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer
from fleetwatch.collectors.sim.kubeapi import FakeCluster, make_app, write_kubeconfig
from fleetwatch.tainter.breaker import Breaker, BreakerPolicy
from fleetwatch.tainter.controller import Controller, ControllerSettings
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.server import make_app as make_tainter_app
from fleetwatch.tainter.sources import NoEvidence

TOKEN = "bench-token"


def notification(node: str) -> bytes:
    alert = {
        "status": "firing",
        "fingerprint": f"fp-{node}",
        "startsAt": "2025-01-01T00:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "annotations": {},
        "labels": {
            "alertname": "GPUOverheating",
            "node": node,
            "gpu": "0",
            "fleetwatch_taint": "gpu-overheat",
        },
    }
    return json.dumps({"version": "4", "status": "firing", "alerts": [alert]}).encode()


def _status_mib(field: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


async def storm(nodes: int, cap: int, senders: int) -> None:
    cluster = FakeCluster(token="kube")
    for index in range(nodes):
        cluster.add_node(f"gpu-{index:05d}", labels={"gpu": "true"})
    api_server = TestServer(make_app(cluster), host="127.0.0.1")
    await api_server.start_server()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = write_kubeconfig(
            Path(tmp) / "kubeconfig", server=str(api_server.make_url("")).rstrip("/"), token="kube"
        )
        kube = await KubeNodeApi.connect(kubeconfig=kubeconfig)
    metrics = TainterMetrics()
    controller = Controller(
        api=kube,
        breaker=Breaker(policy=BreakerPolicy(max_nodes=cap, max_fraction=1.0)),
        evidence=NoEvidence(),
        alerts=None,
        metrics=metrics,
        settings=ControllerSettings(node_selector="gpu=true", hold_seconds=300.0),
    )
    tainter = TestServer(
        make_tainter_app(
            controller=controller,
            metrics=metrics,
            token=TOKEN.encode(),
            max_body_bytes=1 << 20,
            reconcile_interval=None,
        ),
        host="127.0.0.1",
    )
    await tainter.start_server()
    url = str(tainter.make_url("/alerts"))
    latencies: list[float] = []
    taint_times: list[float] = []
    queue: asyncio.Queue[str] = asyncio.Queue()
    for index in range(nodes):
        queue.put_nowait(f"gpu-{index:05d}")
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    rss_before = _status_mib("VmRSS")
    start = time.perf_counter()
    statuses: dict[int, int] = {}

    async def sender(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            node = queue.get_nowait()
            sent = time.perf_counter()
            async with session.post(url, data=notification(node), headers=headers) as response:
                await response.read()
                statuses[response.status] = statuses.get(response.status, 0) + 1
            done = time.perf_counter()
            latencies.append(done - sent)
            if cluster.taints(node):
                taint_times.append(done - start)

    connector = aiohttp.TCPConnector(limit=senders)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(sender(session) for _ in range(senders)))
    total = time.perf_counter() - start
    tainted = sum(1 for name in cluster.nodes if cluster.taints(name))
    refused = metrics.registry.get_sample_value(
        "fleetwatch_tainter_taint_operations_total", {"op": "add", "result": "refused"}
    )
    latencies.sort()
    trip = max(taint_times) if taint_times else float("nan")
    print(
        f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    print(
        f"storm: {nodes} nodes, one notification each, {senders} concurrent senders, "
        f"breaker cap {cap}"
    )
    print(f"statuses: {statuses}")
    print(
        f"webhook latency: p50 {statistics.median(latencies) * 1000:.1f} ms, "
        f"p99 {latencies[int(len(latencies) * 0.99) - 1] * 1000:.1f} ms, "
        f"max {latencies[-1] * 1000:.1f} ms"
    )
    print(
        f"taints until the breaker tripped: {len(taint_times)} in {trip:.2f} s "
        f"= {len(taint_times) / trip:.0f} taints/s"
    )
    print(f"whole storm handled in {total:.2f} s ({nodes / total:.0f} notifications/s)")
    print(
        f"tainted nodes: {tainted} (cap {cap}: {'exactly the cap' if tainted == cap else 'WRONG'})"
        f", refused: {refused:.0f}, breaker open: {controller.breaker.open}, "
        f"node writes: {len(cluster.writes)}"
    )
    peak = _status_mib("VmHWM")
    print(
        f"process memory: RSS {rss_before:.1f} MiB before the storm, peak {peak:.1f} MiB "
        "(fake API, tainter and senders in one process: an upper bound for the tainter)"
    )
    await tainter.close()
    await kube.close()
    await api_server.close()


def latency() -> None:
    """Alert-to-taint latency through the real stack with the shipped defaults."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.tainter.test_e2e import start_stack

    hot = re.compile(
        rb'fleetwatch_gpu_temperature_celsius\{[^}]*gpu="3"[^}]*sensor="gpu"[^}]*\} (\S+)'
    )
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as servers:
        stack = start_stack(Path(tmp), servers, interval="5s", hold="5m")
        first_hot = tainted = None
        deadline = time.monotonic() + 120
        while tainted is None and time.monotonic() < deadline:
            if first_hot is None:
                with urllib.request.urlopen(f"{stack.exporter.url}/metrics", timeout=5) as r:
                    match = hot.search(r.read())
                if match and float(match.group(1)) > 78:
                    first_hot = time.monotonic()
            if first_hot is not None and "fleetwatch.io/gpu-overheat" in stack.taint_keys():
                tainted = time.monotonic()
            time.sleep(0.1)
    print("alert-to-taint, shipped defaults (scrape/eval 5s, for 5s, group_wait 1s):")
    if first_hot is None or tainted is None:
        print(f"  no taint within 120 s (first sample above 78 °C seen: {first_hot is not None})")
    else:
        print(
            f"  {tainted - first_hot:.1f} s from the first exporter sample above 78 °C to the taint"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--cap", type=int, default=200)
    parser.add_argument("--senders", type=int, default=200)
    parser.add_argument("--latency", action="store_true", help="measure alert-to-taint instead")
    args = parser.parse_args()
    if args.latency:
        latency()
    else:
        asyncio.run(storm(args.nodes, args.cap, args.senders))


if __name__ == "__main__":
    main()
