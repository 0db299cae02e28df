"""The controller on a real Kubernetes API server through the real client: adds, removes,
races, breaker, dry-run, manual reasons, hold time, evidence, restart.

A race at a chosen moment is a real second writer changing the node between the
controller's read and its patch, so the real server answers the stale write with 409.
Injected API failures (429, 500, an outage) are in test_faults.py, on the simulated API."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import pytest

from fleetwatch.tainter.breaker import Breaker
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.kube_objects import NodeView, Taint
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.service import manual_untaint
from fleetwatch.tainter.settings import BreakerPolicy
from fleetwatch.tainter.writes import DryRunNodeApi
from tests.tainter.conftest import (
    T0,
    Clock,
    ControllerFactory,
    FakeAlerts,
    FakeEvidence,
    alert,
    keys,
    resolved,
    webhook,
)
from tests.tainter.realkube import RealCluster

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(real_cluster: RealCluster) -> RealCluster:
    return real_cluster


@pytest.fixture
def kube(real_kube: KubeNodeApi) -> KubeNodeApi:
    return real_kube


class RacingNodeApi:
    """The real client, where another writer's change (`arm`) lands just before the next
    patch, once; counts the patches the server accepted."""

    def __init__(self, *, real: KubeNodeApi) -> None:
        self._real = real
        self._race: Callable[[], None] | None = None
        self.accepted = 0

    def arm(self, race: Callable[[], None]) -> None:
        """Run `race` right before the next patch is sent."""
        self._race = race

    async def get_node(self, name: str) -> NodeView:
        return await self._real.get_node(name)

    async def list_nodes(self, *, label_selector: str = "") -> list[NodeView]:
        return await self._real.list_nodes(label_selector=label_selector)

    async def patch_node(
        self,
        name: str,
        *,
        resource_version: str,
        taints: Sequence[Taint] | None,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> NodeView:
        race, self._race = self._race, None
        if race is not None:
            race()
        written = await self._real.patch_node(
            name,
            resource_version=resource_version,
            taints=taints,
            labels=labels,
            annotations=annotations,
        )
        self.accepted += 1
        return written

    async def create_event(
        self, *, node: NodeView, reason: str, message: str, warning: bool
    ) -> None:
        await self._real.create_event(node=node, reason=reason, message=message, warning=warning)


def states(*alerts: dict[str, Any]) -> Any:
    return parse_webhook(webhook(*alerts))


def foreign_taint(key: str = "example.com/maintenance") -> dict[str, str]:
    return {"key": key, "value": "true", "effect": "NoSchedule"}


def sample(metrics: TainterMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_firing_alert_taints_node_with_key_value_effect_record_label_and_event(
    make_controller: ControllerFactory,
    cluster: RealCluster,
) -> None:
    controller = make_controller()
    await controller.handle_alerts(states(alert("gpu-1", effect="PreferNoSchedule")))

    node = cluster.node("gpu-1")
    assert [(t["key"], t["value"], t["effect"]) for t in cluster.taints("gpu-1")] == [
        ("fleetwatch.io/gpu-overheat", "GPUOverheating", "PreferNoSchedule")
    ]
    record = json.loads(node["metadata"]["annotations"]["fleetwatch.io/taints"])
    assert record["fleetwatch.io/gpu-overheat"]["alert"] == "GPUOverheating"
    assert record["fleetwatch.io/gpu-overheat"]["owner"] == "fleetwatch-tainter"
    assert record["fleetwatch.io/gpu-overheat"]["fingerprints"] == ["fp-gpu-1-gpu-overheat"]
    assert node["metadata"]["labels"]["fleetwatch.io/tainted"] == "true"
    assert "unschedulable" not in node["spec"]
    assert len(cluster.events_for("gpu-1", "TaintAdded")) == 1
    assert keys(cluster, "gpu-2") == []


async def test_duplicates_and_repeats_write_once(
    make_controller: ControllerFactory,
    cluster: RealCluster,
) -> None:
    controller = make_controller()
    before = cluster.versions()
    await controller.handle_alerts(states(alert("gpu-1"), alert("gpu-1")))
    after_first = cluster.versions()
    for _ in range(2):
        await controller.handle_alerts(states(alert("gpu-1"), alert("gpu-1")))
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]
    assert [n for n in before if before[n] != after_first[n]] == ["gpu-1"]
    assert cluster.versions() == after_first
    assert len(cluster.events_for("gpu-1", "TaintAdded")) == 1


async def test_late_firing_copy_after_resolve_is_ignored(
    make_controller: ControllerFactory,
    cluster: RealCluster,
) -> None:
    controller = make_controller()
    await controller.handle_alerts(states(alert("gpu-1")))
    await controller.handle_alerts(states(resolved("gpu-1")))
    # hold 0 but evidence not clear: still tainted, and the stale firing copy must not
    # revive the alert so that the taint leaves once evidence turns clear.
    await controller.handle_alerts(states(alert("gpu-1")))
    assert all(not i.firing for i in controller.intents())
    # a new episode (later startsAt) does count again
    await controller.handle_alerts(states(alert("gpu-1", starts=T0 + timedelta(hours=1))))
    assert [bool(i.firing) for i in controller.intents()] == [True]


async def test_taint_stays_while_any_alert_for_the_key_fires(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    evidence: FakeEvidence,
) -> None:
    evidence.clear["gpu-1"] = True
    controller = make_controller()
    await controller.handle_alerts(states(alert("gpu-1", fp="a"), alert("gpu-1", fp="b")))
    await controller.handle_alerts(states(resolved("gpu-1", fp="a")))
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]
    await controller.handle_alerts(states(resolved("gpu-1", fp="b")))
    assert keys(cluster, "gpu-1") == []
    assert cluster.node("gpu-1")["metadata"]["labels"].get("fleetwatch.io/tainted") is None
    assert "fleetwatch.io/taints" not in cluster.node("gpu-1")["metadata"].get("annotations", {})
    assert len(cluster.events_for("gpu-1", "TaintRemoved")) == 1


async def test_resolve_without_positive_evidence_keeps_taint(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    evidence: FakeEvidence,
) -> None:
    evidence.clear["gpu-1"] = False  # exporter down / data missing / still hot
    metrics = TainterMetrics()
    controller = make_controller(metrics=metrics)
    await controller.handle_alerts(states(alert("gpu-1")))
    await controller.handle_alerts(states(resolved("gpu-1")))
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]
    assert evidence.asked == ["gpu-1"]
    assert sample(metrics, "fleetwatch_tainter_untaint_deferred_total", why="evidence") == 1
    evidence.clear["gpu-1"] = True
    await controller.reconcile()
    assert keys(cluster, "gpu-1") == []


async def test_hold_time_keeps_taint_without_asking_prometheus(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    evidence: FakeEvidence,
) -> None:
    evidence.clear["gpu-1"] = True
    controller = make_controller(hold_seconds=3600.0)
    await controller.handle_alerts(states(alert("gpu-1")))
    await controller.handle_alerts(states(resolved("gpu-1")))
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]
    assert evidence.asked == []


@pytest.mark.parametrize("reason", ["xid-critical", "gpu-lost", "made-up-reason"])
async def test_manual_reasons_and_reasons_without_query_stay_until_untaint(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    evidence: FakeEvidence,
    kube: KubeNodeApi,
    alerts_source: FakeAlerts,
    reason: str,
) -> None:
    evidence.clear["gpu-1"] = True
    # xid-critical has a query but is manual (as the contract declares it); gpu-lost is
    # manual without one; made-up-reason has no query at all, so it waits for a person too.
    evidence.reasons = frozenset({"gpu-overheat", "xid-critical"})
    alerts_source.firing = list(states(alert("gpu-1", reason="gpu-overheat")))
    controller = make_controller(manual_reasons=("xid-critical", "gpu-lost"))
    await controller.handle_alerts(
        states(alert("gpu-1", reason=reason), alert("gpu-1", reason="gpu-overheat"))
    )
    await controller.handle_alerts(states(resolved("gpu-1", reason=reason)))
    await controller.reconcile()
    assert sorted(keys(cluster, "gpu-1")) == sorted(
        ["fleetwatch.io/gpu-overheat", f"fleetwatch.io/{reason}"]
    )

    removed = await manual_untaint(
        api=kube, node="gpu-1", reasons=frozenset({reason}), who="tester"
    )
    assert removed == [f"fleetwatch.io/{reason}"]
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]
    event = cluster.events_for("gpu-1", "TaintRemoved")[-1]
    assert "tester" in event["message"]
    await controller.reconcile()  # the controller forgets it and does not restore it
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]


async def test_untaint_annotation_removes_and_clears_request(
    make_controller: ControllerFactory,
    cluster: RealCluster,
) -> None:
    controller = make_controller()
    await controller.handle_alerts(states(alert("gpu-1", reason="xid")))
    cluster.mutate(
        "gpu-1", lambda n: n["metadata"]["annotations"].update({"fleetwatch.io/untaint": "xid"})
    )
    await controller.reconcile()
    assert keys(cluster, "gpu-1") == []
    assert "fleetwatch.io/untaint" not in cluster.node("gpu-1")["metadata"].get("annotations", {})
    assert "operator asked" in cluster.events_for("gpu-1", "TaintRemoved")[0]["message"]


async def test_foreign_taint_added_between_get_and_patch_survives(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    kube: KubeNodeApi,
) -> None:
    metrics = TainterMetrics()
    racing = RacingNodeApi(real=kube)
    racing.arm(
        lambda: cluster.mutate(
            "gpu-1", lambda n: n["spec"].setdefault("taints", []).append(foreign_taint())
        )
    )
    controller = make_controller(api=racing, metrics=metrics)
    await controller.handle_alerts(states(alert("gpu-1")))
    assert keys(cluster, "gpu-1") == ["example.com/maintenance", "fleetwatch.io/gpu-overheat"]
    assert sample(metrics, "fleetwatch_tainter_api_conflicts_total") == 1
    assert racing.accepted == 1  # the stale write was refused (409), ours applied once


async def test_foreign_taint_removed_between_get_and_patch_stays_removed(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    kube: KubeNodeApi,
    evidence: FakeEvidence,
) -> None:
    evidence.clear["gpu-1"] = True
    cluster.mutate("gpu-1", lambda n: n["spec"].update(taints=[foreign_taint()]))
    racing = RacingNodeApi(real=kube)
    controller = make_controller(api=racing)
    await controller.handle_alerts(states(alert("gpu-1")))
    racing.arm(
        lambda: cluster.mutate(
            "gpu-1",
            lambda n: n["spec"].update(
                taints=[t for t in n["spec"]["taints"] if t["key"] != "example.com/maintenance"]
            ),
        )
    )
    await controller.handle_alerts(states(resolved("gpu-1")))
    assert keys(cluster, "gpu-1") == []
    assert racing.accepted == 2  # the add; the stale removal refused, then re-planned


async def test_breaker_caps_new_nodes_keeps_removing_and_resets(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    evidence: FakeEvidence,
    alerts_source: FakeAlerts,
) -> None:
    metrics = TainterMetrics()
    controller = make_controller(max_new_taints=100, max_fraction=0.3, metrics=metrics)  # 3 of 10
    firing = states(*(alert(f"gpu-{i}") for i in range(6)))
    alerts_source.firing = list(firing)
    await controller.handle_alerts(firing)
    tainted = sorted(n for n in cluster.nodes if keys(cluster, n))
    assert len(tainted) == 3
    assert sample(metrics, "fleetwatch_tainter_breaker_open") == 1
    refusals = [e for i in range(6) for e in cluster.events_for(f"gpu-{i}", "TaintRefused")]
    assert len(refusals) == 3
    assert all("share cap: 3 of 10 selected nodes" in e["message"] for e in refusals)
    assert "--breaker.max-fraction=0.3 allows 3" in refusals[0]["message"]
    assert sample(metrics, "fleetwatch_tainter_breaker_refusals_total", cap="share") == 3
    # a second reason on an already tainted node is not a new node: allowed; xid waits for
    # a person, so that node no longer counts toward the share
    await controller.handle_alerts(states(alert(tainted[0], reason="xid")))
    assert "fleetwatch.io/xid" in keys(cluster, tainted[0])
    # a recovered node is untainted although the breaker is open
    evidence.clear[tainted[1]] = True
    alerts_source.firing = [a for a in firing if a.node != tainted[1]]
    await controller.handle_alerts(states(resolved(tainted[1])))
    assert keys(cluster, tainted[1]) == []
    await controller.reconcile()  # still open: nothing new tainted
    assert sum(bool(keys(cluster, n)) for n in cluster.nodes) == 2
    controller.reset_breaker(by="tester")
    await controller.reconcile()  # live state re-evaluated, up to the cap again
    assert sum(bool(keys(cluster, n)) for n in cluster.nodes) == 4  # 3 sharing + the xid one
    assert len(controller.breaker.sharing) == 3
    assert controller.breaker.open


async def test_breaker_rate_cap_closes_by_itself_once_the_window_passes(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    evidence: FakeEvidence,
) -> None:
    clock = Clock()
    controller = make_controller(
        max_new_taints=1, window=600.0, max_fraction=1.0, auto_close=True, clock=clock
    )
    await controller.handle_alerts(states(alert("gpu-1"), alert("gpu-2")))
    assert sum(bool(keys(cluster, n)) for n in cluster.nodes) == 1
    assert controller.breaker.open
    assert controller.breaker.opened_by == "new_taints"
    evidence.clear = {"gpu-1": True, "gpu-2": True}
    await controller.handle_alerts(states(resolved("gpu-1"), resolved("gpu-2")))
    assert sum(bool(keys(cluster, n)) for n in cluster.nodes) == 0
    assert controller.breaker.open  # untainting does not undo a take-out: the rate stands
    clock.now += 601.0
    await controller.reconcile()
    assert not controller.breaker.open


async def test_dry_run_writes_nothing_but_records_events_and_metrics(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    kube: KubeNodeApi,
    evidence: FakeEvidence,
) -> None:
    metrics = TainterMetrics()
    controller = make_controller(
        api=DryRunNodeApi(real=kube), dry_run=True, metrics=metrics, max_new_taints=1
    )
    before = cluster.versions()
    await controller.handle_alerts(states(alert("gpu-1"), alert("gpu-2")))
    assert cluster.versions() == before
    assert sample(metrics, "fleetwatch_tainter_dry_run_actions_total", op="add") == 1
    assert sample(metrics, "fleetwatch_tainter_breaker_open") == 1
    added = [e for n in ("gpu-1", "gpu-2") for e in cluster.events_for(n, "TaintAdded")]
    assert len(added) == 1
    assert added[0]["message"].startswith("dry run:")
    evidence.clear = {"gpu-1": True, "gpu-2": True}
    await controller.handle_alerts(states(resolved("gpu-1"), resolved("gpu-2")))
    assert sample(metrics, "fleetwatch_tainter_dry_run_actions_total", op="remove") == 1
    assert cluster.versions() == before


async def test_restart_rebuilds_state_from_nodes_and_alertmanager(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    evidence: FakeEvidence,
    alerts_source: FakeAlerts,
) -> None:
    first = make_controller()
    await first.handle_alerts(states(alert("gpu-1"), alert("gpu-2"), alert("gpu-3")))
    # while "down": gpu-3's taint was removed by someone (it is still firing), gpu-2 resolved
    cluster.mutate("gpu-3", lambda n: n["spec"].update(taints=[]))
    alerts_source.firing = list(states(alert("gpu-1"), alert("gpu-3")))
    evidence.clear = {"gpu-1": True, "gpu-2": True, "gpu-3": True}

    second = make_controller()
    await second.reconcile()
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]  # still firing
    assert keys(cluster, "gpu-2") == []  # resolve never delivered, evidence clear
    assert keys(cluster, "gpu-3") == ["fleetwatch.io/gpu-overheat"]  # restored
    assert second.breaker.tainted == {"gpu-1", "gpu-3"}


async def test_reconcile_handles_undelivered_resolve(
    make_controller: ControllerFactory,
    cluster: RealCluster,
    evidence: FakeEvidence,
    alerts_source: FakeAlerts,
) -> None:
    controller = make_controller()
    alerts_source.firing = list(states(alert("gpu-1")))
    await controller.handle_alerts(states(alert("gpu-1")))
    alerts_source.firing = []
    evidence.clear["gpu-1"] = True
    await controller.reconcile()
    assert keys(cluster, "gpu-1") == []


async def test_unknown_node_is_forgotten_not_failed(
    make_controller: ControllerFactory,
    cluster: RealCluster,
) -> None:
    controller = make_controller()
    before = cluster.versions()
    await controller.handle_alerts(states(alert("gone-node")))
    assert controller.intents() == []
    assert cluster.versions() == before


@pytest.mark.parametrize(
    ("nodes", "fraction", "expected"),
    [
        (5, 0.1, 1),  # 0.5 rounds down to 0: a small cluster still gets one node
        (10, 0.1, 1),
        (35, 0.1, 3),
        (500, 0.1, 50),
        (5, 0.0, 0),  # fraction 0 means none, on purpose
        (0, 0.1, 0),  # no node selected
    ],
)
async def test_breaker_share_limit(nodes: int, fraction: float, expected: int) -> None:
    breaker = Breaker(policy=BreakerPolicy(max_new_taints=1000, max_fraction=fraction))
    assert breaker.limit() == 0  # node count not known yet: nothing may be tainted
    breaker.set_selected_nodes(nodes)
    assert breaker.limit() == expected
    granted = [await breaker.reserve(f"node-{i}", shares=True) is None for i in range(expected + 1)]
    assert granted == [True] * expected + [False]
    assert (breaker.open, breaker.opened_by) == (True, "share")
