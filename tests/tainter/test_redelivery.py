"""Alertmanager redelivering: duplicates, out of order, resolved before firing, a flood.

Alertmanager delivers at least once: it repeats a notification it thinks failed, repeats
firing alerts every `repeat_interval`, and two replicas of it (or a retry racing the next
group) can deliver in any order. Whatever the order, the node ends with exactly one taint per
reason while any alert for it fires, none after its resolve with evidence, every write
counted once, and every request answered 2xx.
"""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta

from fleetwatch.sim.kubeapi import FakeCluster
from tests.tainter.conftest import T0, Client, alert, keys, post, resolved, webhook


def counted(exposition: str, line: str) -> float:
    """The value of the sample line starting with `line` (0 when absent)."""
    for sample in exposition.splitlines():
        if sample.startswith(line + " "):
            return float(sample.rsplit(" ", 1)[1])
    return 0.0


async def exposition(client: Client) -> str:
    return str(await (await client.get("/metrics")).text())


async def test_duplicates_write_once_and_answer_ok(
    tainter_client: Client, cluster: FakeCluster
) -> None:
    body = webhook(alert("gpu-1", fp="a"))
    answers = [await post(tainter_client, body) for _ in range(5)]
    assert {status for status, _ in answers} == {200}
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]
    assert [w.node for w in cluster.writes] == ["gpu-1"]  # one write for five deliveries
    metrics = await exposition(tainter_client)
    ok = 'fleetwatch_tainter_taint_operations_total{op="add",result="ok"}'
    assert counted(metrics, ok) == 1


async def test_resolved_delivered_before_its_firing_leaves_no_taint(
    tainter_client: Client, cluster: FakeCluster
) -> None:
    """A retried firing notification lands after the resolve of the same alert: the
    resolve (which ended later) wins, whatever the arrival order."""
    await post(tainter_client, webhook(resolved("gpu-1", fp="a")))
    status, _ = await post(tainter_client, webhook(alert("gpu-1", fp="a")))
    assert status == 200
    assert keys(cluster, "gpu-1") == []
    assert cluster.writes == []


async def test_out_of_order_episodes_converge_on_the_newest(
    tainter_client: Client, cluster: FakeCluster
) -> None:
    """Two episodes of one alert (same fingerprint): the first episode's stale resolve,
    delivered late, does not lift the taint the second episode holds."""
    later = T0 + timedelta(minutes=10)
    await post(tainter_client, webhook(alert("gpu-1", fp="a", starts=later)))
    stale = resolved("gpu-1", fp="a", starts=T0, ends=T0 + timedelta(minutes=1))
    status, _ = await post(tainter_client, webhook(stale))
    assert status == 200
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]


async def test_a_shuffled_flood_converges_with_exact_counts(
    tainter_client: Client, cluster: FakeCluster
) -> None:
    """Ten nodes, each one's firing alert delivered three times, all shuffled and delivered
    concurrently: each node holds exactly one taint, written once, and every delivery is
    answered and counted once."""
    rng = random.Random(38)
    bodies = []
    for index in range(10):
        node = f"gpu-{index}"
        bodies += [webhook(alert(node, fp=f"fp-{index}")) for _ in range(3)]
    rng.shuffle(bodies)
    answers = await asyncio.gather(*(post(tainter_client, body) for body in bodies))
    assert {status for status, _ in answers} == {200}
    for index in range(10):
        assert keys(cluster, f"gpu-{index}") == ["fleetwatch.io/gpu-overheat"]
    assert sorted(w.node for w in cluster.writes) == sorted(f"gpu-{i}" for i in range(10))
    metrics = await exposition(tainter_client)
    assert counted(metrics, 'fleetwatch_tainter_taint_operations_total{op="add",result="ok"}') == 10
    assert counted(metrics, 'fleetwatch_tainter_webhook_requests_total{result="ok"}') == 30
