"""Faults a real API server cannot produce on demand, injected on the simulated API and
met through the real client: throttling and server errors are retried, an outage fails
the notification and the next reconcile converges, a leader that cannot renew its Lease
steps down within the renew deadline."""

from __future__ import annotations

from typing import Any

import pytest

from fleetwatch.sim.kubeapi import FakeCluster
from fleetwatch.tainter.kube import KubeNodeApi
from fleetwatch.tainter.kube_objects import ApiError
from fleetwatch.tainter.payload import parse_webhook
from tests.tainter.conftest import (
    Clock,
    ControllerFactory,
    FakeAlerts,
    alert,
    candidate,
    keys,
    webhook,
)


def states(*alerts: dict[str, Any]) -> Any:
    return parse_webhook(webhook(*alerts))


async def test_injected_429_and_500_are_retried(
    make_controller: ControllerFactory,
    cluster: FakeCluster,
) -> None:
    cluster.faults.statuses.extend([429, 500, 429])
    controller = make_controller()
    await controller.handle_alerts(states(alert("gpu-1")))
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]


async def test_outage_raises_then_converges_when_api_returns(
    make_controller: ControllerFactory,
    cluster: FakeCluster,
    alerts_source: FakeAlerts,
) -> None:
    alerts_source.firing = list(states(alert("gpu-1")))
    controller = make_controller()
    cluster.faults.outage = True
    with pytest.raises(ApiError, match="503"):
        await controller.handle_alerts(states(alert("gpu-1")))
    assert cluster.writes == []
    cluster.faults.outage = False
    await controller.reconcile()
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]


async def test_leader_that_cannot_renew_steps_down_within_the_renew_deadline(
    kube: KubeNodeApi, cluster: FakeCluster
) -> None:
    clock = Clock()
    changes: list[tuple[str, bool]] = []
    elector, leadership = candidate(kube, "a", clock, changes)
    await elector.step()
    assert leadership.is_leader
    cluster.faults.outage = True
    clock.now += 6.0
    with pytest.raises(ApiError, match="503"):
        await elector.step()
    assert leadership.is_leader  # 6 s without renew: still inside the 10 s deadline
    clock.now += 4.5
    with pytest.raises(ApiError, match="503"):
        await elector.step()
    assert not leadership.is_leader
    assert changes == [("a", True), ("a", False)]
