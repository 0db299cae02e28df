"""DRA attribution on real parts: a real kube-apiserver (v1.36, `resource.k8s.io/v1`) holding
ResourceSlices shaped as NVIDIA's DRA driver publishes them, the simulated kubelet's
PodResources reply with `dynamic_resources` on a real gRPC socket, and the exporter's
podresources collector joining the two: the resolution, the watch (a slice that changes),
the chart's RBAC and a denied list, and each kind of bad input."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.catalog.allocation import (
    COMPUTE_DOMAIN_CHANNEL_ALLOCATION_INFO,
    GPU_ALLOCATION_INFO,
    GPU_ALLOCATION_UNRESOLVED_TOTAL,
)
from fleetwatch.collectors.podresources import PodResourcesCollector
from fleetwatch.collectors.sources.podresources import DEFAULT_RESOURCES, PodResourcesClient
from fleetwatch.collectors.sources.resourceslices import KubeAccess, ResourceSliceWatcher
from fleetwatch.sim.kubelet import resource_slice, serve_kubelet
from fleetwatch.sim.scenario import PodSpec, load_scenario
from testbed.kube_apiserver import ApiServer, Identity, MissingAssets, find_assets, service_account
from testbed.kube_apiserver import api_server as start_api_server
from tests.deploy import fakekube
from tests.deploy.chart import NAMESPACE, RELEASE, Release, install
from tests.gpu.simnode import samples, simulated
from tests.tainter.realkube import RBAC_KINDS, apply_release, wait_for

pytestmark = pytest.mark.integration

NODE = "gpu-node-1"
OTHER_NODE = "gpu-node-2"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
# The chart's exporter ServiceAccount, as the API server sees a pod running under it.
EXPORTER = service_account(NAMESPACE, f"{RELEASE}-fleetwatch-exporter")
NOBODY = Identity("nobody", "nobody", ("system:authenticated",))


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    try:
        assets = find_assets()
    except MissingAssets as exc:
        pytest.skip(f"no real Kubernetes API server: {exc}")
    workdir = tmp_path_factory.mktemp("kube-apiserver")
    with start_api_server(workdir, identities=(EXPORTER, NOBODY), assets=assets) as server:
        yield server


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    path = tmp_path_factory.mktemp("helm") / "kubeconfig.json"
    with fakekube.serve(fakekube.FakeKubeApi(), path) as kubeconfig:
        return install(kubeconfig)


@pytest.fixture(scope="module")
def rbac(api_server: ApiServer, release: Release) -> ApiServer:
    """The real server with the chart's RBAC applied, the exporter's included."""
    apply_release(api_server, release, RBAC_KINDS)
    wait_for(
        lambda: api_server.allowed(
            EXPORTER, verb="list", resource="resourceslices", group="resource.k8s.io"
        ),
        what="the chart's exporter ClusterRoleBinding to take effect",
    )
    return api_server


def uuids() -> list[str]:
    _, source = simulated()
    return [g.identity.uuid for g in source.gpus()]


def mig_and_channel_slices() -> list[dict[str, Any]]:
    """A MIG device, a device without a uuid (gpu.nvidia.com), and a ComputeDomain channel."""
    mig = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-mig"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": NODE,
            "pool": {"name": f"{NODE}-mig", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-7-mig-1g10gb-0",
                    "attributes": {
                        "type": {"string": "mig"},
                        "uuid": {"string": "MIG-11111111-2222-3333-4444-555555555555"},
                        "parentUUID": {"string": uuids()[7]},
                        "productName": {"string": "NVIDIA H100 80GB HBM3"},
                        "profile": {"string": "1g.10gb"},
                    },
                },
                {"name": "gpu-6", "attributes": {"type": {"string": "gpu"}}},
            ],
        },
    }
    channel = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-channels"},
        "spec": {
            "driver": "compute-domain.nvidia.com",
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "channel-0",
                    "attributes": {"type": {"string": "channel"}, "id": {"int": 0}},
                }
            ],
        },
    }
    return [mig, channel]


@pytest.fixture(scope="module")
def slices(rbac: ApiServer) -> ApiServer:
    """This node's slices, and a slice of another node holding every device name again."""
    scenario = load_scenario("dgx-h100")
    for obj in (
        resource_slice(scenario, NODE, uuids()),
        resource_slice(scenario, OTHER_NODE, [f"GPU-other-{i}" for i in range(8)]),
        *mig_and_channel_slices(),
    ):
        rbac.call("POST", SLICES, obj)
    return rbac


def pods() -> tuple[PodSpec, ...]:
    return (
        PodSpec(namespace="ml", name="dra-0", container="trainer", gpus=(0, 1), claim="gpus"),
        PodSpec(namespace="ml", name="plugin-0", container="main", gpus=(3,)),
    )


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[Path]:
    socket = tmp_path / "kubelet.sock"
    scenario = replace(load_scenario("dgx-h100"), pods=pods())
    with serve_kubelet(scenario, socket, node=NODE):
        yield socket


def watcher_for(server: ApiServer, identity: Identity, mode: str = "auto") -> ResourceSliceWatcher:
    access = KubeAccess.from_kubeconfig(server.kubeconfig(identity))
    return ResourceSliceWatcher(access=access, node=NODE, mode=mode)


def collector_for(socket: Path, watcher: ResourceSliceWatcher | None) -> PodResourcesCollector:
    _, source = simulated()
    client = PodResourcesClient(socket=socket, resources=frozenset(DEFAULT_RESOURCES), timeout=5)
    return PodResourcesCollector(client=client, source=source, interval=3600, slices=watcher)


def until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def allocation(collector: PodResourcesCollector) -> set[tuple[str, ...]]:
    found = samples(collector.collect(), GPU_ALLOCATION_INFO.name)
    keys = ("gpu", "uuid", "namespace", "pod", "container", "claim")
    return {tuple(dict(labels)[k] for k in keys) for labels in found}


def unresolved(collector: PodResourcesCollector) -> dict[str, float]:
    found = samples(collector.collect(), GPU_ALLOCATION_UNRESOLVED_TOTAL.family_name)
    return {dict(labels)["reason"]: value for labels, value in found.items()}


def test_the_chart_role_reads_resourceslices_and_nothing_more(rbac: ApiServer) -> None:
    group = "resource.k8s.io"
    for verb in ("get", "list", "watch"):
        assert rbac.allowed(EXPORTER, verb=verb, resource="resourceslices", group=group)
    for verb in ("create", "update", "patch", "delete"):
        assert not rbac.allowed(EXPORTER, verb=verb, resource="resourceslices", group=group)
    for resource, in_group in (("resourceclaims", group), ("pods", ""), ("nodes", "")):
        assert not rbac.allowed(EXPORTER, verb="list", resource=resource, group=in_group)


def test_claims_resolve_to_gpu_uuids_through_this_nodes_slices(
    slices: ApiServer, kubelet: Path
) -> None:
    watcher = watcher_for(slices, EXPORTER)
    collector = collector_for(kubelet, watcher)
    try:
        watcher.start()
        until(lambda: watcher.synced, "the first list")
        collector.poll()
        gpu = uuids()
        assert allocation(collector) == {
            ("0", gpu[0], "ml", "dra-0", "trainer", "gpus"),
            ("1", gpu[1], "ml", "dra-0", "trainer", "gpus"),
            ("3", gpu[3], "ml", "plugin-0", "main", ""),
        }
        # the other node's slice, with the same pool and device names, is not listed
        assert not any(d.uuid.startswith("GPU-other") for d in watcher.devices().values())
        assert set(unresolved(collector).values()) == {0.0}
    finally:
        collector.close()


def test_a_slice_that_changes_moves_the_claim(slices: ApiServer, kubelet: Path) -> None:
    watcher = watcher_for(slices, EXPORTER)
    collector = collector_for(kubelet, watcher)
    name = f"{SLICES}/{NODE}-gpu.nvidia.com"
    original = slices.call("GET", name)
    try:
        watcher.start()
        until(lambda: watcher.synced, "the first list")
        # The collector's poller asks once when it starts: done before the slice changes,
        # so only this test's polls see the deleted slice (each counts its two devices).
        until(lambda: unresolved(collector), "the poller's first answer")
        gpu = uuids()
        # the driver republishes: device gpu-0 is now the GPU whose UUID is gpu[5]
        changed = original["spec"]["devices"]
        changed[0]["attributes"]["uuid"] = {"string": gpu[5]}
        slices.call(
            "PATCH",
            name,
            {"spec": {"devices": changed}},
            content_type="application/merge-patch+json",
        )
        until(
            lambda: watcher.devices()[("gpu.nvidia.com", NODE, "gpu-0")].uuid == gpu[5], "the watch"
        )
        assert watcher.lists == 1
        assert watcher.events >= 1
        collector.poll()
        assert ("5", gpu[5], "ml", "dra-0", "trainer", "gpus") in allocation(collector)
        # the slice goes away: its claim devices are counted and left out, the rest stays
        slices.call("DELETE", name)
        until(lambda: ("gpu.nvidia.com", NODE, "gpu-0") not in watcher.devices(), "the delete")
        collector.poll()
        assert allocation(collector) == {("3", gpu[3], "ml", "plugin-0", "main", "")}
        assert unresolved(collector)["unknown_device"] == 2
    finally:
        collector.close()
        fresh = {k: v for k, v in original.items() if k != "metadata"}
        slices.call("POST", SLICES, {**fresh, "metadata": {"name": original["metadata"]["name"]}})


def test_a_denied_list_turns_dra_off_and_device_plugin_attribution_goes_on(
    slices: ApiServer, kubelet: Path, caplog: pytest.LogCaptureFixture
) -> None:
    watcher = watcher_for(slices, NOBODY)
    collector = collector_for(kubelet, watcher)
    try:
        with caplog.at_level(logging.INFO):
            watcher.start()
            until(lambda: watcher.off_reason is not None, "DRA attribution to turn off")
            collector.start()  # two polls in all: the poller's first and one more
            until(lambda: unresolved(collector), "the poller's first answer")
            collector.poll()
        assert "may not list resourceslices" in str(watcher.off_reason)
        gpu = uuids()
        assert allocation(collector) == {("3", gpu[3], "ml", "plugin-0", "main", "")}
        assert unresolved(collector)["slices_unavailable"] == 4  # two devices, two polls
        off = [r for r in caplog.records if r.getMessage().startswith("DRA attribution off")]
        assert len(off) == 1
        left_out = [r for r in caplog.records if "slices_unavailable" in r.getMessage()]
        assert len(left_out) == 1  # logged once, counted every time
    finally:
        collector.close()


def test_bad_input_is_counted_named_and_the_rest_exported(
    slices: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A device without a uuid, a pool no slice of this node holds, an unknown driver: each
    counted, logged once with its claim, and the good claims and channel still exported."""
    from fleetwatch.collectors.sources import podresources_pb2 as pb

    socket = tmp_path / "kubelet.sock"
    claims = [
        ("good", "gpu.nvidia.com", NODE, "gpu-2"),
        ("mig", "gpu.nvidia.com", f"{NODE}-mig", "gpu-7-mig-1g10gb-0"),
        ("domain", "compute-domain.nvidia.com", NODE, "channel-0"),
        ("no-uuid", "gpu.nvidia.com", f"{NODE}-mig", "gpu-6"),
        ("elsewhere", "gpu.nvidia.com", OTHER_NODE, "gpu-4"),
        ("fpga", "fpga.example.com", NODE, "fpga-0"),
    ]
    reply = pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="mixed",
                namespace="ml",
                containers=[
                    pb.ContainerResources(
                        name="main",
                        dynamic_resources=[
                            pb.DynamicResource(
                                claim_name=claim,
                                claim_namespace="ml",
                                claim_resources=[
                                    pb.ClaimResource(
                                        driver_name=driver, pool_name=pool, device_name=device
                                    )
                                ],
                            )
                            for claim, driver, pool, device in claims
                        ],
                    )
                ],
            )
        ]
    )
    watcher = watcher_for(slices, EXPORTER)
    with serve_reply(reply, socket):
        collector = collector_for(socket, watcher)
        try:
            watcher.start()
            until(lambda: watcher.synced, "the first list")
            with caplog.at_level(logging.WARNING):
                # Two polls in all: the poller's first (at once, then hourly) and one more.
                # (Two explicit polls raced the poller that the first collect() starts.)
                collector.start()
                until(lambda: unresolved(collector), "the poller's first answer")
                collector.poll()
            gpu = uuids()
            mig = "MIG-11111111-2222-3333-4444-555555555555"
            assert allocation(collector) == {
                ("2", gpu[2], "ml", "mixed", "main", "good"),
                ("", mig, "ml", "mixed", "main", "mig"),
            }
            channels = samples(collector.collect(), COMPUTE_DOMAIN_CHANNEL_ALLOCATION_INFO.name)
            assert [dict(k)["device"] for k in channels] == ["channel-0"]
            assert unresolved(collector) == {
                "no_uuid": 2,
                "unknown_device": 2,
                "unknown_driver": 2,
                "slices_unavailable": 0,
            }
            messages = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
            assert sorted(m.split(": ")[1].split(" ")[0] for m in messages) == [
                "no_uuid",
                "unknown_device",
                "unknown_driver",
            ]
            details = " ".join(str(r.__dict__.get("detail")) for r in caplog.records)
            assert "claim elsewhere" in details
            assert "fpga.example.com" in details
        finally:
            collector.close()


def test_an_older_kubelet_without_dynamic_resources(
    slices: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reply without field 5 (a kubelet before 1.34): device-plugin GPUs still exported,
    and the missing claims named once."""
    socket = tmp_path / "kubelet.sock"
    scenario = replace(
        load_scenario("dgx-h100"),
        pods=(PodSpec(namespace="ml", name="old", container="main", gpus=(4,)),),
    )
    watcher = watcher_for(slices, EXPORTER)
    with serve_kubelet(scenario, socket, node=NODE):
        collector = collector_for(socket, watcher)
        try:
            watcher.start()
            until(lambda: watcher.synced, "the first list")
            with caplog.at_level(logging.INFO):
                collector.poll()
                collector.poll()
            gpu = uuids()
            assert allocation(collector) == {("4", gpu[4], "ml", "old", "main", "")}
            named = [
                r for r in caplog.records if "KubeletPodResourcesDynamicResources" in r.getMessage()
            ]
            assert len(named) == 1
        finally:
            collector.close()


def serve_reply(reply: Any, socket: Path) -> Any:
    """A kubelet answering `reply` on `socket` (a context manager)."""
    import contextlib
    from concurrent import futures

    import grpc

    from fleetwatch.collectors.sources import podresources_pb2_grpc as pb_grpc

    class Kubelet(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
        def List(self, request: Any, context: Any) -> Any:
            return reply

    @contextlib.contextmanager
    def serving() -> Iterator[None]:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        pb_grpc.add_PodResourcesListerServicer_to_server(Kubelet(), server)
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        try:
            yield
        finally:
            server.stop(grace=None).wait()

    return serving()
