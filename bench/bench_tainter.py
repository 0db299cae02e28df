"""Tainter alert storm: 2,000 nodes' alerts at once against the fake Kubernetes API.

Prints webhook latency (p50/p99/max), taints per second until the breaker trips,
whether exactly the cap was tainted, and the process's memory before and at its peak.
Everything runs in this process on loopback: the fake API, the tainter app(s) (real
kubernetes_asyncio client, generated kubeconfig) and the webhook senders, so the figures
include the fake API's own CPU cost. With --replicas 2 two tainters run with leader
election (shipped timings) and every notification goes to both, as Alertmanager does
with two webhook targets: the leader's latencies are the ones that matter, the follower
answers 503 (built without a forwarder: the storm measures the leader alone).

With --latency it measures alert-to-taint latency instead, through real Prometheus (5 s
scrape and evaluation, the repo's rules) and real Alertmanager (the shipped route): from
the first exporter sample of GPU 3 above the shipped GPUOverheating threshold
(rules/config.yaml's `gpu_temperature_celsius`) to the taint on the simulated node.

With --failover it runs two `fleetwatch taint --leader-elect` processes (shipped Lease
timings: 15 s duration, 10 s renew deadline, 2 s retry), kills the leader with SIGKILL and
times the first taint written by the new leader (a notification is offered to it every
100 ms; until it leads, it hands them to the dead leader's advertised URL and answers 503).

With --ha-latency [--replicas 2] it measures alert-to-taint over 24 alerts (one new hot
node every 1.5 s) through real Prometheus (5 s scrape and evaluation, the shipped rules,
a scrape target of 24 one-GPU nodes) and real Alertmanager (the shipped timers), with even
nodes' notifications sent to one replica and odd nodes' to the other, as a Service spreads
them: half land on the follower, which hands them to the leader.

With --missing-nodes it sends 15,000 alerts for nodes that do not exist and
prints the tainter's RSS and state sizes as it goes. With --breaker-cost it times the
breaker's decision on a 2,000-node fleet: as a function (a take-out allowed, refused, and
classifying every node out as a reconcile does), and through the controller against the
fake API (one notification for a new node, allowed and refused; the live count of a
reconcile).

    .venv/bin/python bench/bench_tainter.py [--nodes 2000] [--cap 200] [--senders 200]
    .venv/bin/python bench/bench_tainter.py --replicas 2
    .venv/bin/python bench/bench_tainter.py --latency
    .venv/bin/python bench/bench_tainter.py --failover
    .venv/bin/python bench/bench_tainter.py --ha-latency [--replicas 2]
    .venv/bin/python bench/bench_tainter.py --missing-nodes 15000
    .venv/bin/python bench/bench_tainter.py --breaker-cost [--nodes 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import platform
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from fleetwatch.rules.config import shipped_text
from fleetwatch.sim.kubeapi import FakeCluster, make_app, write_kubeconfig
from fleetwatch.sim.loopback_servers import fleetwatch_command, free_port, http_status
from fleetwatch.sim.stack import ALERTMANAGER_ROUTE
from fleetwatch.tainter.breaker import Breaker, BreakerStore, node_out
from fleetwatch.tainter.controller import Controller
from fleetwatch.tainter.election import (
    LeaderElector,
    LeaderOnlyNodeApi,
    Leadership,
)
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.kube_objects import NodeView, Taint
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.server import Background
from fleetwatch.tainter.server import make_app as make_tainter_app
from fleetwatch.tainter.settings import BreakerPolicy, ControllerSettings, ElectionSettings
from fleetwatch.tainter.sources import NoEvidence
from fleetwatch.tainter.taint_policy import TaintPolicy, shipped_reasons

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


class Replica:
    """One in-process tainter: controller, app and (with election) its leadership."""

    def __init__(self, *, kube: KubeNodeApi, cap: int, name: str, elect: bool) -> None:
        self.metrics = TainterMetrics()
        self.leadership = Leadership(renew_deadline=10.0 if elect else None)
        self.controller = Controller(
            api=LeaderOnlyNodeApi(real=kube, leadership=self.leadership),
            breaker=Breaker(policy=BreakerPolicy(max_new_taints=cap, max_fraction=1.0)),
            evidence=NoEvidence(),
            alerts=None,
            metrics=self.metrics,
            settings=ControllerSettings(node_selector="gpu=true", hold_seconds=300.0),
            policy=TaintPolicy(declared_reasons=shipped_reasons()),
            breaker_store=BreakerStore(api=kube, namespace="bench", name="tainter"),
        )
        elector = (
            LeaderElector(
                api=kube,
                settings=ElectionSettings(namespace="bench", name="tainter", identity=name),
                leadership=self.leadership,
                on_elected=self.controller.prepare_to_lead,
                on_change=lambda _: None,
            )
            if elect
            else None
        )
        self.server = TestServer(
            make_tainter_app(
                controller=self.controller,
                metrics=self.metrics,
                auth=None,
                max_body_bytes=1 << 20,
                leadership=self.leadership,
                background=Background(
                    reconcile_interval=3600.0, breaker_interval=2.0, elector=elector
                )
                if elect
                else None,
            ),
            host="127.0.0.1",
        )

    @property
    def url(self) -> str:
        return str(self.server.make_url("/alerts"))


@contextlib.asynccontextmanager
async def fake_cluster(nodes: int) -> AsyncIterator[tuple[FakeCluster, KubeNodeApi]]:
    """The fake API with `nodes` GPU nodes, and a real client connected to it."""
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
    try:
        yield cluster, kube
    finally:
        await kube.close()
        await api_server.close()


def percentiles(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    return (
        f"p50 {statistics.median(ordered) * 1000:.1f} ms, "
        f"p99 {ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000:.1f} ms, "
        f"max {ordered[-1] * 1000:.1f} ms"
    )


async def storm(nodes: int, cap: int, senders: int, replicas: int) -> None:
    async with fake_cluster(nodes) as (cluster, kube):
        tainters = [
            Replica(kube=kube, cap=cap, name=f"replica-{i}", elect=replicas > 1)
            for i in range(replicas)
        ]
        for tainter in tainters:
            await tainter.server.start_server()
        deadline = time.monotonic() + 30
        while not any(t.leadership.is_leader for t in tainters):
            if time.monotonic() > deadline:
                raise SystemExit("no replica became leader within 30 s")
            await asyncio.sleep(0.05)
        leader = next(t for t in tainters if t.leadership.is_leader)
        await report_storm(cluster, tainters, leader, nodes=nodes, cap=cap, senders=senders)
        for tainter in tainters:
            await tainter.server.close()


async def report_storm(
    cluster: FakeCluster,
    tainters: list[Replica],
    leader: Replica,
    *,
    nodes: int,
    cap: int,
    senders: int,
) -> None:
    latencies: dict[str, list[float]] = {"leader": [], "follower": []}
    taint_times: list[float] = []
    queue: asyncio.Queue[str] = asyncio.Queue()
    for index in range(nodes):
        queue.put_nowait(f"gpu-{index:05d}")
    headers = {"Content-Type": "application/json"}
    rss_before = _status_mib("VmRSS")
    start = time.perf_counter()
    statuses: dict[int, int] = {}

    async def post(session: aiohttp.ClientSession, tainter: Replica, node: str) -> None:
        sent = time.perf_counter()
        async with session.post(tainter.url, data=notification(node), headers=headers) as response:
            await response.read()
            statuses[response.status] = statuses.get(response.status, 0) + 1
        role = "leader" if tainter is leader else "follower"
        latencies[role].append(time.perf_counter() - sent)

    async def sender(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            node = queue.get_nowait()
            await asyncio.gather(*(post(session, t, node) for t in tainters))
            if cluster.taints(node):
                taint_times.append(time.perf_counter() - start)

    connector = aiohttp.TCPConnector(limit=senders * len(tainters))
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(sender(session) for _ in range(senders)))
    total = time.perf_counter() - start
    tainted = sum(1 for name in cluster.nodes if cluster.taints(name))
    refused = leader.metrics.registry.get_sample_value(
        "fleetwatch_tainter_taint_operations_total", {"op": "add", "result": "refused"}
    )
    trip = max(taint_times) if taint_times else float("nan")
    print(
        f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    print(
        f"storm: {nodes} nodes, one notification each, {senders} concurrent senders, "
        f"breaker cap {cap}, {len(tainters)} replica(s)"
    )
    print(f"statuses: {statuses}")
    print(f"webhook latency, leader: {percentiles(latencies['leader'])}")
    if latencies["follower"]:
        print(f"webhook latency, follower (503): {percentiles(latencies['follower'])}")
    print(
        f"taints until the breaker tripped: {len(taint_times)} in {trip:.2f} s "
        f"= {len(taint_times) / trip:.0f} taints/s"
    )
    print(f"whole storm handled in {total:.2f} s ({nodes / total:.0f} notifications/s)")
    writers = {user for user, what in cluster.writers if what.startswith("node/")}
    print(
        f"tainted nodes: {tainted} (cap {cap}: {'exactly the cap' if tainted == cap else 'WRONG'})"
        f", refused: {refused:.0f}, breaker open: {leader.controller.breaker.open}, "
        f"node writes: {len(cluster.writes)} by {len(writers)} writer(s)"
    )
    peak = _status_mib("VmHWM")
    print(
        f"process memory: RSS {rss_before:.1f} MiB before the storm, peak {peak:.1f} MiB "
        "(fake API, tainter and senders in one process: an upper bound for the tainter)"
    )


async def missing_nodes(count: int) -> None:
    """RSS and state sizes while `count` alerts arrive for nodes that do not exist."""
    async with fake_cluster(10) as (cluster, kube):
        tainter = Replica(kube=kube, cap=10, name="only", elect=False)
        await tainter.server.start_server()
        async with aiohttp.ClientSession() as session:
            print(f"RSS before: {_status_mib('VmRSS'):.1f} MiB")
            for index in range(count):
                async with session.post(
                    tainter.url, data=notification(f"missing-{index:06d}")
                ) as response:
                    await response.read()
                if (index + 1) % (count // 3) == 0:
                    print(
                        f"after {index + 1} alerts for missing nodes: RSS "
                        f"{_status_mib('VmRSS'):.1f} MiB, state {tainter.controller.state_sizes()}"
                    )
        print(f"node writes: {len(cluster.writes)}")
        await tainter.server.close()


def failover() -> None:
    """Kill the leader of two real tainter processes; time the new leader's first taint."""
    import signal

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from testbed.tool_servers import served_in_thread

    cluster = FakeCluster(token="kube")
    for index in range(20):
        cluster.add_node(f"gpu-{index:05d}", labels={"gpu": "true"})
    with (
        tempfile.TemporaryDirectory() as tmp,
        served_in_thread(make_app(cluster)) as api,
        contextlib.ExitStack() as stack,
    ):
        kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", server=api, token="kube")
        ports = [free_port(), free_port()]
        while ports[1] == ports[0]:
            ports[1] = free_port()
        replicas = [
            stack.enter_context(
                fleetwatch_command(
                    Path(tmp) / f"replica-{i}",
                    command="taint",
                    port=port,
                    args=[
                        "--web.insecure-no-token",
                        f"--kubeconfig={kubeconfig}",
                        "--leader-elect",
                        f"--leader-elect.advertise-url=http://127.0.0.1:{port}",
                        "--breaker.max-fraction=1",
                    ],
                )
            )
            for i, port in enumerate(ports)
        ]
        deadline = time.monotonic() + 60
        while not any(http_status(r.url + "/readyz") == 200 for r in replicas):
            if time.monotonic() > deadline:
                raise SystemExit("no leader within 60 s")
            time.sleep(0.1)
        leader = next(r for r in replicas if http_status(r.url + "/readyz") == 200)
        follower = next(r for r in replicas if r is not leader)
        leader.process.send_signal(signal.SIGKILL)
        leader.process.wait(timeout=10)
        killed = time.monotonic()
        node = "gpu-00007"
        while not cluster.taints(node) and time.monotonic() - killed < 60:
            request = urllib.request.Request(
                follower.url + "/alerts",
                data=notification(node),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            with contextlib.suppress(OSError):
                urllib.request.urlopen(request, timeout=5).close()
            time.sleep(0.1)
        took = time.monotonic() - killed
    print("failover, shipped Lease timings (15 s duration, 10 s renew deadline, 2 s retry):")
    print(f"  {took:.1f} s from SIGKILL of the leader to the new leader's first taint")


def latency() -> None:
    """Alert-to-taint latency through the real stack with the shipped defaults."""
    from fleetwatch.sim.overheat import OVERHEAT_CELSIUS, start_overheat_stack

    hot = re.compile(
        rb'fleetwatch_gpu_temperature_celsius\{[^}]*gpu="3"[^}]*sensor="gpu"[^}]*\} (\S+)'
    )
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as servers:
        stack = start_overheat_stack(Path(tmp), servers, interval="5s", hold="5m")
        first_hot = tainted = None
        deadline = time.monotonic() + 120
        while tainted is None and time.monotonic() < deadline:
            if first_hot is None:
                with urllib.request.urlopen(f"{stack.exporter.url}/metrics", timeout=5) as r:
                    match = hot.search(r.read())
                if match and float(match.group(1)) > OVERHEAT_CELSIUS:
                    first_hot = time.monotonic()
            if first_hot is not None and "fleetwatch.io/gpu-overheat" in stack.taint_keys():
                tainted = time.monotonic()
            time.sleep(0.1)
    print("alert-to-taint, shipped defaults (scrape/eval 5s, for 5s, group_wait 1s):")
    if first_hot is None or tainted is None:
        print(
            f"  no taint within 120 s (first sample above {OVERHEAT_CELSIUS:g} °C seen: "
            f"{first_hot is not None})"
        )
    else:
        print(
            f"  {tainted - first_hot:.1f} s from the first exporter sample above "
            f"{OVERHEAT_CELSIUS:g} °C to the taint"
        )


def _temperature_target(hot: dict[str, float]) -> web.Application:
    """A scrape target with one GPU per node: 62 °C, or 84 °C once the node is in `hot`."""

    async def metrics(_: web.Request) -> web.Response:
        lines = [
            "# TYPE fleetwatch_gpu_temperature_celsius gauge",
            *(
                f'fleetwatch_gpu_temperature_celsius{{node="{node}",gpu="0",'
                f'uuid="GPU-{node}",sensor="gpu"}} {84 if node in hot else 62}'
                for node in HA_NODES
            ),
        ]
        return web.Response(text="\n".join(lines) + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


HA_NODES = tuple(f"n-{index:02d}" for index in range(24))


def _ha_alertmanager(urls: list[str], token: Path) -> dict[str, object]:
    """The shipped route's timers; even nodes' notifications go to the first URL, odd
    nodes' to the last, as a Service spreads them over replicas."""
    shipped = yaml.safe_load(shipped_text(ALERTMANAGER_ROUTE))
    (tainter_route,) = [r for r in shipped["route"]["routes"] if r["receiver"].endswith("tainter")]
    routes, receivers = [], []
    for index, parity in enumerate(("[02468]", "[13579]")):
        url = urls[min(index, len(urls) - 1)]
        name = f"tainter-{index}"
        routes.append(
            {
                **tainter_route,
                "receiver": name,
                "matchers": [f'node=~".*{parity}"'],
                "continue": False,
            }
        )
        receivers.append(
            {
                "name": name,
                "webhook_configs": [
                    {
                        "url": f"{url}/alerts",
                        "send_resolved": True,
                        "http_config": {
                            "authorization": {"type": "Bearer", "credentials_file": str(token)}
                        },
                    }
                ],
            }
        )
    return {
        "route": {"receiver": "default", "group_by": ["alertname", "node"], "routes": routes},
        "receivers": [{"name": "default"}, *receivers],
    }


def ha_latency(replicas: int) -> None:
    """Alert-to-taint latency over len(HA_NODES) alerts through real Prometheus (5 s scrape
    and evaluation, the shipped rules) and Alertmanager (the shipped timers), to `replicas`
    tainter processes (shipped Lease timings, each advertising its URL); with two, half the
    notifications land on the follower, which hands them to the leader."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fleetwatch.sim.loopback_servers import alertmanager, prometheus
    from fleetwatch.sim.stack import shipped_rules
    from testbed.tool_servers import served_in_thread

    cluster = FakeCluster(token="kube")
    for node in HA_NODES:
        cluster.add_node(node, labels={"gpu": "true"})
    hot: dict[str, float] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        served_in_thread(make_app(cluster)) as api,
        served_in_thread(_temperature_target(hot)) as target,
        contextlib.ExitStack() as stack,
    ):
        work = Path(tmp)
        kubeconfig = write_kubeconfig(work / "kubeconfig", server=api, token="kube")
        token = work / "token"
        token.write_text(TOKEN)
        tainters = []
        for index in range(replicas):
            port = free_port()
            elect = (
                ["--leader-elect", f"--leader-elect.advertise-url=http://127.0.0.1:{port}"]
                if replicas > 1
                else []
            )
            tainters.append(
                stack.enter_context(
                    fleetwatch_command(
                        work / f"tainter-{index}",
                        command="taint",
                        port=port,
                        args=[
                            f"--web.token-file={token}",
                            f"--kubeconfig={kubeconfig}",
                            "--breaker.max-new-taints=100",
                            "--breaker.max-fraction=1",
                            *elect,
                        ],
                    )
                )
            )
        am = stack.enter_context(
            alertmanager(
                work / "alertmanager", config=_ha_alertmanager([t.url for t in tainters], token)
            )
        )
        stack.enter_context(
            prometheus(
                work / "prometheus",
                rule_files=shipped_rules(work),
                alertmanager_urls=[am.url],
                scrape_interval="5s",
                evaluation_interval="5s",
                scrape_configs=[
                    {
                        "job_name": "fleetwatch",
                        "static_configs": [{"targets": [target.removeprefix("http://")]}],
                    }
                ],
            )
        )
        deadline = time.monotonic() + 60
        while not any(http_status(t.url + "/readyz") == 200 for t in tainters):
            if time.monotonic() > deadline:
                raise SystemExit("no leader within 60 s")
            time.sleep(0.1)
        leader = next(i for i, t in enumerate(tainters) if http_status(t.url + "/readyz") == 200)
        time.sleep(6)  # one scrape of the cool fleet first
        tainted: dict[str, float] = {}
        for node in HA_NODES:  # one new overheating node every 1.5 s
            hot[node] = time.monotonic()
            until = time.monotonic() + 1.5
            while time.monotonic() < until:
                for name in hot.keys() - tainted.keys():
                    if cluster.taints(name):
                        tainted[name] = time.monotonic()
                time.sleep(0.02)
        deadline = time.monotonic() + 60
        while hot.keys() - tainted.keys() and time.monotonic() < deadline:
            for name in hot.keys() - tainted.keys():
                if cluster.taints(name):
                    tainted[name] = time.monotonic()
            time.sleep(0.02)
        forwards = [
            _counter(t.url, "fleetwatch_tainter_webhook_forwards_total", 'result="delivered"')
            for t in tainters
        ]
        handling = [
            _counter(t.url, "fleetwatch_tainter_webhook_duration_seconds_sum", "")
            / max(1.0, _counter(t.url, "fleetwatch_tainter_webhook_duration_seconds_count", ""))
            for t in tainters
        ]
    landing = {
        node: "leader" if replicas == 1 or index % 2 == leader else "follower"
        for index, node in enumerate(HA_NODES)
    }
    print(
        f"alert-to-taint, {replicas} replica(s), {len(HA_NODES)} alerts "
        "(scrape/eval 5s, for 5s, group_wait 1s):"
    )
    missing = sorted(hot.keys() - tainted.keys())
    if missing:
        print(f"  not tainted within 60 s: {', '.join(missing)}")
    every = [tainted[n] - hot[n] for n in tainted]
    print(f"  all: {percentiles(every)}")
    if replicas > 1:
        for where in ("leader", "follower"):
            print(
                f"  landing on the {where}: "
                f"{percentiles([tainted[n] - hot[n] for n in tainted if landing[n] == where])}"
            )
        print(f"  notifications handed over by the follower(s): {sum(forwards):.0f}")
    for index, mean in enumerate(handling):
        role = "leader" if index == leader else "follower"
        print(f"  mean webhook handling time on the {role}: {mean * 1000:.1f} ms")


def _counter(url: str, name: str, labels: str) -> float:
    """A counter's value in the exposition at `url`/metrics (0 when absent)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f"{name}{{{labels}}} " if labels else f"{name} "):
                return float(line.split()[1])
    return 0.0


def per_call(seconds: float, calls: int) -> str:
    return f"{seconds / calls * 1e6:.1f} µs"


async def breaker_function_cost(nodes: int, rounds: int) -> None:
    """The breaker alone: `nodes` selected, a tenth of them out (half waiting for a
    person), a full window of take-outs."""
    out_views = [
        NodeView(
            name=f"gpu-{i:05d}",
            uid="",
            resource_version="1",
            taints=(
                Taint(
                    key="fleetwatch.io/" + ("gpu-lost" if i % 2 else "gpu-overheat"),
                    value="x",
                    effect="NoSchedule",
                ),
            ),
            labels={},
            annotations={},
        )
        for i in range(nodes // 10)
    ]
    manual = frozenset({"gpu-lost"}).__contains__
    breaker = Breaker(policy=BreakerPolicy(max_new_taints=rounds + 1000, max_fraction=1.0))
    breaker.set_selected_nodes(nodes)
    for i in range(1000):  # a window already holding 1,000 take-outs
        await breaker.reserve(f"old-{i}", shares=True)
        breaker.commit(f"old-{i}", out=None)
        breaker.commit(f"old-{i}", out=True)
    start = time.perf_counter()
    breaker.observe({n.name: bool(node_out(n, manual=manual)) for n in out_views})
    observed = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(rounds):
        assert await breaker.reserve(f"new-{i}", shares=True) is None
        breaker.release(f"new-{i}")
    allowed = time.perf_counter() - start
    capped = Breaker(policy=BreakerPolicy(max_new_taints=0))
    capped.set_selected_nodes(nodes)
    start = time.perf_counter()
    for i in range(rounds):
        assert await capped.reserve(f"new-{i}", shares=True) is not None
    refused = time.perf_counter() - start
    print(
        f"breaker decision, function, {nodes} selected nodes, {len(out_views)} out, "
        f"1,000 take-outs in the window ({rounds} decisions each):"
    )
    print(f"  take-out allowed (reserve + release): {per_call(allowed, rounds)}")
    print(f"  take-out refused (reason and how to close it formatted): {per_call(refused, rounds)}")
    print(f"  classify the {len(out_views)} nodes out and observe them: {observed * 1000:.2f} ms")


def wait_for_repair(node: dict[str, Any]) -> None:
    """What fleetwatch wrote on a node that lost a GPU weeks ago."""
    node["spec"]["taints"] = [
        {"key": "fleetwatch.io/gpu-lost", "value": "GPUFallenOffBus", "effect": "NoSchedule"}
    ]
    node["metadata"]["labels"]["fleetwatch.io/tainted"] = "true"


async def breaker_controller_cost(nodes: int, alerts: int) -> None:
    """One notification for a node not yet out, through the controller and the real
    client against the fake API: allowed (node read, breaker, patch, Event) and refused
    (node read, breaker, Event once); and the live count a reconcile starts with."""
    async with fake_cluster(nodes) as (cluster, kube):
        for index in range(nodes // 10):
            cluster.mutate(f"gpu-{index:05d}", wait_for_repair)
        results = []
        for label, cap in (("allowed", 100_000), ("refused", 0)):
            controller = Controller(
                api=kube,
                breaker=Breaker(policy=BreakerPolicy(max_new_taints=cap, max_fraction=1.0)),
                evidence=NoEvidence(),
                alerts=None,
                metrics=TainterMetrics(),
                settings=ControllerSettings(node_selector="gpu=true"),
                policy=TaintPolicy(declared_reasons=shipped_reasons()),
            )
            start = time.perf_counter()
            await controller.prepare_to_lead()
            counted = time.perf_counter() - start
            latencies = []
            offset = 1000 if label == "refused" else nodes // 10
            for index in range(offset, offset + alerts):
                states = parse_webhook(json.loads(notification(f"gpu-{index:05d}")))
                sent = time.perf_counter()
                await controller.handle_alerts(states)
                latencies.append(time.perf_counter() - sent)
            results.append((label, latencies, counted))
        print(
            f"breaker decision, through the controller, fake API, {nodes} nodes, "
            f"{nodes // 10} out waiting for a person, {alerts} notifications each:"
        )
        for label, latencies, _ in results:
            print(f"  new node, take-out {label}: {percentiles(latencies)}")
        print(
            f"  live count before leading (list {nodes} + {nodes // 10} nodes, classify): "
            f"{results[0][2] * 1000:.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--cap", type=int, default=200)
    parser.add_argument("--senders", type=int, default=200)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--latency", action="store_true", help="measure alert-to-taint instead")
    parser.add_argument("--failover", action="store_true", help="measure leader failover")
    parser.add_argument(
        "--ha-latency",
        action="store_true",
        help="alert-to-taint over 24 alerts with --replicas tainters (2: landing on either)",
    )
    parser.add_argument("--missing-nodes", type=int, default=0, help="alerts for missing nodes")
    parser.add_argument("--breaker-cost", action="store_true", help="time breaker decisions")
    args = parser.parse_args()
    if args.breaker_cost:
        logging.getLogger("fleetwatch").setLevel(logging.CRITICAL)  # a refusal a line each
        print(
            f"machine: {platform.processor() or platform.machine()}, "
            f"python {platform.python_version()}"
        )
        asyncio.run(breaker_function_cost(args.nodes, rounds=20_000))
        asyncio.run(breaker_controller_cost(args.nodes, alerts=200))
    elif args.latency:
        latency()
    elif args.failover:
        failover()
    elif args.ha_latency:
        ha_latency(args.replicas)
    elif args.missing_nodes:
        asyncio.run(missing_nodes(args.missing_nodes))
    else:
        asyncio.run(storm(args.nodes, args.cap, args.senders, args.replicas))


if __name__ == "__main__":
    main()
