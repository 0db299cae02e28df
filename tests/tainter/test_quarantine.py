"""Repeat offenders, on a real Kubernetes API server: the `--quarantine.after`-th taint for
one reason within the window quarantines it (label, Event, metric) and the taint stays on
clear evidence; the history lives on the node, so a new process (or leader) continues it;
`fleetwatch untaint` (or the untaint annotation) lifts the quarantine and forgets the
history; old taints outside the window do not count; a history a person broke is logged,
counted and read as empty."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from fleetwatch.tainter.controller import Controller
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.quarantine import HISTORY_ANNOTATION, QUARANTINE_LABEL, History
from fleetwatch.tainter.service import manual_untaint
from fleetwatch.tainter.settings import QuarantineSettings
from tests.tainter.conftest import (
    ControllerFactory,
    FakeEvidence,
    alert,
    keys,
    resolved,
    webhook,
)
from tests.tainter.realkube import RealCluster

pytestmark = pytest.mark.integration
OVERHEAT = "fleetwatch.io/gpu-overheat"


@pytest.fixture
def cluster(real_cluster: RealCluster) -> RealCluster:
    return real_cluster


@pytest.fixture
def kube(real_kube: KubeNodeApi) -> KubeNodeApi:
    return real_kube


def sample(metrics: TainterMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def history(cluster: RealCluster, node: str) -> dict[str, Any]:
    text = cluster.node(node)["metadata"].get("annotations", {}).get(HISTORY_ANNOTATION)
    return {} if text is None else dict(json.loads(text))


async def overheat_then_cool(
    controller: Controller, evidence: FakeEvidence, node: str, episode: int
) -> None:
    """One episode: the GPU overheats (tainted), then cools while idle (evidence clear)."""
    fingerprint = f"fp-{episode}"
    await controller.handle_alerts(parse_webhook(webhook(alert(node, fp=fingerprint))))
    evidence.clear[node] = True
    await controller.handle_alerts(parse_webhook(webhook(resolved(node, fp=fingerprint))))


async def test_third_taint_within_the_window_quarantines_until_untaint(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    evidence: FakeEvidence,
    kube: KubeNodeApi,
) -> None:
    first = make_controller()
    for episode in range(2):
        await overheat_then_cool(first, evidence, "gpu-1", episode)
        assert keys(cluster, "gpu-1") == []  # cool while idle: untainted, twice
    assert len(history(cluster, "gpu-1")["taints"]["gpu-overheat"]) == 2

    metrics = TainterMetrics()
    second = make_controller(metrics=metrics)  # a restart, or a new leader: memory is empty
    await overheat_then_cool(second, evidence, "gpu-1", 2)
    node = cluster.node("gpu-1")
    assert keys(cluster, "gpu-1") == [OVERHEAT]  # evidence clear, hold 0: still tainted
    assert node["metadata"]["labels"][QUARANTINE_LABEL] == "gpu-overheat"
    assert history(cluster, "gpu-1")["quarantined"] == ["gpu-overheat"]
    (event,) = cluster.events_for("gpu-1", "NodeQuarantined")
    assert event["type"] == "Warning"
    assert "fleetwatch untaint gpu-1 --reason=gpu-overheat" in event["message"]
    assert sample(metrics, "fleetwatch_tainter_quarantines_total", reason="gpu-overheat") == 1
    assert sample(metrics, "fleetwatch_tainter_quarantined_nodes") == 1
    assert sample(metrics, "fleetwatch_tainter_untaint_deferred_total", why="quarantined") >= 1
    await second.reconcile()
    assert keys(cluster, "gpu-1") == [OVERHEAT]
    assert sample(metrics, "fleetwatch_tainter_quarantined_nodes") == 1
    assert second.breaker.sharing == frozenset()  # it waits for a person

    removed = await manual_untaint(
        api=kube, node="gpu-1", reasons=frozenset({"gpu-overheat"}), who="tester"
    )
    assert removed == [OVERHEAT]
    node = cluster.node("gpu-1")
    assert QUARANTINE_LABEL not in node["metadata"].get("labels", {})
    assert HISTORY_ANNOTATION not in node["metadata"].get("annotations", {})
    await second.reconcile()
    assert sample(metrics, "fleetwatch_tainter_quarantined_nodes") == 0
    await overheat_then_cool(second, evidence, "gpu-1", 3)  # counting starts again
    assert keys(cluster, "gpu-1") == []


async def test_the_untaint_annotation_lifts_a_quarantine(
    make_controller: ControllerFactory, cluster: RealCluster, evidence: FakeEvidence
) -> None:
    controller = make_controller(quarantine=QuarantineSettings(after=2))
    for episode in range(2):
        await overheat_then_cool(controller, evidence, "gpu-2", episode)
    assert keys(cluster, "gpu-2") == [OVERHEAT]
    cluster.mutate(
        "gpu-2",
        lambda n: n["metadata"]["annotations"].update({"fleetwatch.io/untaint": "gpu-overheat"}),
    )
    await controller.reconcile()
    node = cluster.node("gpu-2")
    assert keys(cluster, "gpu-2") == []
    assert QUARANTINE_LABEL not in node["metadata"].get("labels", {})
    assert HISTORY_ANNOTATION not in node["metadata"].get("annotations", {})


async def test_taints_older_than_the_window_do_not_count(
    make_controller: ControllerFactory, cluster: RealCluster
) -> None:
    now = int(time.time())
    old = History(taints={"gpu-overheat": (now - 3 * 86400, now - 2 * 86400)}).to_annotation()
    assert old is not None
    cluster.mutate(
        "gpu-3", lambda n: n["metadata"]["annotations"].update({HISTORY_ANNOTATION: old})
    )
    controller = make_controller()
    await controller.handle_alerts(parse_webhook(webhook(alert("gpu-3"))))
    assert QUARANTINE_LABEL not in cluster.node("gpu-3")["metadata"]["labels"]
    (when,) = history(cluster, "gpu-3")["taints"]["gpu-overheat"]  # the old ones pruned
    assert when.endswith("Z")


@pytest.mark.parametrize(
    "garbage",
    ['{"taints": ', '["gpu-overheat"]', '{"taints": {"gpu-overheat": ["yesterday"]}}'],
    ids=["not-json", "not-an-object", "bad-time"],
)
async def test_a_broken_history_is_counted_and_read_as_empty(
    make_controller: ControllerFactory, cluster: RealCluster, garbage: str
) -> None:
    cluster.mutate(
        "gpu-4", lambda n: n["metadata"]["annotations"].update({HISTORY_ANNOTATION: garbage})
    )
    metrics = TainterMetrics()
    controller = make_controller(metrics=metrics)
    await controller.handle_alerts(parse_webhook(webhook(alert("gpu-4"))))
    assert keys(cluster, "gpu-4") == [OVERHEAT]
    assert len(history(cluster, "gpu-4")["taints"]["gpu-overheat"]) == 1  # rewritten whole
    assert (
        sample(
            metrics,
            "fleetwatch_tainter_malformed_annotations_total",
            annotation=HISTORY_ANNOTATION,
        )
        >= 1
    )
