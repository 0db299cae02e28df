"""Leader election and the breaker's state on a Lease, against the fake API through the real
client: the fake's Lease semantics, one leader among candidates, takeover after expiry,
renew deadline, release, followers never write, and a breaker that outlives its leader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from fleetwatch.collectors.sim.kubeapi import FakeCluster, make_app, write_kubeconfig
from fleetwatch.tainter.breaker import BREAKER_ANNOTATION, BreakerRecord, BreakerStore
from fleetwatch.tainter.election import (
    LeaderElector,
    LeaderOnlyNodeApi,
    Leadership,
    NotLeader,
)
from fleetwatch.tainter.kube import ApiError, KubeNodeApi
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.server import make_app as make_tainter_app
from fleetwatch.tainter.service import breaker_reset_command, reset_breaker
from fleetwatch.tainter.settings import ElectionSettings

from testbed.servers import served_in_thread
from tests.tainter.conftest import ControllerFactory, alert, keys, webhook

LEASES = "/apis/coordination.k8s.io/v1/namespaces/fw/leases"
AUTH = {"Authorization": "Bearer kube-token"}
Client = TestClient[Any, Any]


def lease_body(holder: str, version: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "lock"}
    if version is not None:
        metadata["resourceVersion"] = version
    return {
        "metadata": metadata,
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": 0},
    }


async def test_fake_leases_have_real_semantics(kube_http: Client) -> None:
    created = await kube_http.post(LEASES, json=lease_body("a"), headers=AUTH)
    assert created.status == 201
    version = (await created.json())["metadata"]["resourceVersion"]
    again = await kube_http.post(LEASES, json=lease_body("b"), headers=AUTH)
    assert (again.status, (await again.json())["reason"]) == (409, "AlreadyExists")
    ok = await kube_http.put(f"{LEASES}/lock", json=lease_body("b", version), headers=AUTH)
    assert ok.status == 200
    stale = await kube_http.put(f"{LEASES}/lock", json=lease_body("c", version), headers=AUTH)
    assert (stale.status, (await stale.json())["reason"]) == (409, "Conflict")
    blind = await kube_http.put(f"{LEASES}/lock", json=lease_body("c"), headers=AUTH)
    assert blind.status == 409  # a replace must say which version it read
    bad = lease_body("c", (await ok.json())["metadata"]["resourceVersion"])
    bad["spec"]["leaseDurationSeconds"] = "15"
    assert (await kube_http.put(f"{LEASES}/lock", json=bad, headers=AUTH)).status == 422
    current = await (await kube_http.get(f"{LEASES}/lock", headers=AUTH)).json()
    assert current["spec"]["holderIdentity"] == "b"
    assert (await kube_http.get(f"{LEASES}/other", headers=AUTH)).status == 404
    patched = await kube_http.patch(
        f"{LEASES}/lock",
        data=json.dumps({"metadata": {"annotations": {"x": "1"}}}),
        headers={**AUTH, "Content-Type": "application/merge-patch+json"},
    )
    body = await patched.json()
    assert (patched.status, body["metadata"]["annotations"], body["spec"]["holderIdentity"]) == (
        200,
        {"x": "1"},
        "b",
    )


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


async def test_one_leader_takeover_after_expiry_and_release(
    kube: KubeNodeApi, cluster: FakeCluster
) -> None:
    clock = Clock()
    changes: list[tuple[str, bool]] = []
    first, first_is = candidate(kube, "a", clock, changes)
    second, second_is = candidate(kube, "b", clock, changes)
    for _ in range(3):
        await first.step()
        await second.step()
        clock.now += 2.0
    assert (first_is.is_leader, second_is.is_leader) == (True, False)
    lease = cluster.leases[("fw", "lock")]
    assert (lease["spec"]["holderIdentity"], lease["spec"]["leaseDurationSeconds"]) == ("a", 15)
    assert lease["spec"]["leaseTransitions"] == 0

    # "a" is killed: it never renews again. "b" waits out the lease duration on its own clock.
    clock.now += 12.0
    await second.step()
    assert not second_is.is_leader
    clock.now += 1.5
    await second.step()
    assert second_is.is_leader
    assert not first_is.is_leader  # its renew deadline passed long ago: it would not write
    lease = cluster.leases[("fw", "lock")]
    assert (lease["spec"]["holderIdentity"], lease["spec"]["leaseTransitions"]) == ("b", 1)
    assert lease["spec"]["acquireTime"] == lease["spec"]["renewTime"]
    assert changes == [("a", True), ("b", True)]

    await second.release()
    assert not second_is.is_leader
    assert cluster.leases[("fw", "lock")]["spec"].get("holderIdentity") is None
    await first.step()  # a released Lease is taken at once, no expiry wait
    assert first_is.is_leader


async def test_leader_that_cannot_renew_steps_down_within_the_renew_deadline(
    kube: KubeNodeApi, cluster: FakeCluster
) -> None:
    clock = Clock()
    changes: list[tuple[str, bool]] = []
    elector, leadership = candidate(kube, "a", clock, changes)
    await elector.step()
    assert leadership.is_leader
    cluster.faults.outage = True
    clock.now += 6.0
    with pytest.raises(ApiError, match="503"):
        await elector.step()
    assert leadership.is_leader  # 6 s without renew: still inside the 10 s deadline
    clock.now += 4.5
    with pytest.raises(ApiError, match="503"):
        await elector.step()
    assert not leadership.is_leader
    assert changes == [("a", True), ("a", False)]


async def test_a_follower_answers_503_and_closes_the_connection(
    make_controller: ControllerFactory, cluster: FakeCluster
) -> None:
    metrics = TainterMetrics()
    app = make_tainter_app(
        controller=make_controller(metrics=metrics),
        metrics=metrics,
        auth=None,
        max_body_bytes=1 << 16,
        leadership=Leadership(renew_deadline=10.0),  # never elected
    )
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        response = await client.post("/alerts", json=webhook(alert("gpu-1")))
        assert response.status == 503
        assert response.headers.get("Connection", "").lower() == "close"
        assert "not the leader" in (await response.json())["error"]
        assert (await client.get("/readyz")).status == 503
        exposition = await (await client.get("/metrics")).text()
        assert "fleetwatch_tainter_standby_webhook_requests_total 1.0" in exposition
        assert "fleetwatch_tainter_webhook_requests_total{" not in exposition  # no failure
        assert (await client.get("/healthz")).status == 200
    finally:
        await client.close()
    assert cluster.writers == []


async def test_followers_never_write(kube: KubeNodeApi, cluster: FakeCluster) -> None:
    follower = LeaderOnlyNodeApi(real=kube, leadership=Leadership(renew_deadline=10.0))
    node = await follower.get_node("gpu-1")  # reads are fine
    with pytest.raises(NotLeader):
        await follower.patch_node(
            "gpu-1", resource_version=node.resource_version, taints=[], labels={}, annotations={}
        )
    with pytest.raises(NotLeader):
        await follower.create_event(node=node, reason="TaintAdded", message="x", warning=False)
    assert cluster.writers == []


async def test_open_breaker_is_inherited_by_a_new_leader_and_reset_by_the_cli(
    make_controller: ControllerFactory,
    kube: KubeNodeApi,
    cluster: FakeCluster,
    tmp_path: Path,
) -> None:
    store = BreakerStore(api=kube, namespace="fw", name="lock")
    old = make_controller(max_nodes=1, breaker_store=store)
    await old.handle_alerts(parse_webhook(webhook(alert("gpu-1"), alert("gpu-2"))))
    assert old.breaker.open
    stored = json.loads(
        cluster.leases[("fw", "lock")]["metadata"]["annotations"][BREAKER_ANNOTATION]
    )
    assert stored["open"] is True

    new = make_controller(max_nodes=1, breaker_store=store)  # the next leader
    await new.prepare_to_lead()
    assert new.breaker.open
    await new.handle_alerts(parse_webhook(webhook(alert("gpu-3"))))
    assert keys(cluster, "gpu-3") == []

    before = await reset_breaker(store=store, who="operator")
    assert before is not None
    assert before.open
    await new.sync_breaker()
    assert not new.breaker.open
    assert new.wake.is_set()  # the reconcile runs now, on live state

    # hitting the cap again opens it again, and that is stored too
    await new.handle_alerts(parse_webhook(webhook(alert("gpu-3"))))
    assert new.breaker.open
    record = (await store.read())[1]
    assert record is not None
    assert record.open


async def test_a_deposed_leader_never_stores_the_breaker(
    kube: KubeNodeApi, cluster: FakeCluster
) -> None:
    deposed = Leadership(renew_deadline=10.0)  # never renewed: not the leader
    store = BreakerStore(api=kube, namespace="fw", name="lock", leadership=deposed)
    with pytest.raises(NotLeader):
        await store.write(BreakerRecord(open=False, changed_at="now", changed_by="old"))
    assert cluster.leases == {}


def test_breaker_reset_command_patches_the_lease(cluster: FakeCluster, tmp_path: Path) -> None:
    with served_in_thread(make_app(cluster)) as server:
        kubeconfig = write_kubeconfig(
            tmp_path / "operator.kubeconfig", server=server, token="kube-token"
        )
        assert breaker_reset_command(kubeconfig=kubeconfig, namespace="fw", name="lock") == 0
        record = json.loads(
            cluster.leases[("fw", "lock")]["metadata"]["annotations"][BREAKER_ANNOTATION]
        )
        assert record["open"] is False
        assert "fleetwatch breaker reset" in record["changedBy"]
        stranger = write_kubeconfig(
            tmp_path / "stranger.kubeconfig", server=server, token="not-a-user"
        )
        assert breaker_reset_command(kubeconfig=stranger, namespace="fw", name="lock") == 1
