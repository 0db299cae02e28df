"""The training-job story on a DRA-allocated job: the same rules, unchanged, on GPUs that
the job's pods got from a ResourceClaim instead of the device plugin.

Two simulated nodes, four GPUs each, every GPU held by a worker of JobSet `llm` through
claim `llm-gpus` (the simulated kubelet reports them in `dynamic_resources`). A real
kube-apiserver holds the ResourceSlices NVIDIA's DRA driver would publish for each node;
they are created only after the exporters run (which shows the watch, not only the first
list, resolves the claims). Each exporter resolves its node's claims with
`--collector.podresources.dra=on --collector.podresources.node-name=NODE` and the chart's
exporter ServiceAccount (RBAC applied from the rendered chart). A real Prometheus runs the
shipped recording and alert rules: every GPU gets the job's identity, and GPUStraggler names
the throttled one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetwatch.catalog.allocation import GPU_ALLOCATION_INFO
from fleetwatch.catalog.gpu import GPU_INFO
from fleetwatch.rules.config import load_config
from fleetwatch.rules.groups import alert_groups, dump_groups, recording_groups
from fleetwatch.sim.kubelet import resource_slice
from fleetwatch.sim.scenario import load_scenario
from fleetwatch.sim.servers import (
    Server,
    prom_alerts,
    wait_until,
)
from testbed.kube import MissingAssets, api_server, find_assets, service_account
from testbed.servers import prom_query
from tests.deploy import fakekube
from tests.deploy.chart import NAMESPACE as CHART_NAMESPACE
from tests.deploy.chart import RELEASE, install
from tests.rules.live import (
    JOB,
    NAMESPACE,
    cap_for,
    cluster_prometheus,
    job_node_scenario,
    simulated_nodes,
)
from tests.tainter.realkube import RBAC_KINDS, apply_release, wait_for

pytestmark = pytest.mark.integration

CLAIM = "llm-gpus"
EXPORTER_NAME = f"{RELEASE}-fleetwatch-exporter"


def dra_scenario(pod: str, faults: list[dict[str, Any]]) -> dict[str, Any]:
    scenario = job_node_scenario(pod, faults)
    scenario["pods"][0]["claim"] = CLAIM
    return scenario


NODES = {
    "sim-node-1": dra_scenario(
        "llm-workers-0",
        [
            {"at": 0, "kind": "throttle", "gpu": 2, "reason": "hw_thermal_slowdown"},
            {"at": 0, "kind": "tensor_active", "gpu": 2, "value": 0.9},
        ],
    ),
    "sim-node-2": dra_scenario("llm-workers-1", []),
}


@dataclass
class DraJob:
    prom: Server
    uuids: dict[tuple[str, str], str]


@pytest.fixture(scope="module")
def dra_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraJob]:
    try:
        assets = find_assets()
    except MissingAssets as exc:
        pytest.skip(f"no real Kubernetes API server: {exc}")
    exporter_identity = service_account(CHART_NAMESPACE, EXPORTER_NAME)
    workdir = tmp_path_factory.mktemp("training-job-dra")
    config = load_config()
    alerts_path = workdir / "alerts.yaml"
    alerts_path.write_text(dump_groups(alert_groups(config, cap_for)))
    recording_path = workdir / "recording.yaml"
    recording_path.write_text(dump_groups(recording_groups(config)))
    scenarios: dict[str, Path] = {}
    for node, scenario in NODES.items():
        scenarios[node] = workdir / f"{node}.yaml"
        scenarios[node].write_text(yaml.safe_dump(scenario))
    with contextlib.ExitStack() as stack:
        kube = stack.enter_context(
            api_server(workdir / "kube", identities=(exporter_identity,), assets=assets)
        )
        with fakekube.serve(fakekube.FakeKubeApi(), workdir / "helm.json") as helm_config:
            release = install(helm_config)
        apply_release(kube, release, RBAC_KINDS)
        wait_for(
            lambda: kube.allowed(
                exporter_identity, verb="watch", resource="resourceslices", group="resource.k8s.io"
            ),
            what="the chart's exporter RBAC",
        )
        cluster, targets = simulated_nodes(
            stack,
            workdir,
            scenarios,
            lambda node: (
                "--collector.podresources.dra=on",
                f"--collector.podresources.node-name={node}",
                f"--kubeconfig={kube.kubeconfig(exporter_identity)}",
            ),
        )
        prom = cluster_prometheus(
            stack, workdir, (cluster, targets), config, [alerts_path, recording_path]
        )
        wait_until(
            lambda: len(prom_query(prom, GPU_INFO.name)) == 8,
            timeout=60,
            what="eight GPUs scraped",
        )
        uuids = {
            (s["metric"]["node"], s["metric"]["gpu"]): s["metric"]["uuid"]
            for s in prom_query(prom, GPU_INFO.name)
        }
        # no slices yet: the claims cannot resolve, so no GPU is joined to a pod
        assert prom_query(prom, GPU_ALLOCATION_INFO.name) == []
        for node, scenario in NODES.items():
            node_uuids = [uuids[(node, str(gpu))] for gpu in range(scenario["gpus"])]
            kube.call(
                "POST",
                "/apis/resource.k8s.io/v1/resourceslices",
                resource_slice(load_scenario("dgx-h100"), node, node_uuids),
            )
        wait_until(
            lambda: len(prom_query(prom, f'fleetwatch:gpu_job:info{{training_job="{JOB}"}}')) == 8,
            timeout=60,
            what="all eight DRA-allocated GPUs in fleetwatch:gpu_job:info",
        )
        yield DraJob(prom=prom, uuids=uuids)


def test_every_claimed_gpu_belongs_to_the_jobset(dra_job: DraJob) -> None:
    allocated = prom_query(dra_job.prom, GPU_ALLOCATION_INFO.name)
    assert {(s["metric"]["node"], s["metric"]["claim"]) for s in allocated} == {
        ("sim-node-1", CLAIM),
        ("sim-node-2", CLAIM),
    }
    assert {(s["metric"]["node"], s["metric"]["gpu"]): s["metric"]["uuid"] for s in allocated} == (
        dra_job.uuids
    )
    info = prom_query(dra_job.prom, "fleetwatch:gpu_job:info")
    assert {
        (s["metric"]["node"], s["metric"]["pod"], s["metric"]["training_job"]) for s in info
    } == {("sim-node-1", "llm-workers-0", JOB), ("sim-node-2", "llm-workers-1", JOB)}


def test_the_straggler_of_a_dra_job_is_named(dra_job: DraJob) -> None:
    def firing() -> list[dict[str, Any]]:
        return [
            a
            for a in prom_alerts(dra_job.prom)
            if a["state"] == "firing" and a["labels"]["alertname"] == "GPUStraggler"
        ]

    wait_until(lambda: bool(firing()), timeout=90, what="GPUStraggler firing")
    (alert,) = firing()
    assert {k: alert["labels"][k] for k in ("node", "gpu", "namespace", "pod", "training_job")} == {
        "node": "sim-node-1",
        "gpu": "2",
        "namespace": NAMESPACE,
        "pod": "llm-workers-0",
        "training_job": JOB,
    }
