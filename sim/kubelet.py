"""The simulated node's kubelet and the cluster's kube-state-metrics, for a scenario's pods.

A scenario's `pods:` say which pod holds which GPU and which labels the pod carries. Two
stand-ins show them the way a Kubernetes cluster does, so the training-job rules and
dashboards run end to end on a laptop:

- `serve_kubelet(scenario, socket)`: the kubelet PodResources API (gRPC on a unix socket)
  that the exporter's podresources collector reads (`--collector.podresources.socket`),
  listing each pod's GPUs by NVML index (the device plugin's index strategy);
- `kube_pod_labels(scenarios)`: the `kube_pod_labels` series kube-state-metrics serves for
  those pods when its `--metric-labels-allowlist` allows every pod label key.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any, Final

import grpc

from fleetwatch.collectors.sources import podresources_pb2 as pb
from fleetwatch.collectors.sources import podresources_pb2_grpc as pb_grpc
from fleetwatch.sim.scenario import Scenario

RESOURCE: Final = "nvidia.com/gpu"


class _Kubelet(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """Answers List with the scenario's pods, one container each."""

    def __init__(self, scenario: Scenario) -> None:
        self._response = pb.ListPodResourcesResponse(
            pod_resources=[
                pb.PodResources(
                    name=pod.name,
                    namespace=pod.namespace,
                    containers=[
                        pb.ContainerResources(
                            name=pod.container,
                            devices=[
                                pb.ContainerDevices(
                                    resource_name=RESOURCE,
                                    device_ids=[str(gpu) for gpu in pod.gpus],
                                )
                            ],
                        )
                    ],
                )
                for pod in scenario.pods
            ]
        )

    def List(self, request: Any, context: Any) -> Any:
        del request, context
        return self._response


@contextlib.contextmanager
def serve_kubelet(scenario: Scenario, socket: Path) -> Iterator[None]:
    """Serve the PodResources API for `scenario`'s pods on unix socket `socket` while open."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(_Kubelet(scenario), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield
    finally:
        server.stop(grace=None).wait()


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
