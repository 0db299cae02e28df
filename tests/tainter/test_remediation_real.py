"""Removal from the run and the node condition on a real API server: the opted-in GPU
pods of a node tainted for a listed reason are evicted through policy/v1 (PDBs honoured,
never forced), nothing else is; one node of a training job at a time; `--dry-run` writes
nothing; `GPUHealthy` follows the fleetwatch taints and leaves other conditions alone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fleetwatch.rules.config import load_config
from fleetwatch.tainter.condition import ConditionKeeper, camel_case
from fleetwatch.tainter.election import Leadership
from fleetwatch.tainter.evict import EVICT_LABEL, MIRROR_ANNOTATION, Evictor
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.kube_objects import ApiError, PodView
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.settings import EvictionSettings, NodeConditionSettings, RetryPolicy
from fleetwatch.tainter.writes import DryRunNodeApi
from tests.tainter.conftest import ControllerFactory, FakeEvidence, alert, keys, resolved, webhook
from tests.tainter.realkube import RealCluster

pytestmark = pytest.mark.integration

NS = "jobs"
OPT_IN = {EVICT_LABEL: "true"}
JOBSET = "jobset.sigs.k8s.io/jobset-name"
RETRY = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.01)


@pytest.fixture
def cluster(real_cluster: RealCluster) -> RealCluster:
    real_cluster.fresh_namespace(NS)
    return real_cluster


@pytest.fixture
def kube(real_kube: KubeNodeApi, cluster: RealCluster) -> KubeNodeApi:
    return real_kube


class CountingApi:
    """The real client, counting eviction requests (to see retries the server refused)."""

    def __init__(self, real: KubeNodeApi) -> None:
        self.real = real
        self.evictions = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    async def evict_pod(self, *, namespace: str, name: str) -> None:
        self.evictions += 1
        await self.real.evict_pod(namespace=namespace, name=name)


def evictor(
    api: Any,
    metrics: TainterMetrics,
    *,
    dry_run: bool = False,
    **settings: Any,
) -> Evictor:
    settings.setdefault("reasons", frozenset({"gpu-overheat"}))
    settings.setdefault("pdb_backoff", 0.01)
    return Evictor(
        api=api,
        leadership=Leadership(renew_deadline=None),
        metrics=metrics,
        settings=EvictionSettings(**settings),
        job_label_keys=load_config().job_label_keys,
        retry=RETRY,
        dry_run=dry_run,
        owner="fleetwatch-tainter",
    )


def keeper(api: KubeNodeApi, metrics: TainterMetrics, *, dry_run: bool = False) -> ConditionKeeper:
    return ConditionKeeper(
        api=api,
        leadership=Leadership(renew_deadline=None),
        metrics=metrics,
        settings=NodeConditionSettings(),
        retry=RETRY,
        dry_run=dry_run,
    )


def count(metrics: TainterMetrics, result: str, reason: str = "gpu-overheat") -> float:
    value = metrics.registry.get_sample_value(
        "fleetwatch_tainter_evictions_total", {"reason": reason, "result": result}
    )
    return value or 0.0


async def taint(controller: Any, *nodes: str, reason: str = "gpu-overheat") -> None:
    await controller.handle_alerts(
        parse_webhook(webhook(*(alert(n, reason=reason) for n in nodes)))
    )


async def test_only_the_opted_in_gpu_pods_of_the_tainted_node_are_evicted(
    make_controller: ControllerFactory, cluster: RealCluster, kube: KubeNodeApi
) -> None:
    cluster.run_pod("train", namespace=NS, node="gpu-0", labels=OPT_IN)  # no owner: fine
    cluster.run_pod("unlabelled", namespace=NS, node="gpu-0")
    cluster.run_pod("ds", namespace=NS, node="gpu-0", labels=OPT_IN, owner_kind="DaemonSet")
    cluster.run_pod(
        "mirror", namespace=NS, node="gpu-0", labels=OPT_IN, annotations={MIRROR_ANNOTATION: "x"}
    )
    cluster.run_pod("cpu-only", namespace=NS, node="gpu-0", labels=OPT_IN, gpus=0)
    cluster.run_pod("elsewhere", namespace=NS, node="gpu-1", labels=OPT_IN)
    metrics = TainterMetrics()
    controller = make_controller(metrics=metrics, after_sync=[evictor(kube, metrics)])

    await taint(controller, "gpu-0")
    await controller.reconcile()  # a second pass changes nothing and reports nothing again

    assert keys(cluster, "gpu-0") == ["fleetwatch.io/gpu-overheat"]
    assert cluster.terminating(NS) == {"train"}
    for result in ("evicted", "skipped_no_label", "skipped_daemonset", "skipped_mirror"):
        assert count(metrics, result) == 1, result
    (event,) = cluster.pod_events(NS, "train", "EvictedForTaint")
    assert "fleetwatch.io/gpu-overheat" in event["message"]
    assert len(cluster.events_for("gpu-0", "EvictedForTaint")) == 1


async def test_a_reason_not_listed_evicts_nothing(
    make_controller: ControllerFactory, cluster: RealCluster, kube: KubeNodeApi
) -> None:
    cluster.run_pod("train", namespace=NS, node="gpu-0", labels=OPT_IN)
    metrics = TainterMetrics()
    controller = make_controller(
        metrics=metrics, after_sync=[evictor(kube, metrics, reasons=frozenset({"xid"}))]
    )
    await taint(controller, "gpu-0")
    assert keys(cluster, "gpu-0") == ["fleetwatch.io/gpu-overheat"]
    assert cluster.terminating(NS) == set()


async def test_a_pdb_refusal_is_retried_reported_and_never_forced(
    make_controller: ControllerFactory, cluster: RealCluster, kube: KubeNodeApi
) -> None:
    cluster.run_pod("train-0", namespace=NS, node="gpu-0", labels={**OPT_IN, JOBSET: "t"})
    cluster.budget(NS, "train", selector={JOBSET: "t"}, allowed=0)
    metrics = TainterMetrics()
    api = CountingApi(kube)
    controller = make_controller(
        metrics=metrics, after_sync=[evictor(api, metrics, pdb_attempts=3)]
    )

    await taint(controller, "gpu-0")

    assert api.evictions == 3
    assert cluster.terminating(NS) == set()
    assert "deletionTimestamp" not in cluster.pod(NS, "train-0")["metadata"]
    assert count(metrics, "blocked_by_pdb") == 1
    (event,) = cluster.pod_events(NS, "train-0", "EvictionBlocked")
    assert "disruption budget" in event["message"]
    assert len(cluster.events_for("gpu-0", "EvictionBlocked")) == 1

    cluster.budget(NS, "train", selector={JOBSET: "t"}, allowed=1)
    await controller.reconcile()
    assert cluster.terminating(NS) == {"train-0"}
    assert count(metrics, "evicted") == 1


async def test_one_node_of_a_training_job_at_a_time(
    make_controller: ControllerFactory, cluster: RealCluster, kube: KubeNodeApi
) -> None:
    for index in range(2):
        cluster.run_pod(
            f"train-{index}", namespace=NS, node=f"gpu-{index}", labels={**OPT_IN, JOBSET: "t"}
        )
    cluster.run_pod("other", namespace=NS, node="gpu-1", labels={**OPT_IN, JOBSET: "other"})
    metrics = TainterMetrics()
    controller = make_controller(metrics=metrics, after_sync=[evictor(kube, metrics)])

    await taint(controller, "gpu-0", "gpu-1")  # both nodes synced at once

    first = cluster.terminating(NS)
    assert first in ({"train-0", "other"}, {"train-1", "other"})  # another job is not held
    await controller.reconcile()
    assert cluster.terminating(NS) == first  # the first node's pod is still terminating
    assert count(metrics, "deferred_same_job") == 2

    (gone,) = first - {"other"}
    cluster.remove_pod(NS, gone)  # its kubelet confirms: the pod is gone
    await controller.reconcile()
    assert cluster.terminating(NS) == {"train-0", "train-1", "other"} - {gone}


async def test_dry_run_evicts_nothing_and_says_what_it_would_do(
    make_controller: ControllerFactory, cluster: RealCluster, kube: KubeNodeApi
) -> None:
    cluster.run_pod("train", namespace=NS, node="gpu-0", labels=OPT_IN)
    before = cluster.versions()
    metrics = TainterMetrics()
    controller = make_controller(
        api=DryRunNodeApi(real=kube),
        metrics=metrics,
        dry_run=True,
        after_sync=[keeper(kube, metrics, dry_run=True), evictor(kube, metrics, dry_run=True)],
    )

    await taint(controller, "gpu-0")
    await controller.reconcile()

    assert cluster.versions() == before  # no taint, no condition
    assert cluster.terminating(NS) == set()
    assert count(metrics, "dry_run") == 1
    (event,) = cluster.pod_events(NS, "train", "EvictedForTaint")
    assert event["message"].startswith("dry run: would evict jobs/train")


def conditions(cluster: RealCluster, node: str) -> dict[str, dict[str, Any]]:
    found = cluster.node(node).get("status", {}).get("conditions", [])
    return {c["type"]: c for c in found}


def report_ready(cluster: RealCluster, node: str, extra: list[dict[str, Any]]) -> None:
    """Write the node's status as a kubelet and another detector would."""
    cluster.server.call(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                    *extra,
                ]
            }
        },
        content_type="application/strategic-merge-patch+json",
    )


def test_a_taint_reason_is_a_camel_case_condition_reason() -> None:
    assert camel_case("gpu-overheat") == "GpuOverheat"
    assert camel_case("row-remap-failed") == "RowRemapFailed"
    assert camel_case("xid") == "Xid"


async def test_the_condition_follows_the_taints_and_leaves_others_alone(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    kube: KubeNodeApi,
    evidence: FakeEvidence,
) -> None:
    report_ready(cluster, "gpu-0", [{"type": "MemoryPressure", "status": "False"}])
    ready = conditions(cluster, "gpu-0")["Ready"]
    metrics = TainterMetrics()
    controller = make_controller(metrics=metrics, after_sync=[keeper(kube, metrics)])

    await taint(controller, "gpu-0")
    held = conditions(cluster, "gpu-0")
    assert held["Ready"] == ready
    assert held["MemoryPressure"]["status"] == "False"
    gpu = held["GPUHealthy"]
    assert (gpu["status"], gpu["reason"]) == ("False", "GpuOverheat")
    assert "GPUOverheating" in gpu["message"]
    assert "GPUHealthy" not in conditions(cluster, "gpu-1")  # untouched nodes get none

    evidence.clear["gpu-0"] = True
    await controller.handle_alerts(parse_webhook(webhook(resolved("gpu-0"))))
    assert keys(cluster, "gpu-0") == []
    after = conditions(cluster, "gpu-0")
    assert (after["GPUHealthy"]["status"], after["Ready"]) == ("True", ready)


async def test_transition_time_moves_only_when_the_status_changes(
    make_controller: ControllerFactory, cluster: RealCluster, kube: KubeNodeApi
) -> None:
    old = "2020-01-01T00:00:00Z"
    stale = {
        "type": "GPUHealthy",
        "status": "False",
        "reason": "Xid",
        "message": "an older taint",
        "lastTransitionTime": old,
        "lastHeartbeatTime": old,
    }
    report_ready(cluster, "gpu-0", [stale])
    report_ready(cluster, "gpu-1", [{**stale, "status": "True"}])
    metrics = TainterMetrics()
    controller = make_controller(metrics=metrics, after_sync=[keeper(kube, metrics)])

    await taint(controller, "gpu-0", "gpu-1")

    same = conditions(cluster, "gpu-0")["GPUHealthy"]
    assert (same["reason"], same["lastTransitionTime"]) == ("GpuOverheat", old)
    assert same["lastHeartbeatTime"] != old
    flipped = conditions(cluster, "gpu-1")["GPUHealthy"]
    assert (flipped["status"], flipped["lastTransitionTime"] != old) == ("False", True)


def test_pods_are_read_with_what_eviction_decides_on(cluster: RealCluster) -> None:
    from fleetwatch.tainter.kube_objects import pod_from_api

    pod = pod_from_api(
        cluster.run_pod("ds", namespace=NS, node="gpu-0", labels=OPT_IN, owner_kind="DaemonSet")
    )
    assert pod == PodView(
        namespace=NS,
        name="ds",
        uid=pod.uid,
        node_name="gpu-0",
        labels=OPT_IN,
        annotations={},
        owner_kinds=("DaemonSet",),
        phase="Running",
        terminating=False,
        gpu_request=True,
    )


class FaultyApi(CountingApi):
    """The real client whose evictions answer `status` (what a real server cannot be made
    to answer on demand), after `latency` seconds."""

    def __init__(self, real: KubeNodeApi, *, status: int, latency: float = 0.0) -> None:
        super().__init__(real)
        self.status = status
        self.latency = latency

    async def evict_pod(self, *, namespace: str, name: str) -> None:
        self.evictions += 1
        await asyncio.sleep(self.latency)
        raise ApiError(status=self.status, reason=f"injected {self.status}: admission webhook x")


@pytest.mark.parametrize("status", [403, 500])
async def test_an_eviction_refused_for_another_reason_is_logged_counted_and_left(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    kube: KubeNodeApi,
    status: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster.run_pod("train", namespace=NS, node="gpu-0", labels=OPT_IN)
    metrics = TainterMetrics()
    api = FaultyApi(kube, status=status, latency=0.05)
    controller = make_controller(metrics=metrics, after_sync=[evictor(api, metrics)])

    await taint(controller, "gpu-0")  # the taint is written; the webhook does not fail

    assert keys(cluster, "gpu-0") == ["fleetwatch.io/gpu-overheat"]
    assert api.evictions == 1  # not retried as if it were a PDB
    assert count(metrics, "error") == 1
    assert cluster.pod_events(NS, "train", "EvictedForTaint") == []
    assert cluster.pod_events(NS, "train", "EvictionBlocked") == []
    (record,) = [r for r in caplog.records if r.getMessage().startswith("eviction refused")]
    assert f"injected {status}: admission webhook x" in record.__dict__["error"]


async def test_the_rate_limit_defers_what_is_over_it(
    make_controller: ControllerFactory, cluster: RealCluster, kube: KubeNodeApi
) -> None:
    for index in range(3):
        cluster.run_pod(f"p-{index}", namespace=NS, node="gpu-0", labels=OPT_IN)
    metrics = TainterMetrics()
    controller = make_controller(
        metrics=metrics, after_sync=[evictor(kube, metrics, max_per_minute=2)]
    )
    await taint(controller, "gpu-0")
    assert len(cluster.terminating(NS)) == 2
    assert count(metrics, "rate_limited") == 1
