"""The node-repair controllers' objects on a real API server: with medik8s' NodeHealthCheck and
Cluster API's MachineHealthCheck CRDs installed from their projects' own manifests
(tests/tainter/crds/, README there), the chart's example objects (values `repair.*`) are
accepted, a malformed one is refused by the CRD's schema, and the condition fleetwatch sets
on a node it holds out is the one they select on (type and status: all they select by)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetwatch.tainter.condition import ConditionKeeper
from fleetwatch.tainter.election import Leadership
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.settings import NodeConditionSettings, RetryPolicy
from testbed.kube_apiserver import ApiServer
from tests.deploy import fakekube
from tests.deploy.chart import install
from tests.tainter.conftest import ControllerFactory, alert, webhook
from tests.tainter.realkube import RealCluster

pytestmark = pytest.mark.integration

CRDS = Path(__file__).parent / "crds"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NHC_PATH = "/apis/remediation.medik8s.io/v1alpha1/nodehealthchecks"
NAMESPACE = "fleetwatch"
MHC_PATH = f"/apis/cluster.x-k8s.io/v1beta2/namespaces/{NAMESPACE}/machinehealthchecks"
RETRY = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.01)


def install_crd(server: ApiServer, file: str) -> None:
    """Create the CRD of `file` and wait until the server serves it (Established)."""
    crd = yaml.safe_load((CRDS / file).read_text())
    status, body = server.request("POST", CRD_PATH, crd)
    assert status in (201, 409), body
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = server.call("GET", f"{CRD_PATH}/{crd['metadata']['name']}")
        conditions = {
            c["type"]: c["status"] for c in (got.get("status") or {}).get("conditions") or []
        }
        if conditions.get("Established") == "True":
            return
        time.sleep(0.1)
    raise AssertionError(f"CRD {crd['metadata']['name']} not established")


@pytest.fixture(scope="module")
def examples(api_server: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The CRDs installed, and the chart's example objects rendered with both enabled."""
    install_crd(api_server, "remediation.medik8s.io_nodehealthchecks.yaml")
    install_crd(api_server, "cluster.x-k8s.io_machinehealthchecks.yaml")
    api_server.request(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    values = {
        "repair": {
            "nodeHealthCheck": {"enabled": True},
            "machineHealthCheck": {"enabled": True, "clusterName": "gpu-cluster"},
        }
    }
    kubeconfig = tmp_path_factory.mktemp("chart") / "kubeconfig.json"
    stand_in = fakekube.FakeKubeApi(
        kinds=(
            *fakekube.CORE_KINDS,
            *fakekube.OPERATOR_KINDS,
            fakekube.Kind(
                "remediation.medik8s.io/v1alpha1",
                "NodeHealthCheck",
                "nodehealthchecks",
                namespaced=False,
            ),
            fakekube.Kind("cluster.x-k8s.io/v1beta2", "MachineHealthCheck", "machinehealthchecks"),
        )
    )
    with fakekube.serve(stand_in, kubeconfig) as served:
        release = install(served, values)
    (nhc,) = release.of_kind("NodeHealthCheck")
    (mhc,) = release.of_kind("MachineHealthCheck")
    return {"nhc": nhc, "mhc": {**mhc, "metadata": {**mhc["metadata"], "namespace": NAMESPACE}}}


def test_the_example_objects_are_accepted(api_server: ApiServer, examples: dict[str, Any]) -> None:
    nhc = api_server.call("POST", NHC_PATH, examples["nhc"])
    assert nhc["spec"]["unhealthyConditions"] == [
        {"type": "GPUHealthy", "status": "False", "duration": "30m"}
    ]
    mhc = api_server.call("POST", MHC_PATH, examples["mhc"])
    assert mhc["spec"]["checks"]["unhealthyNodeConditions"] == [
        {"type": "GPUHealthy", "status": "False", "timeoutSeconds": 1800}
    ]


def test_a_malformed_example_is_refused_by_the_crds_schema(
    api_server: ApiServer, examples: dict[str, Any]
) -> None:
    """The schemas are live: a condition without its duration is refused (422)."""
    broken = {**examples["nhc"], "metadata": {"name": "broken"}}
    broken["spec"] = {**broken["spec"], "unhealthyConditions": [{"type": "GPUHealthy"}]}
    status, body = api_server.request("POST", NHC_PATH, broken)
    assert status == 422, body


async def test_the_condition_fleetwatch_sets_is_the_one_they_select(
    make_controller: ControllerFactory,
    real_cluster: RealCluster,
    real_kube: KubeNodeApi,
    examples: dict[str, Any],
) -> None:
    metrics = TainterMetrics()
    keeper = ConditionKeeper(
        api=real_kube,
        leadership=Leadership(renew_deadline=None),
        metrics=metrics,
        settings=NodeConditionSettings(),
        retry=RETRY,
        dry_run=False,
    )
    controller = make_controller(api=real_kube, metrics=metrics, after_sync=[keeper])
    held = alert("gpu-0", reason="xid-critical", alertname="GPUXidCritical", extra={"xid": "151"})
    await controller.handle_alerts(parse_webhook(webhook(held)))
    found = real_cluster.node("gpu-0")["status"]["conditions"]
    conditions = {(c["type"], c["status"]): c for c in found}
    (nhc,) = examples["nhc"]["spec"]["unhealthyConditions"]
    (mhc,) = examples["mhc"]["spec"]["checks"]["unhealthyNodeConditions"]
    assert (nhc["type"], nhc["status"]) in conditions
    assert (mhc["type"], mhc["status"]) in conditions
    assert "alert GPUXidCritical" in conditions[(nhc["type"], nhc["status"])]["message"]
