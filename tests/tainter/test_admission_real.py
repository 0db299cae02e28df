"""The chart's ValidatingAdmissionPolicy, evaluated by a real API server: as the tainter's
ServiceAccount, a patch that adds or removes a fleetwatch.io/ taint passes, and one that
changes another taint, cordons, or touches labels or annotations outside fleetwatch.io/ is
denied with the chart's message; on nodes/status only the GPUHealthy condition may change;
an eviction may not shorten the pod's grace period; the tainter's own guarded writes (a
quarantine's label and taint history included) pass; people are not bound by it. The chart
is rendered with every feature on."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetwatch.tainter.condition import ConditionKeeper
from fleetwatch.tainter.election import Leadership
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.kube_objects import ApiError, NodeView, Taint
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.quarantine import HISTORY_ANNOTATION as HISTORY
from fleetwatch.tainter.quarantine import QUARANTINE_LABEL, History
from fleetwatch.tainter.settings import NodeConditionSettings, RetryPolicy
from fleetwatch.tainter.writes import Change, guarded_update
from testbed.kube_apiserver import ADMIN, ApiServer
from tests.deploy import fakekube
from tests.deploy.chart import Release, install
from tests.tainter.conftest import ControllerFactory, alert, keys, webhook
from tests.tainter.realkube import (
    ALL_FEATURES,
    POLICY_KINDS,
    RBAC_KINDS,
    TAINTER,
    RealCluster,
    apply_release,
    wait_for,
)

pytestmark = pytest.mark.integration

MERGE = "application/merge-patch+json"
FOREIGN = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def policy(api_server: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The chart's RBAC and admission policy (default values), applied and in effect."""
    path = tmp_path_factory.mktemp("helm") / "kubeconfig.json"
    with fakekube.serve(fakekube.FakeKubeApi(), path) as kubeconfig:
        release = install(kubeconfig, ALL_FEATURES)
    assert release.of_kind("ValidatingAdmissionPolicy"), "the chart renders no policy"
    apply_release(api_server, release, RBAC_KINDS + POLICY_KINDS)
    probe = RealCluster(api_server)
    probe.reset(nodes=1)

    def label_denied() -> bool:
        # a new value each try: a write allowed before the policy is in effect must not
        # turn the next try into a no-op, which the policy rightly lets through
        change = {"metadata": {"labels": {"probe": str(time.monotonic_ns())}}}
        return patch_as_tainter(api_server, "gpu-0", change)[0] != 200

    wait_for(label_denied, what="the admission policy to take effect")
    return release


def patch_as_tainter(server: ApiServer, node: str, body: Any) -> tuple[int, Any]:
    return server.request(
        "PATCH", f"/api/v1/nodes/{node}", body, identity=TAINTER, content_type=MERGE
    )


@pytest.fixture
def cluster(policy: Release, real_cluster: RealCluster) -> RealCluster:
    """Ten fresh nodes; gpu-1 carries someone else's taint."""
    real_cluster.mutate("gpu-1", lambda n: n["spec"].update(taints=[FOREIGN]))
    return real_cluster


@pytest.fixture
async def kube(api_server: ApiServer, cluster: RealCluster) -> AsyncIterator[KubeNodeApi]:
    """The tainter's real client with the tainter's own identity."""
    api = await KubeNodeApi.connect(kubeconfig=api_server.kubeconfig(TAINTER), timeout=10.0)
    yield api
    await api.close()


def ours(reason: str = "gpu-overheat") -> dict[str, str]:
    return {"key": f"fleetwatch.io/{reason}", "value": "GPUOverheating", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    "body",
    [
        {"spec": {"taints": [FOREIGN, ours()]}},
        {"spec": {"taints": [FOREIGN, ours(), ours("xid")]}},
        {"metadata": {"labels": {"fleetwatch.io/tainted": "true"}}},
        {"metadata": {"annotations": {"fleetwatch.io/taints": "{}"}}},
        {"metadata": {"labels": {"fleetwatch.io/quarantined": "gpu-overheat"}}},
        {"metadata": {"annotations": {"fleetwatch.io/taint-history": "{}"}}},
    ],
    ids=[
        "add-taint",
        "add-two",
        "own-label",
        "own-annotation",
        "quarantine-label",
        "history-annotation",
    ],
)
def test_the_tainter_may_change_what_is_its_own(
    api_server: ApiServer, cluster: RealCluster, body: dict[str, Any]
) -> None:
    status, answer = patch_as_tainter(api_server, "gpu-1", body)
    assert status == 200, answer
    patch_as_tainter(api_server, "gpu-1", {"spec": {"taints": [FOREIGN]}})  # and take it back
    assert cluster.taints("gpu-1") == [FOREIGN]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"spec": {"taints": [ours()]}}, "only fleetwatch.io/ taints"),
        (
            {"spec": {"taints": [{**FOREIGN, "value": "false"}, ours()]}},
            "only fleetwatch.io/ taints",
        ),
        ({"spec": {"taints": [FOREIGN, {**FOREIGN, "key": "gpu.example/bad"}]}}, "only fleetwatch"),
        ({"spec": {"unschedulable": True}}, "never cordons"),
        ({"metadata": {"labels": {"nvidia.com/gpu.present": None}}}, "only fleetwatch.io/ labels"),
        ({"metadata": {"labels": {"pool": "quarantine"}}}, "only fleetwatch.io/ labels"),
        ({"metadata": {"annotations": {"note": "x"}}}, "only fleetwatch.io/ annotations"),
    ],
    ids=[
        "drop-foreign-taint",
        "change-foreign-taint",
        "add-foreign-taint",
        "cordon",
        "drop-label",
        "add-label",
        "add-annotation",
    ],
)
def test_the_tainter_may_change_nothing_else(
    api_server: ApiServer, cluster: RealCluster, body: dict[str, Any], message: str
) -> None:
    before = cluster.node("gpu-1")
    status, answer = patch_as_tainter(api_server, "gpu-1", body)
    assert status in (403, 422), answer
    assert message in answer["message"]
    assert (
        cluster.node("gpu-1")["metadata"]["resourceVersion"]
        == (before["metadata"]["resourceVersion"])
    )


def test_people_are_not_bound_by_the_policy(api_server: ApiServer, cluster: RealCluster) -> None:
    status, answer = api_server.request(
        "PATCH", "/api/v1/nodes/gpu-1", {"spec": {"unschedulable": True}}, content_type=MERGE
    )
    assert (status, answer["spec"].get("unschedulable")) == (200, True)
    assert ADMIN.user not in TAINTER.user


async def test_the_tainters_own_writes_pass_on_a_cordoned_node_with_foreign_taints(
    make_controller: ControllerFactory, cluster: RealCluster, kube: KubeNodeApi
) -> None:
    cluster.mutate("gpu-1", lambda n: n["spec"].update(unschedulable=True))
    metrics = TainterMetrics()
    condition = ConditionKeeper(
        api=kube,
        leadership=Leadership(renew_deadline=None),
        metrics=metrics,
        settings=NodeConditionSettings(),
        retry=RetryPolicy(attempts=2, base_delay=0.001),
        dry_run=False,
    )
    controller = make_controller(metrics=metrics, after_sync=[condition])
    await controller.handle_alerts(
        parse_webhook(webhook(alert("gpu-1"), alert("gpu-1", reason="xid")))
    )
    assert keys(cluster, "gpu-1") == [
        "example.com/maintenance",
        "fleetwatch.io/gpu-overheat",
        "fleetwatch.io/xid",
    ]
    node = cluster.node("gpu-1")
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"]["fleetwatch.io/tainted"] == "true"
    record = json.loads(node["metadata"]["annotations"]["fleetwatch.io/taints"])
    assert sorted(record) == ["fleetwatch.io/gpu-overheat", "fleetwatch.io/xid"]
    assert len(cluster.events_for("gpu-1", "TaintAdded")) == 2  # its Role covers Events
    (gpu,) = [c for c in node["status"]["conditions"] if c["type"] == "GPUHealthy"]
    assert (gpu["status"], gpu["reason"]) == ("False", "GpuOverheat")


STRATEGIC = "application/strategic-merge-patch+json"


def patch_status_as_tainter(server: ApiServer, node: str, status: Any) -> tuple[int, Any]:
    return server.request(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {"status": status},
        identity=TAINTER,
        content_type=STRATEGIC,
    )


def test_the_tainter_may_change_its_node_condition_and_no_other_status(
    api_server: ApiServer, cluster: RealCluster
) -> None:
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    api_server.call(
        "PATCH",
        "/api/v1/nodes/gpu-1/status",
        {"status": {"conditions": [ready]}},
        content_type=STRATEGIC,
    )
    gpu = {"type": "GPUHealthy", "status": "False", "reason": "GpuOverheat", "message": "hot"}
    status, answer = patch_status_as_tainter(api_server, "gpu-1", {"conditions": [gpu]})
    assert status == 200, answer
    before = cluster.node("gpu-1")
    for change, message in [
        ({"conditions": [{**ready, "status": "False"}]}, "only the GPUHealthy node condition"),
        ({"conditions": [{"type": "DiskPressure", "status": "True"}]}, "only the GPUHealthy"),
        ({"capacity": {"nvidia.com/gpu": "0"}}, "no node status but the GPUHealthy"),
    ]:
        status, answer = patch_status_as_tainter(api_server, "gpu-1", change)
        assert status in (403, 422), answer
        assert message in answer["message"]
    after = cluster.node("gpu-1")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_an_eviction_may_not_shorten_the_grace_period(
    api_server: ApiServer, cluster: RealCluster
) -> None:
    cluster.fresh_namespace("team-a")

    def evict(name: str, **options: Any) -> tuple[int, Any]:
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": "team-a"},
        }
        if options:
            body["deleteOptions"] = options
        return api_server.request(
            "POST", f"/api/v1/namespaces/team-a/pods/{name}/eviction", body, identity=TAINTER
        )

    probes = iter(range(1000))

    def denied() -> bool:
        # a new pod each try: one evicted before the policy is in effect is gone
        name = f"probe-{next(probes)}"
        cluster.run_pod(name, namespace="team-a", node="gpu-0")
        return evict(name, gracePeriodSeconds=0)[0] != 201

    wait_for(denied, what="the eviction policy to take effect")
    cluster.fresh_namespace("team-a")
    for name in ("forced", "plain"):
        cluster.run_pod(name, namespace="team-a", node="gpu-0")
    status, answer = evict("forced", gracePeriodSeconds=0)
    assert status in (403, 422), answer
    assert "never shortens a pod's grace period" in answer["message"]
    assert cluster.terminating("team-a") == set()
    status, answer = evict("plain")
    assert status == 201, answer
    assert cluster.terminating("team-a") == {"plain"}


async def test_the_tainters_quarantine_write_passes(
    make_controller: ControllerFactory, cluster: RealCluster, kube: KubeNodeApi
) -> None:
    now = int(time.time())
    history = History(taints={"gpu-overheat": (now - 120, now - 60)}).to_annotation()
    assert history is not None
    cluster.mutate("gpu-2", lambda n: n["metadata"]["annotations"].update({HISTORY: history}))
    controller = make_controller()
    await controller.handle_alerts(parse_webhook(webhook(alert("gpu-2"))))
    node = cluster.node("gpu-2")
    assert keys(cluster, "gpu-2") == ["fleetwatch.io/gpu-overheat"]
    assert node["metadata"]["labels"][QUARANTINE_LABEL] == "gpu-overheat"
    assert json.loads(node["metadata"]["annotations"][HISTORY])["quarantined"] == ["gpu-overheat"]
    assert len(cluster.events_for("gpu-2", "NodeQuarantined")) == 1


async def test_a_policy_denial_is_not_retried_a_guard_conflict_is(
    cluster: RealCluster, kube: KubeNodeApi
) -> None:
    """The guard's 409 is re-read and re-planned; the admission policy's denial (422
    Invalid) would be denied again, so it is counted once and raised with its message."""
    retry = RetryPolicy(attempts=5, base_delay=0.01, max_delay=0.05)
    metrics = TainterMetrics()
    plans = 0

    async def foreign_label(_node: NodeView) -> Change:
        nonlocal plans
        plans += 1
        return Change(labels={"pool": "quarantine"})

    with pytest.raises(ApiError) as denied:
        await guarded_update(
            api=kube, name="gpu-1", plan=foreign_label, retry=retry, metrics=metrics
        )
    assert denied.value.status == 422  # reason Invalid: the policy sets no other
    assert "only fleetwatch.io/ labels" in denied.value.reason
    assert plans == 1
    errors = "fleetwatch_tainter_api_errors_total"
    assert metrics.registry.get_sample_value(errors, {"status": str(denied.value.status)}) == 1
    assert "pool" not in cluster.node("gpu-1")["metadata"].get("labels", {})

    plans = 0

    async def raced_taint(_node: NodeView) -> Change:
        """Plan a taint; on the first try someone else writes the node meanwhile."""
        nonlocal plans
        plans += 1
        if plans == 1:
            cluster.mutate("gpu-1", lambda n: n["metadata"]["labels"].update(raced="yes"))
        return Change(add=(Taint(**ours()),))

    await guarded_update(api=kube, name="gpu-1", plan=raced_taint, retry=retry, metrics=metrics)
    assert plans == 2
    assert metrics.registry.get_sample_value("fleetwatch_tainter_api_conflicts_total") == 1
    assert keys(cluster, "gpu-1") == [FOREIGN["key"], ours()["key"]]
