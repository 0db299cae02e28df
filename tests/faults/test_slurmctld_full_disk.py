"""slurmctld's StateSaveLocation on a full disk, with the tainter draining and resuming through it.

A real Slurm (`fleetwatch.sim.slurm`) whose StateSaveLocation is a 1 MiB tmpfs
(`state_disk_bytes`), filled once slurmctld has started. The tainter keeps its own state file
there too (`fleetwatch/` in the StateSaveLocation, its default on Slurm). A firing alert, then
room again, then the alert resolved with the evidence clear: the drain is made once and kept,
the failure is answered 503 (Alertmanager comes back), counted and logged, the drain's audit
record and history entry are written once there is room, and the resume goes through.
Skipped, saying why, without Slurm, root or a tmpfs mount.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from fleetwatch.sim.loopback_servers import wait_until
from fleetwatch.sim.slurm import MissingSlurm, SlurmCluster, find_binaries, slurm_cluster
from fleetwatch.tainter.breaker import Breaker
from fleetwatch.tainter.controller import Controller
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.quarantine import read_history
from fleetwatch.tainter.server import make_app
from fleetwatch.tainter.settings import BreakerPolicy, ControllerSettings, RetryPolicy
from fleetwatch.tainter.slurm_backend import (
    GuardedScontrol,
    SlurmNodeApi,
    StateFile,
    state_directory,
)
from fleetwatch.tainter.taint_policy import TaintPolicy
from fleetwatch.tainter.writes import records
from tests.tainter.conftest import FakeEvidence, alert, resolved, webhook

pytestmark = pytest.mark.integration

OURS = "fleetwatch:gpu-overheat GPUOverheating"
KEY = "fleetwatch.io/gpu-overheat"
FAST = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.01)
NODE_STATE_FAILED = re.compile(r"error: Error writing file \S*node_state\.new, .*")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    try:
        find_binaries()
        with slurm_cluster(tmp_path_factory.mktemp("slurm-full"), state_disk_bytes=1 << 20) as up:
            yield up
    except MissingSlurm as exc:
        pytest.skip(f"no real Slurm on a small disk: {exc}")


def fill(disk: Path) -> Path:
    """Write a file on `disk` until it is full; the file."""
    filler = disk / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as out:
        while True:
            out.write(b"\0" * 4096)
            out.flush()
            os.fsync(out.fileno())
    return filler


async def test_a_drain_and_a_resume_through_a_full_state_save_location(
    slurm: SlurmCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    scontrol = GuardedScontrol(conf=slurm.conf)
    state = StateFile(await state_directory(scontrol))
    assert state.directory == slurm.workdir / "state" / "fleetwatch"
    state.update(lambda data: None)  # a running tainter's state file exists
    api = SlurmNodeApi(scontrol=scontrol, state=state)
    metrics, evidence = TainterMetrics(), FakeEvidence()
    control = Controller(
        api=api,
        breaker=Breaker(policy=BreakerPolicy(max_new_taints=10, max_fraction=1.0)),
        evidence=evidence,
        alerts=None,
        metrics=metrics,
        settings=ControllerSettings(hold_seconds=0.0, retry=FAST),
        policy=TaintPolicy(declared_reasons=None),
    )
    app = make_app(
        controller=control, metrics=metrics, auth=None, max_body_bytes=1 << 20, orchestrator="slurm"
    )
    ctld_log = len(slurm.log("slurmctld"))
    filler = fill(slurm.workdir / "state")
    try:
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            first = await client.post("/alerts", json=webhook(alert("gpu01", fp="full")))
            said = (await first.json())["error"]
            reason = slurm.node("gpu01")["Reason"]
            again = await client.post("/alerts", json=webhook(alert("gpu01", fp="full")))
            assert slurm.node("gpu01")["Reason"] == reason  # drained once, not again
            assert records(await api.get_node("gpu01")) == {}  # not written: no room
            # What slurmctld does: it keeps the drain in memory, logs that its own state
            # file cannot be written, and goes on serving.
            failed = wait_until(
                lambda: NODE_STATE_FAILED.search(slurm.log("slurmctld")[ctld_log:]),
                timeout=30,
                what="slurmctld failing to save its node state",
            )
            filler.unlink()  # room again
            room = await client.post("/alerts", json=webhook(alert("gpu01", fp="full")))
            view = await api.get_node("gpu01")
            evidence.clear["gpu01"] = True
            gone = await client.post("/alerts", json=webhook(resolved("gpu01", fp="full")))
            await control.reconcile()
    finally:
        filler.unlink(missing_ok=True)
    assert (first.status, again.status, room.status, gone.status) == (503, 503, 200, 200)
    assert "No space left on device" in said
    assert reason.startswith(OURS)
    assert set(records(view)) == {KEY}
    assert len(read_history(view).taints["gpu-overheat"]) == 1
    assert "No space left on device" in failed.group(0)
    assert slurm.wait_for("gpu01", "IDLE")["State"] == "IDLE"  # resumed
    assert records(await api.get_node("gpu01")) == {}
    errors = metrics.registry.get_sample_value(
        "fleetwatch_tainter_api_errors_total", {"status": "0"}
    )
    assert errors is not None
    assert errors >= 2
    ops = {
        op: metrics.registry.get_sample_value(
            "fleetwatch_tainter_taint_operations_total", {"op": op, "result": "ok"}
        )
        for op in ("add", "remove")
    }
    assert ops == {"add": 1.0, "remove": 1.0}
    assert any(
        "No space left on device" in str(getattr(r, "error", ""))
        for r in caplog.records
        if r.getMessage() == "call retried"
    )
