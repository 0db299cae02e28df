"""Leader election and the breaker's state on a Lease, on a real Kubernetes API server
through the real client: one leader among candidates, takeover after expiry, release,
followers never write, a breaker that outlives its leader, and `fleetwatch breaker reset`
allowed or refused by RBAC. (A leader that cannot renew is in test_faults.py: an outage
is injected on the simulated API.)"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from fleetwatch.tainter.auth import TokenFile
from fleetwatch.tainter.breaker import BREAKER_ANNOTATION, BreakerRecord, BreakerStore
from fleetwatch.tainter.election import (
    LEADER_URL_ANNOTATION,
    LeaderElector,
    LeaderOnlyNodeApi,
    Leadership,
    NotLeader,
)
from fleetwatch.tainter.forward import FORWARDED_HEADER, Forwarder
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.server import make_app as make_tainter_app
from fleetwatch.tainter.service import breaker_reset_command, reset_breaker
from fleetwatch.tainter.settings import ElectionSettings
from fleetwatch.tainter.taint_policy import TaintPolicy
from testbed.kube_apiserver import ADMIN, ApiServer
from tests.tainter.conftest import (
    AUTH,
    Clock,
    ControllerFactory,
    alert,
    candidate,
    keys,
    webhook,
)
from tests.tainter.realkube import TESTER, RealCluster, wait_for

pytestmark = pytest.mark.integration
FORWARDS = "fleetwatch_tainter_webhook_forwards_total"


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


@dataclass
class Member:
    """One replica on the real API server: its elector, app, server and metrics."""

    elector: LeaderElector
    leadership: Leadership
    metrics: TainterMetrics
    server: TestServer
    url: str

    def counted(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


async def start_member(
    identity: str,
    *,
    kube: KubeNodeApi,
    make_controller: ControllerFactory,
    token_file: Path,
    session: aiohttp.ClientSession,
    clock: Clock,
) -> Member:
    """A replica serving on loopback that advertises its own URL on the Lease `fw/lock`."""
    leadership = Leadership(renew_deadline=10.0, clock=clock)
    metrics = TainterMetrics()
    app = make_tainter_app(
        controller=make_controller(
            api=LeaderOnlyNodeApi(real=kube, leadership=leadership),
            metrics=metrics,
            policy=TaintPolicy(declared_reasons=frozenset({"gpu-overheat"})),
        ),
        metrics=metrics,
        auth=TokenFile(token_file, overlap=60.0, metrics=metrics),
        max_body_bytes=1 << 16,
        leadership=leadership,
        forwarder=Forwarder(session=session, identity=identity, timeout=2.0),
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")

    async def on_elected() -> None:
        return None

    elector = LeaderElector(
        api=kube,
        settings=ElectionSettings(
            namespace="fw",
            name="lock",
            identity=identity,
            advertise_url=url,
        ),
        leadership=leadership,
        on_elected=on_elected,
        on_change=lambda leader: None,
        clock=clock,
    )
    return Member(elector=elector, leadership=leadership, metrics=metrics, server=server, url=url)


async def deliver(
    session: aiohttp.ClientSession, member: Member, body: Any, **headers: str
) -> tuple[int, Any]:
    """POST a webhook body to a replica as Alertmanager does: status and JSON answer."""
    async with session.post(f"{member.url}/alerts", json=body, headers={**AUTH, **headers}) as r:
        return r.status, await r.json()


async def test_a_follower_hands_notifications_to_the_leader_named_by_the_lease(
    make_controller: ControllerFactory, kube: KubeNodeApi, cluster: RealCluster, token_file: Path
) -> None:
    clock = Clock()
    async with aiohttp.ClientSession() as session:
        start = functools.partial(
            start_member,
            kube=kube,
            make_controller=make_controller,
            token_file=token_file,
            session=session,
            clock=clock,
        )
        leader, follower = await start("a"), await start("b")
        try:
            await leader.elector.step()
            await follower.elector.step()
            assert (leader.leadership.is_leader, follower.leadership.is_leader) == (True, False)
            annotations = lock(cluster)["metadata"]["annotations"]
            assert annotations[LEADER_URL_ANNOTATION] == leader.url
            assert follower.leadership.leader_url == leader.url

            # Applied by the leader, answered with the leader's answer.
            status, answer = await deliver(session, follower, webhook(alert("gpu-1")))
            assert (status, answer) == (200, {"status": "ok", "alerts": 1})
            assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]
            assert leader.counted("fleetwatch_tainter_webhook_requests_total", result="ok") == 1
            assert follower.counted(FORWARDS, result="delivered") == 1
            assert follower.counted("fleetwatch_tainter_webhook_requests_total", result="ok") == 0

            # The leader's refusal comes back as it is, with its reasons.
            status, answer = await deliver(
                session, follower, webhook(alert("gpu-2", effect="NoExecute"))
            )
            assert status == 200
            assert [r["node"] for r in answer["left_alone"]] == ["gpu-2"]
            assert follower.counted(FORWARDS, result="delivered") == 2
            # A bad token never reaches the leader.
            status, _ = await deliver(
                session, follower, webhook(alert("gpu-3")), Authorization="Bearer wrong"
            )
            assert status == 401
            assert leader.counted("fleetwatch_tainter_webhook_requests_total", result="ok") == 1

            # A request handed over already is not handed on again.
            status, answer = await deliver(
                session, follower, webhook(alert("gpu-3")), **{FORWARDED_HEADER: "c"}
            )
            assert status == 503
            assert "handed over already" in answer["error"]
            assert keys(cluster, "gpu-3") == []
            assert follower.counted("fleetwatch_tainter_standby_webhook_requests_total") == 1

            # The leader's process is gone but its Lease is live: 503, counted, bounded.
            await leader.server.close()
            status, answer = await deliver(session, follower, webhook(alert("gpu-3")))
            assert status == 503
            assert leader.url in answer["error"]
            assert follower.counted(FORWARDS, result="unreachable") == 1

            # Its Lease runs out: the follower leads and applies directly.
            clock.now += 16.0
            await follower.elector.step()
            await follower.elector.step()
            assert follower.leadership.is_leader
            assert lock(cluster)["metadata"]["annotations"][LEADER_URL_ANNOTATION] == follower.url
            status, answer = await deliver(session, follower, webhook(alert("gpu-3")))
            assert (status, answer) == (200, {"status": "ok", "alerts": 1})
            assert keys(cluster, "gpu-3") == ["fleetwatch.io/gpu-overheat"]
            assert follower.counted("fleetwatch_tainter_webhook_requests_total", result="ok") == 1
        finally:
            await leader.server.close()
            await follower.server.close()


async def test_no_leader_to_hand_it_to_answers_503(
    make_controller: ControllerFactory, kube: KubeNodeApi, cluster: RealCluster, token_file: Path
) -> None:
    clock = Clock()
    async with aiohttp.ClientSession() as session:
        start = functools.partial(
            start_member,
            kube=kube,
            make_controller=make_controller,
            token_file=token_file,
            session=session,
            clock=clock,
        )
        follower = await start("b")
        leader: Member | None = None
        try:
            # Nothing read yet, then a holder that advertises no URL (an older release
            # during a rolling update): 503, counted as standby, nothing written.
            status, answer = await deliver(session, follower, webhook(alert("gpu-1")))
            assert (status, "no leader is known" in answer["error"]) == (503, True)
            old, _ = candidate(kube, "old", clock, [])
            await old.step()
            await follower.elector.step()
            assert follower.leadership.leader_url is None
            status, _ = await deliver(session, follower, webhook(alert("gpu-1")))
            assert status == 503
            assert follower.counted("fleetwatch_tainter_standby_webhook_requests_total") == 2

            # A leader that advertises itself; its URL goes when it releases the Lease.
            await old.release()
            leader = await start("a")
            await leader.elector.step()
            await follower.elector.step()
            assert follower.leadership.leader_url == leader.url
            clock.now += 16.0  # unrenewed for a lease duration: no longer trusted as leader
            assert follower.leadership.leader_url is None
            await leader.elector.step()
            await follower.elector.step()
            assert follower.leadership.leader_url == leader.url
            await leader.elector.release()
            assert LEADER_URL_ANNOTATION not in lock(cluster)["metadata"].get("annotations", {})
            # Before the follower reads the Lease again, the replica it knew answers 503
            # itself (it no longer leads), and that answer comes back as it is.
            status, _ = await deliver(session, follower, webhook(alert("gpu-1")))
            assert status == 503
            assert follower.counted(FORWARDS, result="leader_error") == 1
            assert leader.counted("fleetwatch_tainter_standby_webhook_requests_total") == 1
        finally:
            await follower.server.close()
            if leader is not None:
                await leader.server.close()
        assert keys(cluster, "gpu-1") == []
