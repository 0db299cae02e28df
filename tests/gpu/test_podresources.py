"""PodResources attribution against a real gRPC server on a temporary unix socket."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from fleetwatch.collectors.podresources import (
    PodResourcesCollector,
    PodResourcesSettings,
    _slice_watcher,
)
from fleetwatch.collectors.sources import podresources_pb2 as pb
from fleetwatch.collectors.sources import podresources_pb2_grpc as pb_grpc
from fleetwatch.collectors.sources.podresources import DEFAULT_RESOURCES, PodResourcesClient
from fleetwatch.collectors.sources.resourceslices import slice_devices
from tests.gpu.simnode import samples, simulated

ALLOCATION = "fleetwatch_gpu_allocation_info"


class Kubelet(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """Answers List with whatever the test sets in `response`."""

    def __init__(self) -> None:
        self.response = pb.ListPodResourcesResponse()

    def List(self, request: Any, context: Any) -> Any:
        return self.response


@pytest.fixture(scope="module")
def kubelet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kubelet, Path]]:
    socket = tmp_path_factory.mktemp("kubelet") / "kubelet.sock"
    servicer = Kubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield servicer, socket
    finally:
        server.stop(grace=None).wait()


def pod(name: str, container: str, resource: str, *devices: str) -> Any:
    return pb.PodResources(
        name=name,
        namespace="training",
        containers=[
            pb.ContainerResources(
                name=container,
                devices=[pb.ContainerDevices(resource_name=resource, device_ids=list(devices))],
            )
        ],
    )


def collector_for(socket: Path) -> PodResourcesCollector:
    _, source = simulated()
    client = PodResourcesClient(socket=socket, resources=frozenset(DEFAULT_RESOURCES), timeout=5)
    return PodResourcesCollector(client=client, source=source, interval=3600)


def test_allocations_by_uuid_and_index(kubelet: tuple[Kubelet, Path]) -> None:
    servicer, socket = kubelet
    collector = collector_for(socket)
    uuid3 = collector._source.gpus()[3].identity.uuid
    servicer.response = pb.ListPodResourcesResponse(
        pod_resources=[
            pod("llama-0", "trainer", "nvidia.com/gpu", uuid3, "5"),
            pod("web", "nginx", "example.com/fpga", "fpga0"),
        ]
    )
    collector.poll()
    found = {
        (dict(k)["gpu"], dict(k)["pod"], dict(k)["container"]): v
        for k, v in samples(collector.collect(), ALLOCATION).items()
    }
    collector.close()
    assert found == {("3", "llama-0", "trainer"): 1.0, ("5", "llama-0", "trainer"): 1.0}


def test_oversized_response(kubelet: tuple[Kubelet, Path]) -> None:
    servicer, socket = kubelet
    pods = [
        pod(f"pod-{n:05d}-{'x' * 200}", "main", "nvidia.com/gpu", f"MIG-{n}") for n in range(20000)
    ]
    servicer.response = pb.ListPodResourcesResponse(pod_resources=pods)
    assert servicer.response.ByteSize() > 4 * 1024 * 1024
    # gRPC's default 4 MiB receive limit fails on this answer.
    with (
        grpc.insecure_channel(f"unix://{socket}") as channel,
        pytest.raises(grpc.RpcError) as failed,
    ):
        pb_grpc.PodResourcesListerStub(channel).List(pb.ListPodResourcesRequest(), timeout=10)
    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    collector = collector_for(socket)
    collector.poll()
    assert len(samples(collector.collect(), ALLOCATION)) == 20000


def test_no_socket_means_no_series_and_no_error(tmp_path: Path) -> None:
    collector = collector_for(tmp_path / "missing.sock")
    collector.poll()
    assert collector.collect() == []


def test_socket_that_disappears(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    socket = tmp_path / "kubelet.sock"
    servicer = Kubelet()
    servicer.response = pb.ListPodResourcesResponse(
        pod_resources=[pod("job", "main", "nvidia.com/gpu", "0")]
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    pb_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    collector = collector_for(socket)
    try:
        collector.poll()
        assert len(samples(collector.collect(), ALLOCATION)) == 1
    finally:
        server.stop(grace=None).wait()
    if socket.exists():  # a dead kubelet can leave its socket file behind: the call fails
        collector.poll()
        assert collector.collect() == []
        socket.unlink()
    collector.poll()
    assert collector.collect() == []


def test_unreachable_socket_is_reported_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A name too long for the kernel makes `exists()` fail the way a root-only folder does
    # for a non-root exporter: an OSError other than "no such file".
    socket = tmp_path / ("x" * 300) / "kubelet.sock"
    collector = collector_for(socket)
    with caplog.at_level("WARNING"):
        collector.poll()
    assert collector.collect() == []
    # Other tests' poller threads may log too: pick the record about this socket.
    (record,) = [r for r in caplog.records if str(socket) in str(r.__dict__.get("detail"))]
    assert record.getMessage() == "kubelet PodResources: failing"
    assert record.levelname == "WARNING"
    assert "cannot reach" in record.__dict__["detail"]
    assert "admits only root" in record.__dict__["detail"]


class BrokenClient(PodResourcesClient):
    """A client whose call fails in a way nobody planned for."""

    def list_allocations(self) -> Any:
        raise RuntimeError("unexpected")


def test_poller_survives_an_unexpected_error(caplog: pytest.LogCaptureFixture) -> None:
    _, source = simulated()
    client = BrokenClient(socket=Path("/nonexistent"), resources=frozenset(), timeout=1)
    collector = PodResourcesCollector(client=client, source=source, interval=0.01)
    with caplog.at_level("WARNING"):
        collector.start()
        deadline = time.monotonic() + 10
        while sum("poll failed" in r.getMessage() for r in caplog.records) < 2:
            assert time.monotonic() < deadline, "the poller stopped after the first error"
            time.sleep(0.01)
    collector.close()
    assert collector.collect() == []


def test_time_sliced_replicas_join_their_gpu(kubelet: tuple[Kubelet, Path]) -> None:
    servicer, socket = kubelet
    collector = collector_for(socket)
    uuid2 = collector._source.gpus()[2].identity.uuid
    servicer.response = pb.ListPodResourcesResponse(
        pod_resources=[
            pod("share-a", "main", "nvidia.com/gpu", f"{uuid2}::0"),
            pod("share-b", "main", "nvidia.com/gpu", f"{uuid2}::1"),
        ]
    )
    collector.poll()
    found = {
        (dict(k)["gpu"], dict(k)["uuid"], dict(k)["pod"], dict(k)["claim"])
        for k in samples(collector.collect(), ALLOCATION)
    }
    collector.close()
    assert found == {("2", uuid2, "share-a", ""), ("2", uuid2, "share-b", "")}


def test_dra_auto_without_a_cluster_is_off_and_on_is_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    auto = PodResourcesSettings(node_name="gpu-1", kubeconfig=tmp_path / "missing")
    with caplog.at_level("INFO"):
        assert _slice_watcher(auto, env_node="") is None
    assert any("DRA attribution off" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="no node name"):
        _slice_watcher(PodResourcesSettings(dra="on"), env_node="")
    http = tmp_path / "http.yaml"
    http.write_text(
        "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:8080'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    with pytest.raises(ValueError, match="is not https"):
        _slice_watcher(PodResourcesSettings(dra="on", kubeconfig=http), env_node="gpu-1")
    assert _slice_watcher(PodResourcesSettings(dra="off"), env_node="gpu-1") is None


def test_slice_devices_read_nvidia_attributes() -> None:
    obj = {
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "node-a"},
            "devices": [
                {
                    "name": "gpu-0-mig-0",
                    "attributes": {
                        "type": {"string": "mig"},
                        "uuid": {"string": "MIG-1"},
                        "profile": {"string": "1g.10gb"},
                        "productName": {"string": "H100"},
                    },
                },
                {"name": "gpu-1"},
            ],
        }
    }
    assert [(d.name, d.uuid, d.kind, d.profile) for d in slice_devices(obj)] == [
        ("gpu-0-mig-0", "MIG-1", "mig", "1g.10gb"),
        ("gpu-1", "", "", ""),
    ]
    assert slice_devices({"spec": {"driver": "fpga.example.com", "devices": [{"name": "x"}]}}) == ()
