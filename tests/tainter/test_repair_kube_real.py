"""Repairs carried out on Kubernetes (`tainter.kube_repair`), on a real kube-apiserver.

There is no kubelet and no Job controller here, so the test plays them: it reports a node's
`status.nodeInfo.bootID` (a new one after a reboot) and sets the reset Job's outcome through
the Job's status subresource. Shown: a reboot Xid is seen back by the boot ID, counted and
timed, and its manual hold lifted; the same Xid a third time quarantines the node instead of
a third reboot; a GPU reset waits for the node's GPU pods, runs as a Job pinned to the node
with the admin container's privileges, and its outcome (success, failure) is an Event and a
metric, a failure escalating; a node someone else cordoned or tainted is never repaired.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetwatch.rules.contract import load_contract
from fleetwatch.tainter.controller import Controller
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.quarantine import QUARANTINE_LABEL
from fleetwatch.tainter.repair import REPAIRS_ANNOTATION, read_attempts
from fleetwatch.tainter.repair_settings import RepairSettings
from fleetwatch.tainter.reset_job import RESET_SCRIPT
from fleetwatch.tainter.settings import QuarantineSettings
from testbed.kube_apiserver import ADMIN, ApiServer
from tests.tainter.conftest import ControllerFactory, webhook, xid_alert
from tests.tainter.realkube import RealCluster

pytestmark = pytest.mark.integration

NODE = "gpu-0"
REASON = "xid-critical"
KEY = f"fleetwatch.io/{REASON}"
JOBS = "fw-repair"
IMAGE = "ghcr.io/fleetwatch/fleetwatch:test"
XID_REBOOT = "151"  # NVIDIA's catalog: a node reboot
XID_RESET = "48"  # NVIDIA's catalog: a GPU reset
SETTINGS = RepairSettings(
    mode="on",
    kinds=frozenset({"reboot", "gpu-reset"}),
    reset_by_reboot=False,
    reset_image=IMAGE,
    reset_namespace=JOBS,
)


@pytest.fixture
async def repairing_kube(
    api_server: ApiServer, real_cluster: RealCluster
) -> AsyncIterator[KubeNodeApi]:
    """The tainter's real client with repairs on, and the reset Jobs' namespace empty."""
    real_cluster.fresh_namespace(JOBS)
    # Background: the default for Jobs (orphan) waits for a garbage collector there is not.
    api_server.call("DELETE", f"/apis/batch/v1/namespaces/{JOBS}/jobs?propagationPolicy=Background")
    api = await KubeNodeApi.connect(
        kubeconfig=api_server.kubeconfig(ADMIN), timeout=10.0, repairs=SETTINGS
    )
    yield api
    await api.close()


def controller(
    make_controller: ControllerFactory, api: KubeNodeApi, metrics: TainterMetrics
) -> Controller:
    """As `fleetwatch taint --repair.mode=on --repair.kinds=reboot,gpu-reset
    --repair.reset-by-reboot=false --repair.reset-image=...` builds it, with the shipped
    contract's repairs; repeat-taint quarantine out of the way (after 10)."""
    return make_controller(
        api=api,
        metrics=metrics,
        repair=SETTINGS,
        repairs=load_contract().repairs,
        quarantine=QuarantineSettings(after=10),
    )


def boots(server: ApiServer, node: str, boot_id: str) -> None:
    """Report the node's boot ID, as its kubelet does after each boot."""
    server.call(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {"status": {"nodeInfo": {"bootID": boot_id}}},
        content_type="application/merge-patch+json",
    )


def xid(code: str, n: int) -> dict[str, Any]:
    return xid_alert(NODE, code, n)


def sample(metrics: TainterMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def jobs(server: ApiServer) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = server.call("GET", f"/apis/batch/v1/namespaces/{JOBS}/jobs")[
        "items"
    ]
    return items


def finish(server: ApiServer, job: dict[str, Any], *, failed: bool) -> None:
    """Set the Job's outcome as the Job controller would (status subresource)."""
    name = job["metadata"]["name"]
    path = f"/apis/batch/v1/namespaces/{JOBS}/jobs/{name}/status"
    current = server.call("GET", path)
    now = "2026-12-03T12:00:00Z"
    kind = "Failed" if failed else "Complete"
    reached = "FailureTarget" if failed else "SuccessCriteriaMet"
    current["status"] = {
        "startTime": now,
        "failed" if failed else "succeeded": 1,
        "conditions": [
            {"type": reached, "status": "True", "reason": "Test", "message": "by the test"},
            {"type": kind, "status": "True", "reason": "Test", "message": "by the test"},
        ],
        **({} if failed else {"completionTime": now}),
    }
    server.call("PUT", path, current)


async def test_a_reboot_is_seen_back_by_the_boot_id_and_twice_more_quarantines(
    make_controller: ControllerFactory,
    repairing_kube: KubeNodeApi,
    real_cluster: RealCluster,
    api_server: ApiServer,
) -> None:
    metrics = TainterMetrics()
    tainter = controller(make_controller, repairing_kube, metrics)
    for n, boot in ((1, "boot-a"), (2, "boot-b")):
        boots(api_server, NODE, boot)
        await tainter.handle_alerts(parse_webhook(webhook(xid(XID_REBOOT, n))))
        assert [t["key"] for t in real_cluster.taints(NODE)] == [KEY]
        flying = read_attempts(await repairing_kube.get_node(NODE))[-1]
        assert (flying.repair, flying.boot_id, flying.returned) == ("reboot", boot, None)
        assert sample(metrics, "fleetwatch_tainter_repairs_in_flight") == 1
        await tainter.sync_nodes([NODE])  # not back: the same boot ID
        assert read_attempts(await repairing_kube.get_node(NODE))[-1].returned is None
        boots(api_server, NODE, f"{boot}-after")  # the node-repair controller rebooted it
        await tainter.sync_nodes([NODE])
        assert read_attempts(await repairing_kube.get_node(NODE))[-1].returned is not None
        await tainter.sync_nodes([NODE])  # the manual hold goes: its repair came back
        assert real_cluster.taints(NODE) == []
    returned = sample(
        metrics, "fleetwatch_tainter_repairs_total", repair="reboot", result="returned"
    )
    assert returned == 2
    assert (
        sample(metrics, "fleetwatch_tainter_repair_back_in_service_seconds_count", reason=REASON)
        == 2
    )
    assert len(real_cluster.events_for(NODE, "RepairStarted")) == 2
    assert "bootID" in real_cluster.events_for(NODE, "RepairStarted")[0]["message"]
    not_held = "fleetwatch_tainter_repairs_not_held_total"
    assert sample(metrics, not_held, reason=REASON, repair="reboot") == 1

    # The third time within the window: no third reboot, quarantined for inspection.
    await tainter.handle_alerts(parse_webhook(webhook(xid(XID_REBOOT, 3))))
    await tainter.sync_nodes([NODE])
    node = await repairing_kube.get_node(NODE)
    assert node.labels.get(QUARANTINE_LABEL) == REASON
    assert len(read_attempts(node)) == 2
    assert [t["key"] for t in real_cluster.taints(NODE)] == [KEY]
    assert sample(metrics, not_held, reason=REASON, repair="reboot") == 2
    (quarantined,) = real_cluster.events_for(NODE, "NodeQuarantined")
    assert REPAIRS_ANNOTATION in quarantined["message"]


async def test_a_gpu_reset_runs_as_a_job_once_the_gpu_pods_left(
    make_controller: ControllerFactory,
    repairing_kube: KubeNodeApi,
    real_cluster: RealCluster,
    api_server: ApiServer,
) -> None:
    metrics = TainterMetrics()
    tainter = controller(make_controller, repairing_kube, metrics)
    real_cluster.run_pod("trainer", namespace=JOBS, node=NODE)
    await tainter.handle_alerts(parse_webhook(webhook(xid(XID_RESET, 1))))
    await tainter.sync_nodes([NODE])
    assert jobs(api_server) == [], "no reset while a GPU pod is on the node"
    real_cluster.remove_pod(JOBS, "trainer")
    await tainter.sync_nodes([NODE])

    (job,) = jobs(api_server)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["nodeName"] == NODE
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["automountServiceAccountToken"] is False
    assert container["image"] == IMAGE
    assert container["command"] == ["/bin/sh", "-c", RESET_SCRIPT]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert "privileged" not in container["securityContext"]
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == int(SETTINGS.timeout)
    assert read_attempts(await repairing_kube.get_node(NODE))[-1].job == job["metadata"]["name"]
    await tainter.sync_nodes([NODE])
    assert len(jobs(api_server)) == 1, "one Job per take-out"

    finish(api_server, job, failed=False)
    await tainter.sync_nodes([NODE])
    (back,) = real_cluster.events_for(NODE, "RepairReturned")
    assert job["metadata"]["name"] in back["message"]
    assert (
        sample(metrics, "fleetwatch_tainter_repairs_total", repair="gpu-reset", result="returned")
        == 1
    )
    await tainter.sync_nodes([NODE])
    assert real_cluster.taints(NODE) == []

    # Again, and this reset fails: the Event says so and the node goes to a person.
    await tainter.handle_alerts(parse_webhook(webhook(xid(XID_RESET, 2))))
    await tainter.sync_nodes([NODE])
    (second,) = [j for j in jobs(api_server) if j["metadata"]["name"] != job["metadata"]["name"]]
    finish(api_server, second, failed=True)
    await tainter.sync_nodes([NODE])
    (failed,) = real_cluster.events_for(NODE, "RepairFailed")
    assert failed["type"] == "Warning"
    assert (
        sample(metrics, "fleetwatch_tainter_repairs_total", repair="gpu-reset", result="failed")
        == 1
    )
    node = await repairing_kube.get_node(NODE)
    assert node.labels.get(QUARANTINE_LABEL) == REASON
    assert [t["key"] for t in real_cluster.taints(NODE)] == [KEY]


@pytest.mark.parametrize("how", ["cordoned", "tainted"])
async def test_a_node_someone_else_holds_out_is_never_repaired(
    make_controller: ControllerFactory,
    repairing_kube: KubeNodeApi,
    real_cluster: RealCluster,
    api_server: ApiServer,
    how: str,
) -> None:
    metrics = TainterMetrics()
    tainter = controller(make_controller, repairing_kube, metrics)
    boots(api_server, NODE, "boot-a")

    def hold(node: dict[str, Any]) -> None:
        if how == "cordoned":
            node["spec"]["unschedulable"] = True
        else:
            node["spec"]["taints"] = [{"key": "example.com/maintenance", "effect": "NoSchedule"}]

    real_cluster.mutate(NODE, hold)
    for code, n in ((XID_REBOOT, 1), (XID_RESET, 2)):
        await tainter.handle_alerts(parse_webhook(webhook(xid(code, n))))
        for _ in range(2):
            await tainter.sync_nodes([NODE])
    node = await repairing_kube.get_node(NODE)
    assert KEY in {t.key for t in node.taints}
    assert REPAIRS_ANNOTATION not in node.annotations
    assert jobs(api_server) == []
    assert real_cluster.events_for(NODE, "RepairStarted") == []
    assert sample(metrics, "fleetwatch_tainter_repairs_in_flight") == 0
