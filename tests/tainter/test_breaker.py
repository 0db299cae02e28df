"""The circuit breaker at fleet scale, on a real Kubernetes API server: nodes waiting for a
person do not jam it, an alert storm takes out only `--breaker.max-new-taints` nodes, the
share cap counts only what the tainter may lift itself, every refusal names its cap (log,
Event, metric, a 2xx webhook answer naming it), and the take-outs within the window outlive a change
of leader."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from fleetwatch.tainter.auth import TokenFile
from fleetwatch.tainter.breaker import (
    BREAKER_ANNOTATION,
    BreakerRecord,
    BreakerStore,
    TakeOut,
)
from fleetwatch.tainter.controller import Controller
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.quarantine import QUARANTINE_LABEL
from fleetwatch.tainter.server import make_app
from fleetwatch.tainter.settings import BreakerPolicy
from fleetwatch.tainter.taint_policy import TaintPolicy
from tests.tainter.conftest import (
    ControllerFactory,
    alert,
    keys,
    post,
    webhook,
)
from tests.tainter.realkube import RealCluster

pytestmark = pytest.mark.integration
GPU_SELECTOR = "nvidia.com/gpu.present=true"
DEFAULTS = BreakerPolicy()


@pytest.fixture
def cluster(real_cluster: RealCluster) -> RealCluster:
    return real_cluster


@pytest.fixture
def kube(real_kube: KubeNodeApi) -> KubeNodeApi:
    return real_kube


def out_for_repair(cluster: RealCluster, node: str, reason: str = "gpu-lost") -> None:
    """Give `node` the taint, label and record fleetwatch wrote for `reason` weeks ago."""

    def change(n: dict[str, Any]) -> None:
        n["spec"]["taints"] = [
            {"key": f"fleetwatch.io/{reason}", "value": "GPUFallenOffBus", "effect": "NoSchedule"}
        ]
        n["metadata"]["labels"]["fleetwatch.io/tainted"] = "true"

    cluster.mutate(node, change)


def out_nodes(cluster: RealCluster) -> list[str]:
    return sorted(name for name in cluster.nodes if keys(cluster, name))


def sample(metrics: TainterMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def fleet_webhook(
    make_controller: ControllerFactory, token_file: Path, cluster: RealCluster
) -> AsyncIterator[tuple[TestClient[Any, Any], Controller, TainterMetrics]]:
    """400 GPU nodes and the webhook around a controller with the shipped breaker caps."""
    cluster.reset(nodes=400)
    metrics = TainterMetrics()
    controller = make_controller(
        metrics=metrics,
        max_new_taints=DEFAULTS.max_new_taints,
        window=DEFAULTS.window,
        max_fraction=DEFAULTS.max_fraction,
        node_selector=GPU_SELECTOR,
        policy=TaintPolicy(declared_reasons=frozenset({"gpu-overheat", "gpu-lost"})),
    )
    app = make_app(
        controller=controller,
        metrics=metrics,
        auth=TokenFile(token_file, overlap=60.0, metrics=metrics),
        max_body_bytes=1 << 20,
    )
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    yield client, controller, metrics
    await client.close()


async def test_thirty_nodes_waiting_for_repair_do_not_block_a_new_overheating_taint(
    fleet_webhook: tuple[TestClient[Any, Any], Controller, TainterMetrics],
    cluster: RealCluster,
) -> None:
    client, controller, metrics = fleet_webhook
    for index in range(30):
        out_for_repair(cluster, f"gpu-{index}")
    status, body = await post(client, webhook(alert("gpu-300")))
    assert (status, body["status"]) == (200, "ok")
    assert keys(cluster, "gpu-300") == ["fleetwatch.io/gpu-overheat"]
    assert not controller.breaker.open
    assert len(controller.breaker.tainted) == 31
    assert controller.breaker.sharing == {"gpu-300"}
    assert sample(metrics, "fleetwatch_tainter_breaker_limit_nodes") == 40  # 10 % of 400
    assert sample(metrics, "fleetwatch_tainter_breaker_share_nodes") == 1
    assert sample(metrics, "fleetwatch_tainter_breaker_new_taints") == 1


async def test_an_alert_storm_takes_out_only_the_rate_cap_and_says_so(
    fleet_webhook: tuple[TestClient[Any, Any], Controller, TainterMetrics],
    cluster: RealCluster,
) -> None:
    client, controller, metrics = fleet_webhook
    storm = [alert(f"gpu-{index}") for index in range(150)]
    status, body = await post(client, webhook(*storm))
    assert status == 200  # a refusal is an answer, not a redelivery; the reconcile loop applies it
    assert len(out_nodes(cluster)) == DEFAULTS.max_new_taints == 10
    assert len(body["left_alone"]) == 140
    assert {r["why"] for r in body["left_alone"]} == {"breaker_new_taints"}
    assert "rate cap" in body["message"]
    assert "--breaker.max-new-taints=10 per --breaker.window=1h" in body["message"]
    assert "`fleetwatch breaker reset`" in body["message"]
    assert (controller.breaker.open, controller.breaker.opened_by) == (True, "new_taints")
    assert sample(metrics, "fleetwatch_tainter_breaker_open") == 1
    assert sample(metrics, "fleetwatch_tainter_breaker_refusals_total", cap="new_taints") == 140
    refused = next(n for n in (f"gpu-{i}" for i in range(150)) if not keys(cluster, n))
    (event,) = cluster.events_for(refused, "TaintRefused")
    assert "rate cap: 10 node(s) taken out within the last 1h" in event["message"]
    # the same storm again (Alertmanager's repeat) takes out nothing more
    status, _ = await post(client, webhook(*storm))
    assert status == 200
    assert len(out_nodes(cluster)) == 10
    assert sample(metrics, "fleetwatch_tainter_webhook_requests_total", result="left_alone") == 2


async def test_share_cap_counts_only_what_the_tainter_may_lift(
    make_controller: ControllerFactory, cluster: RealCluster
) -> None:
    metrics = TainterMetrics()
    controller = make_controller(max_new_taints=100, max_fraction=0.2, metrics=metrics)  # 2
    out_for_repair(cluster, "gpu-0")  # gpu-lost: waits for a person
    cluster.mutate(  # quarantined: waits for a person
        "gpu-1", lambda n: n["metadata"]["labels"].update({QUARANTINE_LABEL: "gpu-overheat"})
    )
    outcome = await controller.handle_alerts(
        parse_webhook(webhook(*(alert(f"gpu-{i}") for i in range(1, 4))))
    )
    assert outcome.refused == []
    outcome = await controller.handle_alerts(parse_webhook(webhook(alert("gpu-4"))))
    assert out_nodes(cluster) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert controller.breaker.sharing == {"gpu-2", "gpu-3"}
    (refusal,) = outcome.refused
    assert (refusal.alert.node, refusal.why) == ("gpu-4", "breaker_share")
    assert "share cap: 2 of 10 selected nodes" in refusal.detail
    assert "--breaker.max-fraction=0.2 allows 2" in refusal.detail
    assert sample(metrics, "fleetwatch_tainter_breaker_refusals_total", cap="share") == 1
    # while open, a take-out for a reason that waits for a person is refused too, naming
    # the cap that opened the breaker
    outcome = await controller.handle_alerts(parse_webhook(webhook(alert("gpu-5", reason="xid"))))
    assert [r.why for r in outcome.refused] == ["breaker_share"]
    controller.reset_breaker(by="tester")
    outcome = await controller.handle_alerts(parse_webhook(webhook(alert("gpu-5", reason="xid"))))
    assert outcome.refused == []  # it would not count toward the share: allowed
    assert keys(cluster, "gpu-5") == ["fleetwatch.io/xid"]


async def test_take_outs_within_the_window_outlive_their_leader(
    make_controller: ControllerFactory, kube: KubeNodeApi, cluster: RealCluster
) -> None:
    store = BreakerStore(api=kube, namespace="fw", name="lock")
    old = make_controller(max_new_taints=2, breaker_store=store)
    await old.handle_alerts(parse_webhook(webhook(alert("gpu-1"), alert("gpu-2"))))
    assert not old.breaker.open  # at the cap, not past it
    lease = cluster.lease("fw", "lock")
    assert lease is not None
    stored = json.loads(lease["metadata"]["annotations"][BREAKER_ANNOTATION])
    assert sorted(t["node"] for t in stored["takenOut"]) == ["gpu-1", "gpu-2"]

    new = make_controller(max_new_taints=2, breaker_store=store)  # the next leader
    await new.prepare_to_lead()
    outcome = await new.handle_alerts(parse_webhook(webhook(alert("gpu-3"))))
    assert [r.why for r in outcome.refused] == ["breaker_new_taints"]
    assert keys(cluster, "gpu-3") == []
    record = (await store.read())[1]
    assert record is not None
    assert (record.open, record.cap) == (True, "new_taints")


def test_breaker_record_round_trips_and_reads_older_records() -> None:
    record = BreakerRecord(
        open=True,
        changed_at="2025-01-01T00:00:00Z",
        changed_by="fleetwatch-tainter",
        cap="share",
        opened_at="2025-01-01T00:00:00Z",
        taken_out=(TakeOut(at=1735689600, node="gpu-1"),),
    )
    assert BreakerRecord.from_annotation(record.to_annotation()) == record
    older = BreakerRecord.from_annotation('{"open": false, "changedAt": "", "changedBy": "x"}')
    assert (older.open, older.cap, older.taken_out) == (False, "", ())
    with pytest.raises(ValueError, match="takenOut"):
        BreakerRecord.from_annotation('{"open": true, "takenOut": [{"node": 1}]}')
    with pytest.raises(ValueError, match="not an RFC 3339"):
        BreakerRecord.from_annotation('{"open": true, "takenOut": [{"node": "a", "at": "x"}]}')
