"""Fixtures for the tainter: a real Kubernetes API server per test module (`api_server`,
`real_cluster`, `real_kube`), the simulated API for faults a real server cannot produce on
demand (`cluster`, `kube`), fake evidence and alert sources, and builders for the
controller and the webhook app. A module that runs on the real server overrides `cluster`
and `kube` with the real ones, so the builders below use whichever the module chose."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from fleetwatch.sim.kubeapi import FakeCluster, make_app, write_kubeconfig
from fleetwatch.tainter.after_sync import AfterSync
from fleetwatch.tainter.auth import TokenFile
from fleetwatch.tainter.breaker import Breaker, BreakerStore
from fleetwatch.tainter.controller import Controller
from fleetwatch.tainter.election import LeaderElector, Leadership
from fleetwatch.tainter.kube import KubeNodeApi, NodeApi
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import AlertState
from fleetwatch.tainter.server import make_app as make_tainter_app
from fleetwatch.tainter.settings import (
    BreakerPolicy,
    ControllerSettings,
    ElectionSettings,
    RetryPolicy,
)
from fleetwatch.tainter.sources import AlertSource, EvidenceResult, EvidenceSource
from fleetwatch.tainter.taint_policy import TaintPolicy
from testbed.kube_apiserver import ADMIN, ApiServer, MissingAssets, find_assets
from testbed.kube_apiserver import api_server as start_api_server
from tests.tainter.realkube import IDENTITIES, RealCluster

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
Client = TestClient[Any, Any]
T0 = datetime(2025, 1, 1, tzinfo=UTC)


@dataclass
class FakeEvidence:
    """EvidenceSource whose answer per node the test sets; records what was asked."""

    clear: dict[str, bool] = field(default_factory=dict)
    reasons: frozenset[str] = frozenset({"gpu-overheat"})
    asked: list[str] = field(default_factory=list)

    def has_query(self, reason: str) -> bool:
        return reason in self.reasons

    async def condition_clear(self, *, node: str, reason: str) -> EvidenceResult:
        self.asked.append(node)
        ok = self.clear.get(node, False)
        return EvidenceResult(clear=ok, detail="fake evidence")


@dataclass
class FakeAlerts:
    """AlertSource serving a list the test controls."""

    firing: list[AlertState] = field(default_factory=list)

    async def firing_alerts(self) -> list[AlertState]:
        return list(self.firing)


def alert(
    node: str,
    *,
    reason: str = "gpu-overheat",
    status: str = "firing",
    fp: str | None = None,
    starts: datetime = T0,
    ends: datetime | None = None,
    alertname: str = "GPUOverheating",
    effect: str | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One alert as Alertmanager puts it in a webhook body."""
    labels = {
        "alertname": alertname,
        "node": node,
        "gpu": "3",
        "fleetwatch_taint": reason,
        **(extra or {}),
    }
    if effect:
        labels["fleetwatch_taint_effect"] = effect
    return {
        "status": status,
        "labels": labels,
        "annotations": {"summary": "hot"},
        "startsAt": starts.isoformat().replace("+00:00", "Z"),
        "endsAt": (ends or datetime(1, 1, 1, tzinfo=UTC)).isoformat().replace("+00:00", "Z"),
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fp or f"fp-{node}-{reason}",
    }


def resolved(node: str, **kwargs: Any) -> dict[str, Any]:
    """The resolve of `alert(node, ...)`, ending a minute after it started."""
    return alert(
        node, status="resolved", ends=kwargs.pop("ends", T0 + timedelta(minutes=1)), **kwargs
    )


def xid_alert(node: str, xid: str, n: int) -> dict[str, Any]:
    """The n-th GPUXidCritical for Xid `xid` on `node`: a new alert instance each time (the
    repair tests: tests/tainter/test_repair_kube_real.py, tests/slurm/test_repair_real.py)."""
    return alert(
        node,
        reason="xid-critical",
        alertname="GPUXidCritical",
        fp=f"{node}-xid-{xid}-{n}",
        starts=T0 + timedelta(hours=n),
        extra={"xid": xid},
    )


def webhook(*alerts: dict[str, Any]) -> dict[str, Any]:
    """A version 4 webhook body carrying `alerts`."""
    return {
        "version": "4",
        "groupKey": '{}:{alertname="GPUOverheating"}',
        "truncatedAlerts": 0,
        "status": "firing" if any(a["status"] == "firing" for a in alerts) else "resolved",
        "receiver": "fleetwatch-tainter",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager",
        "alerts": list(alerts),
        "notification_reason": "new_alerts",
    }


async def post(client: Client, body: Any, headers: dict[str, str] | None = None) -> Any:
    """POST a webhook body (a dict, or raw bytes) to /alerts; the status and decoded JSON."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await client.post("/alerts", data=data, headers=AUTH if headers is None else headers)
    return response.status, await response.json()


@pytest.fixture
def cluster() -> FakeCluster:
    fake = FakeCluster(token="kube-token")
    for index in range(10):
        fake.add_node(f"gpu-{index}", labels={"nvidia.com/gpu.present": "true"})
    return fake


@pytest.fixture
async def kube_http(cluster: FakeCluster) -> AsyncIterator[Client]:
    """A plain HTTP client of the fake API (token `kube-token`)."""
    client = TestClient(TestServer(make_app(cluster), host="127.0.0.1"))
    await client.start_server()
    yield client
    await client.close()


@pytest.fixture
async def kube(cluster: FakeCluster, tmp_path: Path) -> AsyncIterator[KubeNodeApi]:
    """The real kubernetes_asyncio client, configured by a generated kubeconfig."""
    server = TestServer(make_app(cluster), host="127.0.0.1")
    await server.start_server()
    path = write_kubeconfig(
        tmp_path / "kubeconfig", server=str(server.make_url("")).rstrip("/"), token="kube-token"
    )
    api = await KubeNodeApi.connect(kubeconfig=path, timeout=5.0)
    yield api
    await api.close()
    await server.close()


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """A real kube-apiserver and etcd for this test module (skipped, saying why, when
    KUBEBUILDER_ASSETS or etcd is missing)."""
    try:
        assets = find_assets()
    except MissingAssets as exc:
        pytest.skip(f"no real Kubernetes API server: {exc}")
    workdir = tmp_path_factory.mktemp("kube-apiserver")
    with start_api_server(workdir, identities=IDENTITIES, assets=assets) as server:
        yield server


@pytest.fixture
def real_cluster(api_server: ApiServer) -> RealCluster:
    """The real server with ten fresh GPU nodes, no Events and no Leases in `fw`."""
    cluster = RealCluster(api_server)
    cluster.reset(lease_namespaces=("fw",))
    return cluster


@pytest.fixture
async def real_kube(api_server: ApiServer, real_cluster: RealCluster) -> AsyncIterator[KubeNodeApi]:
    """The tainter's real client, as admin, on the real server."""
    api = await KubeNodeApi.connect(kubeconfig=api_server.kubeconfig(ADMIN), timeout=10.0)
    yield api
    await api.close()


@pytest.fixture
def evidence() -> FakeEvidence:
    return FakeEvidence()


@pytest.fixture
def alerts_source() -> FakeAlerts:
    return FakeAlerts()


ControllerFactory = Callable[..., Controller]


@pytest.fixture
def make_controller(
    kube: KubeNodeApi,
    evidence: FakeEvidence,
    alerts_source: FakeAlerts,
) -> ControllerFactory:
    """Build a controller on the fake API; keyword overrides for settings and policy."""

    def build(
        *,
        api: NodeApi | None = None,
        max_new_taints: int = 100,
        window: float = 3600.0,
        max_fraction: float = 1.0,
        auto_close: bool = False,
        clock: Callable[[], float] = time.time,
        metrics: TainterMetrics | None = None,
        policy: TaintPolicy | None = None,
        breaker_store: BreakerStore | None = None,
        evidence_source: EvidenceSource | None = None,
        alert_source: AlertSource | None = None,
        after_sync: Sequence[AfterSync] = (),
        **settings: Any,
    ) -> Controller:
        settings.setdefault("hold_seconds", 0.0)
        settings.setdefault("retry", RetryPolicy(attempts=6, base_delay=0.001, max_delay=0.01))
        return Controller(
            api=api or kube,
            breaker=Breaker(
                policy=BreakerPolicy(
                    max_new_taints=max_new_taints,
                    window=window,
                    max_fraction=max_fraction,
                    auto_close=auto_close,
                ),
                clock=clock,
            ),
            evidence=evidence_source or evidence,
            alerts=alert_source or alerts_source,
            metrics=metrics or TainterMetrics(),
            settings=ControllerSettings(**settings),
            policy=policy or TaintPolicy(declared_reasons=None),
            breaker_store=breaker_store,
            after_sync=after_sync,
        )

    return build


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    """A webhook token file holding TOKEN."""
    path = tmp_path / "webhook-token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture
def webhook_policy() -> TaintPolicy:
    """The policy of `tainter_client`: the shipped defaults with the test's reasons."""
    return TaintPolicy(declared_reasons=frozenset({"gpu-overheat", "xid", "gpu-lost"}))


@pytest.fixture
async def tainter_client(
    make_controller: ControllerFactory, token_file: Path, webhook_policy: TaintPolicy
) -> AsyncIterator[TestClient[Any, Any]]:
    """The webhook app (token TOKEN, 64 KiB body cap) around a default controller."""
    metrics = TainterMetrics()
    app = make_tainter_app(
        controller=make_controller(metrics=metrics, policy=webhook_policy),
        metrics=metrics,
        auth=TokenFile(token_file, overlap=60.0, metrics=metrics),
        max_body_bytes=64 * 1024,
    )
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    yield client
    await client.close()


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def candidate(
    kube: KubeNodeApi, identity: str, clock: Clock, changes: list[tuple[str, bool]]
) -> tuple[LeaderElector, Leadership]:
    settings = ElectionSettings(
        namespace="fw",
        name="lock",
        identity=identity,
        lease_duration=15.0,
        renew_deadline=10.0,
        retry_period=2.0,
    )
    leadership = Leadership(renew_deadline=settings.renew_deadline, clock=clock)

    async def on_elected() -> None:
        return None

    elector = LeaderElector(
        api=kube,
        settings=settings,
        leadership=leadership,
        on_elected=on_elected,
        on_change=lambda leader: changes.append((identity, leader)),
        clock=clock,
    )
    return elector, leadership


def keys(cluster: FakeCluster | RealCluster, node: str) -> list[str]:
    """Taint keys on `node`, in order."""
    return [t["key"] for t in cluster.taints(node)]
