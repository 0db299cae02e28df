"""Leader election and the breaker's state on a Lease, on a real Kubernetes API server
through the real client: one leader among candidates, takeover after expiry, release,
followers never write, a breaker that outlives its leader, and `fleetwatch breaker reset`
allowed or refused by RBAC. (A leader that cannot renew is in test_faults.py: an outage
is injected on the simulated API.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from fleetwatch.tainter.breaker import BREAKER_ANNOTATION, BreakerRecord, BreakerStore
from fleetwatch.tainter.election import (
    LeaderOnlyNodeApi,
    Leadership,
    NotLeader,
)
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.server import make_app as make_tainter_app
from fleetwatch.tainter.service import breaker_reset_command, reset_breaker

from testbed.kube import ADMIN, ApiServer
from tests.tainter.conftest import Clock, ControllerFactory, alert, candidate, keys, webhook
from tests.tainter.realkube import TESTER, RealCluster, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(real_cluster: RealCluster) -> RealCluster:
    return real_cluster


@pytest.fixture
def kube(real_kube: KubeNodeApi) -> KubeNodeApi:
    return real_kube


def lock(cluster: RealCluster) -> dict[str, Any]:
    lease = cluster.lease("fw", "lock")
    assert lease is not None, "no Lease fw/lock"
    return lease


async def test_one_leader_takeover_after_expiry_and_release(
    kube: KubeNodeApi, cluster: RealCluster
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
    lease = lock(cluster)
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
    lease = lock(cluster)
    assert (lease["spec"]["holderIdentity"], lease["spec"]["leaseTransitions"]) == ("b", 1)
    assert lease["spec"]["acquireTime"] == lease["spec"]["renewTime"]
    assert changes == [("a", True), ("b", True)]

    await second.release()
    assert not second_is.is_leader
    assert lock(cluster)["spec"].get("holderIdentity") is None
    await first.step()  # a released Lease is taken at once, no expiry wait
    assert first_is.is_leader


async def test_a_follower_answers_503_and_closes_the_connection(
    make_controller: ControllerFactory, cluster: RealCluster
) -> None:
    before = cluster.versions()
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
    assert cluster.versions() == before
    assert cluster.events_for("gpu-1", "TaintAdded") == []


async def test_followers_never_write(kube: KubeNodeApi, cluster: RealCluster) -> None:
    before = cluster.versions()
    follower = LeaderOnlyNodeApi(real=kube, leadership=Leadership(renew_deadline=10.0))
    node = await follower.get_node("gpu-1")  # reads are fine
    with pytest.raises(NotLeader):
        await follower.patch_node(
            "gpu-1", resource_version=node.resource_version, taints=[], labels={}, annotations={}
        )
    with pytest.raises(NotLeader):
        await follower.create_event(node=node, reason="TaintAdded", message="x", warning=False)
    assert cluster.versions() == before
    assert cluster.events_for("gpu-1", "TaintAdded") == []


async def test_open_breaker_is_inherited_by_a_new_leader_and_reset_by_the_cli(
    make_controller: ControllerFactory,
    kube: KubeNodeApi,
    cluster: RealCluster,
) -> None:
    store = BreakerStore(api=kube, namespace="fw", name="lock")
    old = make_controller(max_new_taints=1, breaker_store=store)
    await old.handle_alerts(parse_webhook(webhook(alert("gpu-1"), alert("gpu-2"))))
    assert old.breaker.open
    stored = json.loads(lock(cluster)["metadata"]["annotations"][BREAKER_ANNOTATION])
    assert stored["open"] is True

    new = make_controller(max_new_taints=1, breaker_store=store)  # the next leader
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

    # the reset restarted the rate count: gpu-3 is taken out; hitting the cap again opens
    # it again, and that is stored too, with the take-out
    await new.handle_alerts(parse_webhook(webhook(alert("gpu-3"))))
    assert keys(cluster, "gpu-3") == ["fleetwatch.io/gpu-overheat"]
    await new.handle_alerts(parse_webhook(webhook(alert("gpu-4"))))
    assert keys(cluster, "gpu-4") == []
    assert new.breaker.open
    record = (await store.read())[1]
    assert record is not None
    assert (record.open, record.cap) == (True, "new_taints")
    assert [t.node for t in record.taken_out] == ["gpu-3"]


async def test_a_deposed_leader_never_stores_the_breaker(
    kube: KubeNodeApi, cluster: RealCluster
) -> None:
    deposed = Leadership(renew_deadline=10.0)  # never renewed: not the leader
    store = BreakerStore(api=kube, namespace="fw", name="lock", leadership=deposed)
    with pytest.raises(NotLeader):
        await store.write(BreakerRecord(open=False, changed_at="now", changed_by="old"))
    assert cluster.lease("fw", "lock") is None


def test_breaker_reset_command_closes_the_breaker_if_rbac_allows(
    cluster: RealCluster, api_server: ApiServer
) -> None:
    tester = api_server.kubeconfig(TESTER)
    assert breaker_reset_command(kubeconfig=tester, namespace="fw", name="lock") == 1  # 403
    assert cluster.lease("fw", "lock") is None

    admin = api_server.kubeconfig(ADMIN)
    assert breaker_reset_command(kubeconfig=admin, namespace="fw", name="lock") == 0
    record = json.loads(lock(cluster)["metadata"]["annotations"][BREAKER_ANNOTATION])
    assert record["open"] is False
    assert "fleetwatch breaker reset" in record["changedBy"]

    # an operator role on that one Lease is all a person needs to reset it
    rbac = {"apiVersion": "rbac.authorization.k8s.io/v1"}
    api_server.apply(
        {
            **rbac,
            "kind": "Role",
            "metadata": {"name": "breaker-reset", "namespace": "fw"},
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": ["lock"],
                    "verbs": ["get", "patch"],
                }
            ],
        }
    )
    api_server.apply(
        {
            **rbac,
            "kind": "RoleBinding",
            "metadata": {"name": "breaker-reset", "namespace": "fw"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "breaker-reset",
            },
            "subjects": [
                {"kind": "Group", "name": TESTER.groups[0], "apiGroup": "rbac.authorization.k8s.io"}
            ],
        }
    )
    wait_for(
        lambda: api_server.allowed(
            TESTER,
            verb="patch",
            resource="leases",
            group="coordination.k8s.io",
            namespace="fw",
            name="lock",
        ),
        what="the RoleBinding to take effect",
    )
    reopened = BreakerRecord(open=True, changed_at="2025-01-01T00:00:00Z", changed_by="leader")
    api_server.call(
        "PATCH",
        "/apis/coordination.k8s.io/v1/namespaces/fw/leases/lock",
        {"metadata": {"annotations": {BREAKER_ANNOTATION: reopened.to_annotation()}}},
        content_type="application/merge-patch+json",
    )
    assert breaker_reset_command(kubeconfig=tester, namespace="fw", name="lock") == 0
    record = json.loads(lock(cluster)["metadata"]["annotations"][BREAKER_ANNOTATION])
    assert record["open"] is False
