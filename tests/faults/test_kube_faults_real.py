"""The tainter and the exporter's ResourceSlice watch against a real kube-apiserver behind the
fault-injecting proxy (`testbed.fault_proxy`): 429 with Retry-After, 500/503, connection
resets before and after the server applied a write, answers slower than the client's
deadline, a watch cut mid-stream and a 410 Gone that forces a relist.

Expected everywhere: no wrong write to a node, no taint lost or doubled, retries bounded and
spaced (never sooner than Retry-After), every fault counted in a metric and logged. One
server (etcd and kube-apiserver) and one proxy serve the whole module.
"""

from __future__ import annotations

import itertools
import logging
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from fleetwatch.collectors.sources.resourceslices import KubeAccess, ResourceSliceWatcher
from fleetwatch.sim.kubelet import resource_slice
from fleetwatch.sim.loopback_servers import wait_until
from fleetwatch.sim.scenario import load_scenario
from fleetwatch.tainter import writes
from fleetwatch.tainter.breaker import Breaker
from fleetwatch.tainter.controller import Controller
from fleetwatch.tainter.election import LeaderElector, Leadership
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.kube_objects import ApiError
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.server import make_app
from fleetwatch.tainter.settings import (
    BreakerPolicy,
    ControllerSettings,
    ElectionSettings,
    RetryPolicy,
)
from fleetwatch.tainter.taint_policy import TaintPolicy
from testbed.fault_proxy import Fault, FaultProxy, Seen
from testbed.kube_apiserver import ADMIN, ApiServer, MissingAssets, find_assets, write_kubeconfig
from testbed.kube_apiserver import api_server as start_api_server
from tests.tainter.conftest import FakeEvidence, alert, resolved, webhook
from tests.tainter.realkube import IDENTITIES, TESTER, RealCluster

pytestmark = pytest.mark.integration

FAST = RetryPolicy(attempts=5, base_delay=0.01, max_delay=0.05)
OURS = "fleetwatch.io/gpu-overheat"
NODE_PATCH = r"^/api/v1/nodes/gpu-1$"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """A real kube-apiserver and etcd for this module (skipped, saying why, without them)."""
    try:
        assets = find_assets()
    except MissingAssets as exc:
        pytest.skip(f"no real Kubernetes API server: {exc}")
    with start_api_server(
        tmp_path_factory.mktemp("kube-apiserver"), identities=IDENTITIES, assets=assets
    ) as started:
        yield started


@pytest.fixture(scope="module")
def proxied(server: ApiServer) -> Iterator[tuple[FaultProxy, str]]:
    """The fault proxy in front of the server, over TLS with the server's own certificate
    (so the clients' CA still holds); yields it and its URL."""
    upstream = ssl.create_default_context(cafile=str(server.ca_file))
    proxy = FaultProxy(upstream=server.url, upstream_ssl=upstream)
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    pki = server.workdir / "pki"
    serving.load_cert_chain(str(pki / "apiserver.crt"), str(pki / "apiserver.key"))
    with proxy.serve(ssl_context=serving) as url:
        yield proxy, url


@pytest.fixture
def proxy(proxied: tuple[FaultProxy, str], cluster: RealCluster) -> FaultProxy:
    """The proxy with no rules and nothing seen, for a test on fresh nodes."""
    proxied[0].clear()
    return proxied[0]


@pytest.fixture
def cluster(server: ApiServer) -> RealCluster:
    """Three fresh GPU nodes (gpu-0..2), no Events, no Leases in `fw`."""
    real = RealCluster(server)
    real.reset(nodes=3, lease_namespaces=("fw",))
    return real


def kubeconfig(server: ApiServer, url: str, folder: Path, identity: str = ADMIN.name) -> Path:
    """A kubeconfig for `identity` that reaches the server through the proxy."""
    return write_kubeconfig(
        folder / f"{identity}-via-proxy.json",
        url=url,
        ca=server.ca_file,
        token=server.tokens[identity],
    )


@pytest.fixture
async def api(
    server: ApiServer, proxied: tuple[FaultProxy, str], tmp_path: Path
) -> AsyncIterator[KubeNodeApi]:
    """The tainter's real client, through the proxy, with a 1.5 s deadline per call."""
    client = await KubeNodeApi.connect(
        kubeconfig=kubeconfig(server, proxied[1], tmp_path), timeout=1.5
    )
    yield client
    await client.close()


def controller(
    api: KubeNodeApi,
    metrics: TainterMetrics,
    *,
    evidence: FakeEvidence | None = None,
    retry: RetryPolicy = FAST,
    max_new_taints: int = 10,
) -> Controller:
    return Controller(
        api=api,
        breaker=Breaker(policy=BreakerPolicy(max_new_taints=max_new_taints, max_fraction=1.0)),
        evidence=evidence or FakeEvidence(),
        alerts=None,
        metrics=metrics,
        settings=ControllerSettings(hold_seconds=0.0, retry=retry),
        policy=TaintPolicy(declared_reasons=None),
    )


def ours(cluster: RealCluster, node: str) -> list[str]:
    """fleetwatch's taint keys on `node`, repeats included."""
    return [t["key"] for t in cluster.taints(node) if t["key"].startswith("fleetwatch.io/")]


def counted(metrics: TainterMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def retried(caplog: pytest.LogCaptureFixture, status: int) -> int:
    """How many `call retried` lines name `status`."""
    return sum(
        1
        for r in caplog.records
        if r.getMessage() == "call retried" and getattr(r, "status", None) == status
    )


def check_retry_after_honoured(patches: Sequence[Seen], *, throttled: int, seconds: float) -> None:
    """Each attempt after one answered 429 came no sooner than Retry-After asked."""
    assert len(patches) == throttled + 1, patches
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(patches)]
    assert all(gap >= seconds for gap in gaps), f"retried sooner than Retry-After: {gaps}"


async def test_429_with_retry_after_is_honoured_and_the_taint_written_once(
    api: KubeNodeApi,
    proxy: FaultProxy,
    cluster: RealCluster,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    proxy.add(Fault.answer(429, retry_after="1", method="PATCH", path=NODE_PATCH, times=2))
    metrics = TainterMetrics()
    outcome = await controller(api, metrics).handle_alerts(parse_webhook(webhook(alert("gpu-1"))))
    assert outcome.refused == []
    assert ours(cluster, "gpu-1") == [OURS]
    check_retry_after_honoured(proxy.seen("PATCH", NODE_PATCH), throttled=2, seconds=1.0)
    assert counted(metrics, "fleetwatch_tainter_api_errors_total", status="429") == 2
    assert retried(caplog, 429) == 2


async def test_the_retry_after_check_catches_a_retry_that_ignores_it(
    api: KubeNodeApi, proxy: FaultProxy, cluster: RealCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test of the test above: with a retry that ignores Retry-After (plain backoff, as
    the tainter had before), the same check fails."""
    monkeypatch.setattr(
        writes, "pause_before", lambda attempt, retry, error: retry.delay(attempt - 1)
    )
    proxy.add(Fault.answer(429, retry_after="1", method="PATCH", path=NODE_PATCH, times=2))
    await controller(api, TainterMetrics()).handle_alerts(parse_webhook(webhook(alert("gpu-1"))))
    assert ours(cluster, "gpu-1") == [OURS]
    with pytest.raises(AssertionError, match="sooner than Retry-After"):
        check_retry_after_honoured(proxy.seen("PATCH", NODE_PATCH), throttled=2, seconds=1.0)


async def test_a_retry_after_past_the_limit_fails_at_once_and_writes_nothing(
    api: KubeNodeApi, proxy: FaultProxy, cluster: RealCluster
) -> None:
    proxy.add(Fault.answer(503, retry_after="120", method="PATCH", path=NODE_PATCH, times=0))
    metrics = TainterMetrics()
    with pytest.raises(ApiError, match="503"):
        await controller(api, metrics).handle_alerts(parse_webhook(webhook(alert("gpu-1"))))
    assert len(proxy.seen("PATCH", NODE_PATCH)) == 1  # no hammering, no two-minute wait
    assert ours(cluster, "gpu-1") == []


async def test_500_and_503_are_retried_boundedly_and_write_once(
    api: KubeNodeApi, proxy: FaultProxy, cluster: RealCluster
) -> None:
    proxy.add(
        Fault.answer(500, method="PATCH", path=NODE_PATCH),
        Fault.answer(503, method="PATCH", path=NODE_PATCH),
    )
    metrics = TainterMetrics()
    await controller(api, metrics).handle_alerts(parse_webhook(webhook(alert("gpu-1"))))
    assert ours(cluster, "gpu-1") == [OURS]
    assert [s.status for s in proxy.seen("PATCH", NODE_PATCH)] == [500, 503, 200]
    assert counted(metrics, "fleetwatch_tainter_api_errors_total", status="500") == 1
    assert counted(metrics, "fleetwatch_tainter_api_errors_total", status="503") == 1
    # An outage longer than the retries: the attempts are bounded, nothing half-written.
    proxy.add(Fault.answer(503, method="PATCH", path=r"^/api/v1/nodes/gpu-2$", times=0))
    with pytest.raises(ApiError):
        await controller(api, metrics).handle_alerts(parse_webhook(webhook(alert("gpu-2"))))
    assert len(proxy.seen("PATCH", r"^/api/v1/nodes/gpu-2$")) == FAST.attempts
    assert ours(cluster, "gpu-2") == []


async def test_a_write_applied_but_its_answer_lost_is_not_doubled(
    api: KubeNodeApi, proxy: FaultProxy, cluster: RealCluster
) -> None:
    """The server applies the taint, then the connection resets: the retry re-reads the
    node, finds the taint and writes nothing more."""
    proxy.add(Fault.reset_after(method="PATCH", path=NODE_PATCH))
    metrics = TainterMetrics()
    await controller(api, metrics).handle_alerts(parse_webhook(webhook(alert("gpu-1"))))
    assert ours(cluster, "gpu-1") == [OURS]
    assert [s.fault for s in proxy.seen("PATCH", NODE_PATCH)] == ["reset_after"]
    assert counted(metrics, "fleetwatch_tainter_api_errors_total", status="0") == 1


async def test_a_reset_and_a_slow_answer_are_retried(
    api: KubeNodeApi, proxy: FaultProxy, cluster: RealCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A read slower than the client's deadline and a write whose connection resets before
    it reached the server: each retried once, counted (status 0) and logged. (aiohttp
    itself repeats an idempotent GET once on a reset keep-alive connection, so the reset
    is injected on the PATCH, which it never repeats.)"""
    caplog.set_level(logging.INFO)
    proxy.add(
        Fault.delay(2.5, method="GET", path=NODE_PATCH),  # past the client's 1.5 s deadline
        Fault.reset(method="PATCH", path=NODE_PATCH),
    )
    metrics = TainterMetrics()
    await controller(api, metrics).handle_alerts(parse_webhook(webhook(alert("gpu-1"))))
    assert ours(cluster, "gpu-1") == [OURS]
    assert [s.fault for s in proxy.seen("PATCH", NODE_PATCH)] == ["reset", None]
    assert [s.fault for s in proxy.seen("GET", NODE_PATCH)] == ["delay", None, None]
    assert counted(metrics, "fleetwatch_tainter_api_errors_total", status="0") == 2
    assert retried(caplog, 0) == 2


async def test_an_untaint_through_faults_keeps_everyone_elses_taint(
    api: KubeNodeApi, proxy: FaultProxy, cluster: RealCluster
) -> None:
    evidence = FakeEvidence()
    metrics = TainterMetrics()
    control = controller(api, metrics, evidence=evidence)
    await control.handle_alerts(parse_webhook(webhook(alert("gpu-1"))))
    cluster.mutate(
        "gpu-1",
        lambda node: node["spec"]["taints"].append(
            {"key": "example.com/maintenance", "value": "alice", "effect": "NoSchedule"}
        ),
    )
    await control.handle_alerts(parse_webhook(webhook(resolved("gpu-1"))))
    assert ours(cluster, "gpu-1") == [OURS]  # no evidence yet: kept
    evidence.clear["gpu-1"] = True
    proxy.add(
        Fault.answer(503, method="PATCH", path=NODE_PATCH),
        Fault.reset_after(method="PATCH", path=NODE_PATCH),
    )
    await control.reconcile()
    assert ours(cluster, "gpu-1") == []
    assert [t["key"] for t in cluster.taints("gpu-1")] == ["example.com/maintenance"]
    assert [s.fault for s in proxy.seen("PATCH", NODE_PATCH)][-2:] == ["answer", "reset_after"]


async def test_the_lease_through_faults_has_one_holder(
    server: ApiServer, proxied: tuple[FaultProxy, str], proxy: FaultProxy, tmp_path: Path
) -> None:
    """The Lease is created but the answer lost, then renewals meet a 503: the replica
    that created it leads after its next step; the other never does."""
    leases = r"/apis/coordination.k8s.io/v1/namespaces/fw/leases"
    proxy.add(Fault.reset_after(method="POST", path=leases))
    clients = [
        await KubeNodeApi.connect(kubeconfig=kubeconfig(server, proxied[1], tmp_path), timeout=2)
        for _ in range(2)
    ]
    try:
        electors, leaderships = [], []
        for identity, client in zip(("a", "b"), clients, strict=True):
            leadership = Leadership(renew_deadline=10.0)
            settings = ElectionSettings(
                namespace="fw",
                name="faults",
                identity=identity,
                lease_duration=15.0,
                renew_deadline=10.0,
                retry_period=1.0,
            )

            async def elected() -> None:
                return None

            electors.append(
                LeaderElector(
                    api=client,
                    settings=settings,
                    leadership=leadership,
                    on_elected=elected,
                    on_change=lambda _: None,
                )
            )
            leaderships.append(leadership)
        with pytest.raises(ApiError):
            await electors[0].step()  # created, but it never heard so
        assert not leaderships[0].is_leader
        await electors[1].step()  # sees a's live Lease
        assert not leaderships[1].is_leader
        proxy.add(Fault.answer(503, method="PUT", path=leases))
        with pytest.raises(ApiError, match="503"):
            await electors[0].step()
        await electors[0].step()
        await electors[1].step()
        assert [lead.is_leader for lead in leaderships] == [True, False]
        holder = server.call("GET", f"{leases}/faults")["spec"]["holderIdentity"]
        assert holder == "a"
    finally:
        for client in clients:
            await client.close()


async def test_every_answer_of_the_webhook_on_kubernetes(
    server: ApiServer, proxied: tuple[FaultProxy, str], proxy: FaultProxy, tmp_path: Path
) -> None:
    """200 applied; 200 left alone (the policy, the breaker), counted apart; 503 naming the
    Kubernetes API when a retry can fix it; 422 when the API server denies the write."""
    admin = await KubeNodeApi.connect(
        kubeconfig=kubeconfig(server, proxied[1], tmp_path), timeout=1.5
    )
    denied = await KubeNodeApi.connect(
        kubeconfig=kubeconfig(server, proxied[1], tmp_path, TESTER.name), timeout=1.5
    )
    answers: list[tuple[int, dict[str, Any]]] = []
    metrics = TainterMetrics()

    async def deliver(api: KubeNodeApi, *bodies: dict[str, Any]) -> None:
        """Post each body to one webhook app whose breaker takes out one node at most."""
        app = make_app(
            controller=controller(api, metrics, max_new_taints=1),
            metrics=metrics,
            auth=None,
            max_body_bytes=1 << 20,
        )
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            for body in bodies:
                response = await client.post("/alerts", json=body)
                answers.append((response.status, await response.json()))

    try:
        await deliver(
            admin,
            webhook(alert("gpu-0")),
            webhook(alert("gpu-1", effect="NoExecute")),
            webhook(alert("gpu-1")),  # the breaker's rate cap: one node
        )
        proxy.add(Fault.answer(503, path=r"^/api/v1/nodes", times=0))
        await deliver(admin, webhook(alert("gpu-2")))  # the API server fails throughout
        proxy.clear()
        await deliver(denied, webhook(alert("gpu-2")))  # no RBAC: denied
    finally:
        await admin.close()
        await denied.close()
    assert [status for status, _ in answers] == [200, 200, 200, 503, 422]
    assert answers[0][1] == {"status": "ok", "alerts": 1}
    assert [r["why"] for r in answers[1][1]["left_alone"]] == ["noexecute"]
    assert [r["why"] for r in answers[2][1]["left_alone"]] == ["breaker_new_taints"]
    assert answers[3][1]["error"].startswith("the Kubernetes API failed, retry later: ")
    assert "denied the write" in answers[4][1]["error"]
    assert "Slurm" not in str(answers)
    results = {
        r: counted(metrics, "fleetwatch_tainter_webhook_requests_total", result=r)
        for r in ("ok", "left_alone", "api_error", "api_denied")
    }
    assert results == {"ok": 1, "left_alone": 2, "api_error": 1, "api_denied": 1}


def slices_named(watcher: ResourceSliceWatcher) -> set[str]:
    return {device.uuid for device in watcher.devices().values()}


def test_the_resourceslice_watch_relists_on_410_and_reconnects_after_a_cut(
    server: ApiServer,
    proxied: tuple[FaultProxy, str],
    proxy: FaultProxy,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The relist on 410 Gone against a real server: the watcher lists again and keeps
    every slice, one created while it was relisting included; a watch cut mid-stream
    reconnects and misses nothing."""
    caplog.set_level(logging.INFO)
    scenario = load_scenario("dgx-h100")
    slices = "/apis/resource.k8s.io/v1/resourceslices"
    server.call("DELETE", slices)
    server.call("POST", slices, resource_slice(scenario, "gpu-0", ["GPU-first"]))
    watches = r"resourceslices\?.*watch=1"
    proxy.add(  # the first watch is Gone; the second is cut after its first event
        Fault.watch_gone(method="GET", path=watches),
        Fault.cut_watch(after_events=1, method="GET", path=watches),
    )
    watcher = ResourceSliceWatcher(
        access=KubeAccess.from_kubeconfig(kubeconfig(server, proxied[1], tmp_path)),
        node="gpu-0",
        mode="on",
    )
    watcher.start()
    try:
        wait_until(lambda: watcher.lists >= 2, timeout=20, what="a relist after 410 Gone")
        assert slices_named(watcher) == {"GPU-first"}
        second = resource_slice(scenario, "gpu-0", ["GPU-second"])
        second["metadata"]["name"] = second["spec"]["pool"]["name"] = "gpu-0-second"
        cut_at = server.call("POST", slices, second)["metadata"]["resourceVersion"]
        wait_until(
            lambda: slices_named(watcher) == {"GPU-first", "GPU-second"},
            timeout=20,
            what="the second slice seen",
        )
        server.call("DELETE", f"{slices}/gpu-0-second")
        started = time.monotonic()
        wait_until(
            lambda: slices_named(watcher) == {"GPU-first"},
            timeout=20,
            what="the deletion seen after the cut",
        )
        assert time.monotonic() - started < 20
    finally:
        watcher.close()
    faults = [s.fault for s in proxy.seen("GET", watches)]
    assert faults[:2] == ["watch_gone", "cut_watch"]
    # Listed twice: at start and after the 410. After the cut it resumes the watch from the
    # last resourceVersion it applied, which loses nothing and needs no list.
    assert watcher.lists == 2
    resumed = [s.target for s in proxy.seen("GET", watches)][2]
    assert f"resourceVersion={cut_at}&" in resumed
