"""Repair after the drain on a real Slurm (`fleetwatch.sim.slurm`, a RebootProgram that stands
in for the reboot by restarting the node's slurmd with `-b`): an Xid whose catalog action is a
reboot (151) drains the node, reboots it through `scontrol reboot ASAP nextstate=RESUME` once
its job has left, and the node returns to service by itself; the same Xid twice more stops the
repairs and quarantines the node for hardware inspection; an admin's drain is never touched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.rules.contract import load_contract
from fleetwatch.sim.loopback_servers import wait_until
from fleetwatch.sim.slurm import MissingSlurm, SlurmCluster, find_binaries, slurm_cluster
from fleetwatch.tainter.breaker import Breaker, BreakerStore
from fleetwatch.tainter.controller import Controller
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.quarantine import QUARANTINE_LABEL
from fleetwatch.tainter.repair import REPAIRS_ANNOTATION, read_attempts
from fleetwatch.tainter.repair_settings import RepairSettings
from fleetwatch.tainter.service import connect_backend
from fleetwatch.tainter.settings import (
    BreakerPolicy,
    ControllerSettings,
    QuarantineSettings,
    RetryPolicy,
    SlurmAccess,
)
from fleetwatch.tainter.slurm_backend import REBOOT_FLAGS, SlurmNodeApi
from fleetwatch.tainter.taint_policy import TaintPolicy
from tests.tainter.conftest import FakeEvidence, webhook, xid_alert

pytestmark = pytest.mark.integration

FAST = RetryPolicy(attempts=6, base_delay=0.001, max_delay=0.01)
REASON = "xid-critical"
XID_REBOOT = "151"  # NVIDIA's catalog: RESTART_VM, a node reboot
ADMIN_REASON = "admin: reseating the NVLink cable"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A cluster whose RebootProgram restarts the node's slurmd with `-b`."""
    try:
        find_binaries()
    except MissingSlurm as exc:
        pytest.skip(f"no real Slurm: {exc}")
    with slurm_cluster(tmp_path_factory.mktemp("slurm-reboot"), reboot=True) as cluster:
        yield cluster


async def backend(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmNodeApi:
    for key, value in slurm.env.items():
        monkeypatch.setenv(key, value)
    api, _ = await connect_backend("slurm", slurm=SlurmAccess())
    assert isinstance(api, SlurmNodeApi)
    return api


def repairing_controller(api: SlurmNodeApi, metrics: TainterMetrics) -> Controller:
    """The controller as `fleetwatch taint --orchestrator=slurm --repair.mode=on
    --repair.kinds=reboot,gpu-reset` builds it, with the shipped contract's repairs; the
    quarantine of repeat taints is out of the way (after 10), so what quarantines here is the
    repair engine's escalation."""
    settings = ControllerSettings(
        hold_seconds=0.0,
        retry=FAST,
        quarantine=QuarantineSettings(after=10),
        repair=RepairSettings(mode="on", kinds=frozenset({"reboot", "gpu-reset"})),
        repairs=load_contract().repairs,
    )
    return Controller(
        api=api,
        breaker=Breaker(policy=BreakerPolicy(max_new_taints=10, max_fraction=1.0)),
        evidence=FakeEvidence(),
        alerts=None,
        metrics=metrics,
        settings=settings,
        policy=TaintPolicy(declared_reasons=None),
        breaker_store=BreakerStore(api=api, namespace="slurm", name="repair"),
    )


def xid(node: str, n: int) -> dict[str, Any]:
    return xid_alert(node, XID_REBOOT, n)


def sample(metrics: TainterMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def back_in_service(slurm: SlurmCluster, node: str) -> None:
    """Wait until slurmctld has taken the rebooted node back: IDLE, answering, and neither
    drained nor still rebooting. `wait_for(node, "IDLE")` is not enough: it asks for a
    state that has the IDLE flag, which `IDLE+DRAIN+REBOOT_ISSUED` has too (the stand-in
    restarted slurmd, slurmctld has not yet taken its registration), and a sync then still
    sees the repair in flight."""
    out = {"DRAIN", "NOT_RESPONDING", *REBOOT_FLAGS}
    seen: list[dict[str, str]] = []

    def back() -> bool:
        seen.append(slurm.node(node))
        flags = set(seen[-1].get("State", "").split("+"))
        return "IDLE" in flags and not flags & out

    try:
        wait_until(back, timeout=30, what=f"{node} back in service after its reboot")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; last seen: {seen[-1:]}") from exc


async def synced_until(
    controller: Controller, node: str, done: Any, *, timeout: float = 45.0
) -> None:
    """Sync `node` (as the periodic reconcile would) until `done()` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not done():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await controller.sync_nodes([node])
        await asyncio.sleep(0.2)


async def test_a_reboot_xid_reboots_after_the_job_and_twice_more_quarantines(
    slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    api = await backend(slurm, monkeypatch)
    metrics = TainterMetrics()
    controller = repairing_controller(api, metrics)
    submitted = slurm.run(
        "sbatch",
        "--parsable",
        "-w",
        "gpu01",
        "-D",
        str(tmp_path),
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 300",
    )
    job = submitted.stdout.strip().split(";")[0]
    wait_until(
        lambda: slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING",
        timeout=30,
        what="the job running on gpu01",
    )

    await controller.handle_alerts(parse_webhook(webhook(xid("gpu01", 1))))
    fields = slurm.node("gpu01")
    assert "DRAIN" in fields["State"]
    assert fields["Reason"].startswith("fleetwatch:xid-critical GPUXidCritical")
    await controller.sync_nodes(["gpu01"])
    assert list(slurm.reboots) == [], "no reboot while the job runs"

    slurm.run("scancel", job)  # the job leaves (its launcher restarts it elsewhere)
    await synced_until(controller, "gpu01", lambda: list(slurm.reboots) == ["gpu01"])
    back_in_service(slurm, "gpu01")  # by itself: slurmctld resumed it (nextstate=RESUME)
    await controller.sync_nodes(["gpu01"])
    (first,) = read_attempts(await api.get_node("gpu01"))
    assert (first.reason, first.repair, first.asked_for) == (REASON, "reboot", "reboot")
    assert first.returned is not None
    assert (
        sample(metrics, "fleetwatch_tainter_repairs_total", repair="reboot", result="returned") == 1
    )
    assert (
        sample(metrics, "fleetwatch_tainter_repair_back_in_service_seconds_count", reason=REASON)
        == 1
    )
    # A late notification of the same alert does not take the repaired node out again.
    await controller.handle_alerts(parse_webhook(webhook(xid("gpu01", 1))))
    assert "DRAIN" not in slurm.state("gpu01")

    # The same Xid again: drained, no job, rebooted at once; the first repair did not hold.
    await controller.handle_alerts(parse_webhook(webhook(xid("gpu01", 2))))
    await synced_until(controller, "gpu01", lambda: list(slurm.reboots) == ["gpu01"] * 2)
    back_in_service(slurm, "gpu01")
    await controller.sync_nodes(["gpu01"])
    assert all(a.returned is not None for a in read_attempts(await api.get_node("gpu01")))
    not_held = "fleetwatch_tainter_repairs_not_held_total"
    assert sample(metrics, not_held, reason=REASON, repair="reboot") == 1

    # And a third time: two repairs within the window did not hold, so no third reboot:
    # the node stays drained, quarantined for hardware inspection.
    await controller.handle_alerts(parse_webhook(webhook(xid("gpu01", 3))))
    await controller.sync_nodes(["gpu01"])
    node = await api.get_node("gpu01")
    assert node.labels.get(QUARANTINE_LABEL) == REASON
    assert list(slurm.reboots) == ["gpu01"] * 2
    assert "DRAIN" in slurm.state("gpu01")
    assert sample(metrics, not_held, reason=REASON, repair="reboot") == 2
    assert len(read_attempts(node)) == 2
    assert REPAIRS_ANNOTATION in node.annotations
    await controller.sync_nodes(["gpu01"])
    assert list(slurm.reboots) == ["gpu01"] * 2, "a quarantined node is not repaired again"


async def test_an_admins_drain_is_never_touched(
    slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = await backend(slurm, monkeypatch)
    controller = repairing_controller(api, TainterMetrics())
    slurm.drain("gpu02", ADMIN_REASON)
    before = slurm.node("gpu02")
    # Someone else's drain is left alone: an answer, not a failure (docs/reliability.md).
    await controller.handle_alerts(parse_webhook(webhook(xid("gpu02", 1))))
    for _ in range(3):
        await controller.sync_nodes(["gpu02"])
    after = slurm.node("gpu02")
    assert (after["State"], after["Reason"]) == (before["State"], before["Reason"])
    assert "gpu02" not in slurm.reboots
    assert REPAIRS_ANNOTATION not in (await api.get_node("gpu02")).annotations
    slurm.resume("gpu02")
