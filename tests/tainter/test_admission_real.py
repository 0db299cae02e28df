"""The chart's ValidatingAdmissionPolicy, evaluated by a real API server: as the tainter's
ServiceAccount, a patch that adds or removes a fleetwatch.io/ taint passes, and one that
changes another taint, cordons, or touches labels or annotations outside fleetwatch.io/ is
denied with the chart's message; the tainter's own guarded writes (a quarantine's label and
taint history included) pass; people are not bound by it."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.quarantine import HISTORY_ANNOTATION as HISTORY
from fleetwatch.tainter.quarantine import QUARANTINE_LABEL, History

from testbed.kube import ADMIN, ApiServer
from tests.deploy import fakekube
from tests.deploy.chart import Release, install
from tests.tainter.conftest import ControllerFactory, alert, keys, webhook
from tests.tainter.realkube import (
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
        release = install(kubeconfig)
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
    controller = make_controller()
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
