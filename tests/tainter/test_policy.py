"""Safe by default: what the webhook refuses (NoExecute, undeclared reasons, too many taints
per node, bodies too deep or too large), late firings after a resolve, bounded memory,
and token rotation without a restart. Each refusal: status, log line, counter, no write."""

from __future__ import annotations

import json
import logging
import os
from datetime import timedelta
from pathlib import Path

import pytest

from fleetwatch.sim.kubeapi import FakeCluster
from fleetwatch.tainter.auth import TokenFile
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.taint_policy import TaintPolicy
from tests.tainter.conftest import (
    AUTH,
    T0,
    Client,
    ControllerFactory,
    FakeEvidence,
    alert,
    keys,
    post,
    resolved,
    webhook,
)


async def metric(client: Client, line: str) -> bool:
    return line in await (await client.get("/metrics")).text()


async def test_noexecute_is_refused_but_the_rest_of_the_notification_applies(
    tainter_client: Client, cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    status, body = await post(
        tainter_client,
        webhook(alert("gpu-1", effect="NoExecute", alertname="Evictor"), alert("gpu-2")),
    )
    assert status == 200  # a refusal is an answer: Alertmanager must not redeliver it
    assert "Evictor on gpu-1" in body["message"]
    assert "NoExecute" in body["message"]
    assert [r["alertname"] for r in body["left_alone"]] == ["Evictor"]
    assert keys(cluster, "gpu-1") == []  # nothing written for the refused alert
    assert keys(cluster, "gpu-2") == ["fleetwatch.io/gpu-overheat"]  # the other applied
    assert [w.node for w in cluster.writes] == ["gpu-2"]
    assert logged(caplog, "taint refused by policy", why="noexecute", alertname="Evictor")
    assert await metric(
        tainter_client, 'fleetwatch_tainter_policy_refusals_total{why="noexecute"} 1.0'
    )
    assert await metric(
        tainter_client, 'fleetwatch_tainter_webhook_requests_total{result="left_alone"} 1.0'
    )


async def test_noexecute_is_written_for_a_reason_the_operator_allows(
    make_controller: ControllerFactory, cluster: FakeCluster
) -> None:
    controller = make_controller(
        policy=TaintPolicy(declared_reasons=None, allow_noexecute=frozenset({"gpu-lost"}))
    )
    outcome = await controller.handle_alerts(
        parse_webhook(
            webhook(
                alert("gpu-1", reason="gpu-lost", effect="NoExecute"),
                alert("gpu-2", reason="gpu-overheat", effect="NoExecute"),
            )
        )
    )
    assert [(t["key"], t["effect"]) for t in cluster.taints("gpu-1")] == [
        ("fleetwatch.io/gpu-lost", "NoExecute")
    ]
    assert keys(cluster, "gpu-2") == []  # allowed per reason, not for every reason
    assert [(r.alert.node, r.why) for r in outcome.refused] == [("gpu-2", "noexecute")]


def logged(caplog: pytest.LogCaptureFixture, message: str, **fields: str) -> bool:
    """True when a record with this message (and these structured fields) was logged."""
    return any(
        r.getMessage() == message and all(getattr(r, k, None) == v for k, v in fields.items())
        for r in caplog.records
    )


async def test_undeclared_reason_is_refused_unless_allowed(
    tainter_client: Client,
    cluster: FakeCluster,
    make_controller: ControllerFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    status, body = await post(tainter_client, webhook(alert("gpu-1", reason="made-up-reason")))
    assert logged(caplog, "taint refused by policy", why="undeclared_reason", node="gpu-1")
    assert status == 200
    assert "made-up-reason" in body["message"]
    assert "not declared" in body["message"]
    assert cluster.writes == []
    assert await metric(
        tainter_client, 'fleetwatch_tainter_policy_refusals_total{why="undeclared_reason"} 1.0'
    )
    anything = make_controller(policy=TaintPolicy(declared_reasons=None))
    outcome = await anything.handle_alerts(
        parse_webhook(webhook(alert("gpu-1", reason="made-up-reason")))
    )
    assert outcome.refused == []
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/made-up-reason"]


async def test_twenty_reasons_on_one_node_stop_at_the_per_node_cap(
    make_controller: ControllerFactory, cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = TainterMetrics()
    controller = make_controller(
        metrics=metrics, policy=TaintPolicy(declared_reasons=None, max_per_node=8)
    )
    many = webhook(*(alert("gpu-1", reason=f"reason-{i:02d}") for i in range(20)))
    outcome = await controller.handle_alerts(parse_webhook(many))
    assert keys(cluster, "gpu-1") == [f"fleetwatch.io/reason-{i:02d}" for i in range(8)]
    assert sorted(r.alert.reason for r in outcome.refused) == [
        f"reason-{i:02d}" for i in range(8, 20)
    ]
    assert {r.why for r in outcome.refused} == {"max_per_node"}
    assert (
        metrics.registry.get_sample_value(
            "fleetwatch_tainter_policy_refusals_total", {"why": "max_per_node"}
        )
        == 12
    )
    assert len(cluster.events_for("gpu-1", "TaintRefused")) == 12
    assert logged(caplog, "taint refused: node at the per-node cap", key="fleetwatch.io/reason-19")
    annotation = cluster.nodes["gpu-1"]["metadata"]["annotations"]["fleetwatch.io/taints"]
    assert len(json.loads(annotation)) == 8
    # a repeat of the same notification writes nothing more and refuses the same twelve
    before = len(cluster.writes)
    again = await controller.handle_alerts(parse_webhook(many))
    assert (len(again.refused), len(cluster.writes)) == (12, before)


async def test_resolved_before_late_firing_leaves_no_taint(
    make_controller: ControllerFactory, cluster: FakeCluster
) -> None:
    controller = make_controller()
    # Alertmanager retried the firing; its resolve arrived first
    await controller.handle_alerts(parse_webhook(webhook(resolved("gpu-1"))))
    await controller.handle_alerts(parse_webhook(webhook(alert("gpu-1"))))
    assert keys(cluster, "gpu-1") == []
    assert cluster.writes == []
    # a new instance of the alert (a later startsAt) does taint
    await controller.handle_alerts(
        parse_webhook(webhook(alert("gpu-1", starts=T0 + timedelta(minutes=10))))
    )
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]


async def test_firing_then_resolved_still_follows_the_untaint_rules(
    make_controller: ControllerFactory, cluster: FakeCluster, evidence: FakeEvidence
) -> None:
    controller = make_controller(hold_seconds=0.0)
    await controller.handle_alerts(parse_webhook(webhook(alert("gpu-1"))))
    await controller.handle_alerts(parse_webhook(webhook(resolved("gpu-1"))))
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]  # no evidence yet
    evidence.clear["gpu-1"] = True
    await controller.reconcile()
    assert keys(cluster, "gpu-1") == []


async def test_resolve_memory_is_bounded(make_controller: ControllerFactory) -> None:
    controller = make_controller(resolved_memory_size=100)
    for index in range(300):
        await controller.handle_alerts(parse_webhook(webhook(resolved("gpu-1", fp=f"f{index}"))))
    assert controller.state_sizes()["resolved_memory"] == 100


async def test_alerts_for_missing_nodes_leave_no_state_behind(
    make_controller: ControllerFactory, cluster: FakeCluster
) -> None:
    controller = make_controller()
    for index in range(200):
        await controller.handle_alerts(parse_webhook(webhook(alert(f"missing-{index}"))))
    sizes = controller.state_sizes()
    assert (sizes["intents"], sizes["node_locks"]) == (0, 0)
    assert cluster.writes == []


async def test_deep_and_large_bodies_are_refused_and_counted(
    tainter_client: Client, cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    deep = b"[" * 100_000 + b"]" * 100_000
    response = await tainter_client.post("/alerts", data=deep[: 60 * 1024], headers=AUTH)
    assert response.status == 400  # unbalanced and deep: refused, not a 500
    status, body = await post(tainter_client, b"[" * 30_000 + b"]" * 30_000)
    assert (status, body["error"]) == (400, "body is JSON nested too deep")
    status, body = await post(tainter_client, b" " * (65 * 1024))
    assert status == 413
    assert cluster.writes == []
    assert logged(caplog, "webhook rejected: JSON nested too deep")
    assert logged(caplog, "webhook rejected: body too large")
    assert await metric(
        tainter_client, 'fleetwatch_tainter_webhook_requests_total{result="too_deep"} 2.0'
    )
    assert await metric(
        tainter_client, 'fleetwatch_tainter_webhook_requests_total{result="too_large"} 1.0'
    )


async def test_token_rotation_without_restart(tmp_path: Path) -> None:
    """A Secret volume swaps the `..data` symlink; the old token overlaps for a while."""
    now = [0.0]
    data_v1 = tmp_path / "..2025_v1"
    data_v1.mkdir()
    (data_v1 / "token").write_text("old-token\n")
    (tmp_path / "..data").symlink_to(data_v1.name)
    (tmp_path / "token").symlink_to("..data/token")
    metrics = TainterMetrics()
    tokens = TokenFile(tmp_path / "token", overlap=60.0, metrics=metrics, clock=lambda: now[0])
    assert tokens.accepts("Bearer old-token")
    assert not tokens.accepts("Bearer new-token")

    data_v2 = tmp_path / "..2025_v2"
    data_v2.mkdir()
    (data_v2 / "token").write_text("new-token\n")
    (tmp_path / "..data_tmp").symlink_to(data_v2.name)
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")  # the atomic swap kubelet does
    assert tokens.accepts("Bearer new-token")
    assert tokens.accepts("Bearer old-token")  # in the overlap
    now[0] = 61.0
    assert tokens.accepts("Bearer new-token")
    assert not tokens.accepts("Bearer old-token")
    assert (
        metrics.registry.get_sample_value(
            "fleetwatch_tainter_token_reloads_total", {"result": "ok"}
        )
        == 1
    )
    (data_v2 / "token").write_text("   \n")  # an empty file is never a token
    assert tokens.accepts("Bearer new-token")
    assert not tokens.accepts("Bearer ")


async def test_rotated_token_is_accepted_by_the_running_webhook(
    tainter_client: Client, token_file: Path, cluster: FakeCluster
) -> None:
    token_file.write_text("rotated-token\n")
    status, _ = await post(
        tainter_client, webhook(alert("gpu-1")), {"Authorization": "Bearer rotated-token"}
    )
    assert status == 200
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]
    status, _ = await post(tainter_client, webhook(alert("gpu-2")))  # the old one, in overlap
    assert status == 200
    status, _ = await post(tainter_client, webhook(alert("gpu-3")), {"Authorization": "Bearer x"})
    assert status == 401
