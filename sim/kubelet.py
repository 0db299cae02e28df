"""The simulated node's kubelet and the cluster's kube-state-metrics, for a scenario's pods.

A scenario's `pods:` say which pod holds which GPU and which labels the pod carries. Two
stand-ins show them the way a Kubernetes cluster does, so the training-job rules and
dashboards run end to end on a laptop:

- `serve_kubelet(scenario, socket)`: the kubelet PodResources API (gRPC on a unix socket)
  that the exporter's podresources collector reads (`--collector.podresources.socket`),
  listing each pod's GPUs by NVML index (the device plugin's index strategy), or, for a pod
  with a `claim:`, as that DRA claim's devices (`dynamic_resources`, driver
  `gpu.nvidia.com`, pool the node's name, devices `gpu-N`) as a 1.34+ kubelet does;
- `resource_slice(scenario, node, uuids)`: the ResourceSlice NVIDIA's DRA driver publishes
  for that node, which resolves those claim devices to GPU UUIDs;
- `kube_pod_labels(scenarios)`: the `kube_pod_labels` series kube-state-metrics serves for
  those pods when its `--metric-labels-allowlist` allows every pod label key;
- `kube_pod_series(node_scenarios, created=)`: `kube_pod_info` and `kube_pod_created` of the
  same pods, which the report's Goodput section reads.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any, Final

import grpc

from fleetwatch.collectors.sources import podresources_pb2 as pb
from fleetwatch.collectors.sources import podresources_pb2_grpc as pb_grpc
from fleetwatch.sim.scenario import PodSpec, Scenario

RESOURCE: Final = "nvidia.com/gpu"
DRA_DRIVER: Final = "gpu.nvidia.com"


def dra_device(gpu: int) -> str:
    """The device name NVIDIA's DRA driver gives NVML GPU `gpu` in its ResourceSlice."""
    return f"gpu-{gpu}"


def _container(pod: PodSpec, pool: str) -> Any:
    """One container's resources: device-plugin ids, or the claim's DRA devices."""
    if not pod.claim:
        devices = [
            pb.ContainerDevices(resource_name=RESOURCE, device_ids=[str(g) for g in pod.gpus])
        ]
        return pb.ContainerResources(name=pod.container, devices=devices)
    claim = pb.DynamicResource(
        claim_name=pod.claim,
        claim_namespace=pod.namespace,
        claim_resources=[
            pb.ClaimResource(
                cdi_devices=[pb.CDIDevice(name=f"k8s.{DRA_DRIVER}/claim={pod.claim}-{gpu}")],
                driver_name=DRA_DRIVER,
                pool_name=pool,
                device_name=dra_device(gpu),
            )
            for gpu in pod.gpus
        ],
    )
    return pb.ContainerResources(name=pod.container, dynamic_resources=[claim])


class _Kubelet(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """Answers List with the scenario's pods, one container each."""

    def __init__(self, scenario: Scenario, pool: str) -> None:
        self._response = pb.ListPodResourcesResponse(
            pod_resources=[
                pb.PodResources(
                    name=pod.name, namespace=pod.namespace, containers=[_container(pod, pool)]
                )
                for pod in scenario.pods
            ]
        )

    def List(self, request: Any, context: Any) -> Any:
        del request, context
        return self._response


@contextlib.contextmanager
def serve_kubelet(scenario: Scenario, socket: Path, *, node: str = "") -> Iterator[None]:
    """Serve the PodResources API for `scenario`'s pods on unix socket `socket` while open;
    claim devices name pool `node` (NVIDIA's driver names each node's pool after it)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(_Kubelet(scenario, node), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield
    finally:
        server.stop(grace=None).wait()


def resource_slice(scenario: Scenario, node: str, uuids: Sequence[str]) -> dict[str, Any]:
    """The ResourceSlice (`resource.k8s.io/v1`) NVIDIA's DRA driver publishes for `node`:
    one device per GPU, `uuids[i]` being NVML GPU i's UUID."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRA_DRIVER}"},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": dra_device(gpu),
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": uuid},
                        "productName": {"string": scenario.gpu_model},
                        "index": {"int": gpu},
                        "driverVersion": {"version": "550.90.7"},
                    },
                    "capacity": {"memory": {"value": "80Gi"}},
                }
                for gpu, uuid in enumerate(uuids)
            ],
        },
    }


def kube_pod_labels(scenarios: Iterable[Scenario]) -> str:
    """kube-state-metrics' `kube_pod_labels` exposition for every pod of `scenarios`.

    kube-state-metrics names pod label `jobset.sigs.k8s.io/jobset-name` as
    `label_jobset_sigs_k8s_io_jobset_name`; the scenario validated keys and values, so
    nothing here needs escaping.
    """
    lines = [
        "# HELP kube_pod_labels Kubernetes labels converted to Prometheus labels.",
        "# TYPE kube_pod_labels gauge",
    ]
    for scenario in scenarios:
        for pod in scenario.pods:
            uid = uuid.uuid5(uuid.NAMESPACE_URL, f"fleetwatch-sim/{pod.namespace}/{pod.name}")
            labels = {"namespace": pod.namespace, "pod": pod.name, "uid": str(uid)}
            labels.update(
                {
                    "label_" + "".join(c if c.isalnum() else "_" for c in k): v
                    for k, v in pod.labels.items()
                }
            )
            text = ",".join(f'{name}="{value}"' for name, value in labels.items())
            lines.append(f"kube_pod_labels{{{text}}} 1")
    return "\n".join(lines) + "\n"


def kube_pod_series(node_scenarios: Iterable[tuple[str, Scenario]], *, created: float) -> str:
    """kube-state-metrics' `kube_pod_info` (the pod's node) and `kube_pod_created` (its
    creation time, `created`: every pod of the simulation starts with it) for every pod of
    the node scenarios, with the uid `kube_pod_labels` gives the same pod."""
    lines = [
        "# HELP kube_pod_info Information about pod.",
        "# TYPE kube_pod_info gauge",
        "# HELP kube_pod_created Unix creation timestamp",
        "# TYPE kube_pod_created gauge",
    ]
    for node, scenario in node_scenarios:
        for pod in scenario.pods:
            uid = uuid.uuid5(uuid.NAMESPACE_URL, f"fleetwatch-sim/{pod.namespace}/{pod.name}")
            ident = f'namespace="{pod.namespace}",pod="{pod.name}",uid="{uid}"'
            lines.append(f'kube_pod_info{{{ident},node="{node}",created_by_kind="<none>"}} 1')
            lines.append(f"kube_pod_created{{{ident}}} {created:.0f}")
    return "\n".join(lines) + "\n"
