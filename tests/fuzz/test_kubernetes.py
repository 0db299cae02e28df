"""What the kubelet and the API server hand the exporter, fuzzed: PodResources replies (the
protobuf bytes a kubelet socket answers, served by a real gRPC server) and ResourceSlice
objects (NVIDIA's DRA driver's, as sim/kubelet.py writes them). A reply that does not decode
is `PodResourcesError`; a slice gives devices with string fields, whatever its shape."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any, Final

import grpc
import pytest
from hypothesis import given

from fleetwatch.collectors.sources import podresources_pb2 as pb
from fleetwatch.collectors.sources.podresources import (
    DEFAULT_RESOURCES,
    MAX_MESSAGE_BYTES,
    Allocations,
    PodResourcesClient,
    PodResourcesError,
)
from fleetwatch.collectors.sources.resourceslices import SliceDevice, slice_devices
from fleetwatch.sim.kubelet import resource_slice
from fleetwatch.sim.scenario import load_scenario
from tests.fuzz.harness import FUZZ, FUZZ_COSTLY, bounded_label, exercise
from tests.fuzz.mutations import mutated_bytes, mutated_tree


def _reply(*pods: Any) -> bytes:
    return bytes(pb.ListPodResourcesResponse(pod_resources=list(pods)).SerializeToString())


REPLIES: Final = (
    _reply(
        pb.PodResources(
            name="trainer-0",
            namespace="training",
            containers=[
                pb.ContainerResources(
                    name="main",
                    devices=[
                        pb.ContainerDevices(
                            resource_name="nvidia.com/gpu",
                            device_ids=["GPU-0b7e-aaaa", "GPU-0b7e-bbbb"],
                        )
                    ],
                    dynamic_resources=[
                        pb.DynamicResource(
                            claim_name="gpus",
                            claim_namespace="training",
                            claim_resources=[
                                pb.ClaimResource(
                                    driver_name="gpu.nvidia.com",
                                    pool_name="node-1",
                                    device_name="gpu-3",
                                )
                            ],
                        )
                    ],
                )
            ],
        ),
        pb.PodResources(
            name="notebook",
            namespace="",
            containers=[
                pb.ContainerResources(
                    name="c",
                    devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["5"])],
                )
            ],
        ),
    ),
    _reply(),
)


class RawKubelet:
    """A PodResources server that answers List with whatever bytes the test sets."""

    def __init__(self) -> None:
        self.reply = b""

    def list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        del request, context
        return self.reply


@pytest.fixture(scope="module")
def kubelet() -> Iterator[tuple[RawKubelet, Path]]:
    with tempfile.TemporaryDirectory() as folder:
        socket = Path(folder) / "kubelet.sock"
        raw = RawKubelet()
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(raw.list)}
        )
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        try:
            yield raw, socket
        finally:
            server.stop(grace=None).wait()


def allocations_holds(found: Allocations | None) -> None:
    assert found is not None  # the socket is there: an answer or an error, never "none"
    for device in found.devices:
        assert device.resource in DEFAULT_RESOURCES
        for text in (device.namespace, device.pod, device.container, device.device_id):
            bounded_label(text, MAX_MESSAGE_BYTES)
    for claim in found.claims:
        for text in (claim.namespace, claim.pod, claim.claim, claim.driver, claim.device):
            bounded_label(text, MAX_MESSAGE_BYTES)


@FUZZ
@given(mutated_bytes(REPLIES, huge=65536))
def test_podresources_reply(kubelet: tuple[RawKubelet, Path], reply: bytes) -> None:
    server, socket = kubelet
    server.reply = reply
    client = PodResourcesClient(socket=socket, resources=frozenset(DEFAULT_RESOURCES), timeout=5)
    exercise(
        "PodResources reply",
        lambda _: client.list_allocations(),
        None,
        errors=(PodResourcesError,),
        holds=allocations_holds,
    )


SLICES: Final = (
    resource_slice(load_scenario("dgx-h100"), "node-1", [f"GPU-{n:04d}" for n in range(4)]),
    {"metadata": {"name": "other"}, "spec": {"driver": "example.com/nic", "devices": []}},
)


def slice_holds(devices: tuple[SliceDevice, ...]) -> None:
    for device in devices:
        for text in (device.driver, device.pool, device.name, device.uuid, device.kind):
            assert isinstance(text, str)
        assert isinstance(device.product, str)
        assert isinstance(device.profile, str)


@FUZZ_COSTLY
@given(mutated_tree(SLICES))
def test_resourceslice_object(obj: Any) -> None:
    exercise(
        "ResourceSlice object",
        slice_devices,
        obj,
        malformed=lambda devices: not devices,
        holds=slice_holds,
    )


def test_resourceslice_parts_of_the_wrong_shape_are_not_read() -> None:
    """Found by the fuzzer: a spec, pool, device or attribute that is not an object raised
    AttributeError or TypeError, failing the whole list of slices."""
    good = SLICES[0]
    devices = good["spec"]["devices"]
    broken = {**good, "spec": {**good["spec"], "pool": None, "devices": [True, *devices[:1]]}}
    broken["spec"]["devices"][1] = {**devices[0], "attributes": {"uuid": "GPU-0000"}}
    (device,) = slice_devices(broken)
    assert (device.name, device.pool, device.uuid) == (devices[0]["name"], "", "")
    for obj in ({"spec": "x"}, {"spec": {"driver": ["gpu.nvidia.com"]}}, None):
        assert slice_devices(obj) == ()  # type: ignore[arg-type]
