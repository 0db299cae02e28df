"""The wall clock stepping under the tainter: the untaint hold-down is a duration of the
process (monotonic), so a step forward never lifts a taint early and a step backward never
keeps one past its hold."""

from __future__ import annotations

import asyncio
import time

import pytest

from fleetwatch.sim.kubeapi import FakeCluster
from fleetwatch.tainter.payload import parse_webhook
from tests.tainter.conftest import ControllerFactory, FakeEvidence, alert, keys, resolved, webhook

HOUR = 3600.0


def step_wall_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Every later `time.time()` reads `seconds` off from the real wall clock."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


async def test_a_step_forward_does_not_lift_a_taint_early(
    make_controller: ControllerFactory,
    cluster: FakeCluster,
    evidence: FakeEvidence,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    control = make_controller(hold_seconds=600.0)
    await control.handle_alerts(parse_webhook(webhook(alert("gpu-1"))))
    await control.handle_alerts(parse_webhook(webhook(resolved("gpu-1"))))
    evidence.clear["gpu-1"] = True
    step_wall_clock(monkeypatch, +HOUR)  # NTP corrects an hour, a VM resumes
    await control.reconcile()
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]  # 10 min not yet passed


async def test_a_step_backward_does_not_keep_a_taint_past_its_hold(
    make_controller: ControllerFactory,
    cluster: FakeCluster,
    evidence: FakeEvidence,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    control = make_controller(hold_seconds=0.2)
    await control.handle_alerts(parse_webhook(webhook(alert("gpu-1"))))
    await control.handle_alerts(parse_webhook(webhook(resolved("gpu-1"))))
    evidence.clear["gpu-1"] = True
    step_wall_clock(monkeypatch, -HOUR)
    deadline = time.monotonic() + 10
    while keys(cluster, "gpu-1") and time.monotonic() < deadline:
        await control.reconcile()  # each reconcile asks again; the hold passes in 0.2 s
        await asyncio.sleep(0.05)
    assert keys(cluster, "gpu-1") == []
