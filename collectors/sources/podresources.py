"""Kubelet PodResources v1 client: which pod's container holds which GPU.

The kubelet serves `PodResourcesLister.List` over the unix socket
`/var/lib/kubelet/pod-resources/kubelet.sock`. A node with many pods answers with more
than gRPC's 4 MiB default receive limit, so the client allows `MAX_MESSAGE_BYTES`. Each
container lists device-plugin devices (`devices`, by extended resource) and, from a 1.34
kubelet on, the DRA claims it uses (`dynamic_resources`: claim, and per device its driver,
pool and device name); a reply from an older kubelet simply has no claims. No
socket (not a Kubernetes node, or the kubelet is down) is not an error: the answer is
None. The stubs in `podresources_pb2*.py` are generated from `podresources.proto`
(committed; the command is in the .proto).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

DEFAULT_SOCKET: Final = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_RESOURCES: Final = ("nvidia.com/gpu",)
MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
GPU_DRIVER: Final = "gpu.nvidia.com"
"""The DRA driver of NVIDIA's GPUs: a claim device of it is a GPU (its ResourceSlice device
gives the uuid)."""
CHANNEL_DRIVER: Final = "compute-domain.nvidia.com"
"""The DRA driver of NVIDIA's ComputeDomains: a claim device of it is an IMEX channel."""


@dataclass(frozen=True, kw_only=True)
class DeviceAllocation:
    """One device of a resource we watch, allocated to one container of one pod."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


@dataclass(frozen=True, kw_only=True)
class ClaimAllocation:
    """One device of a DRA ResourceClaim, used by one container of one pod."""

    namespace: str
    pod: str
    container: str
    claim: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True, kw_only=True)
class Allocations:
    """What one List reply says: device-plugin devices of the watched resources, and DRA
    claim devices of every driver (the collector decides which it can resolve)."""

    devices: tuple[DeviceAllocation, ...] = ()
    claims: tuple[ClaimAllocation, ...] = ()


class PodResourcesError(Exception):
    """The kubelet socket is there but the List call failed (the gRPC status is the message)."""


class PodResourcesClient:
    """Lists device allocations from the kubelet, one short-lived channel per call."""

    def __init__(self, *, socket: Path, resources: frozenset[str], timeout: float) -> None:
        self.socket = socket
        self._resources = resources
        self._timeout = timeout

    def list_allocations(self) -> Allocations | None:
        """Allocations of the watched resources; None when there is no kubelet socket.

        Raises `PodResourcesError` when the kubelet is there but the call fails, or when
        this process may not reach the socket (the kubelet makes it, and its folder,
        root's alone).
        """
        try:
            if not self.socket.exists():
                return None
        except OSError as exc:
            raise PodResourcesError(
                f"cannot reach {self.socket}: {exc.strerror} (the kubelet admits only root)"
            ) from exc
        # gRPC and the generated stubs cost ~12 MB of RSS: load them only on nodes that
        # have a kubelet socket, never on Slurm nodes or under simulation without one.
        import grpc

        from fleetwatch.collectors.sources import podresources_pb2, podresources_pb2_grpc

        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.enable_http_proxy", 0),
        ]
        try:
            with grpc.insecure_channel(f"unix://{self.socket}", options=options) as channel:
                stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
                request = podresources_pb2.ListPodResourcesRequest()
                response = stub.List(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise PodResourcesError(str(exc)) from exc
        return Allocations(
            devices=tuple(
                DeviceAllocation(
                    namespace=pod.namespace,
                    pod=pod.name,
                    container=container.name,
                    resource=devices.resource_name,
                    device_id=device_id,
                )
                for pod in response.pod_resources
                for container in pod.containers
                for devices in container.devices
                if devices.resource_name in self._resources
                for device_id in devices.device_ids
            ),
            claims=tuple(
                ClaimAllocation(
                    # the claim lives in the pod's namespace; an empty field means that too
                    namespace=claim.claim_namespace or pod.namespace,
                    pod=pod.name,
                    container=container.name,
                    claim=claim.claim_name,
                    driver=resource.driver_name,
                    pool=resource.pool_name,
                    device=resource.device_name,
                )
                for pod in response.pod_resources
                for container in pod.containers
                for claim in container.dynamic_resources
                for resource in claim.claim_resources
            ),
        )
