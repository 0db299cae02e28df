"""The tainter on a real Slurm (`fleetwatch.sim.slurm`), in process: the controller finds the state
directory through SLURM_CONF and scontrol on PATH alone (beside slurmctld's
StateSaveLocation), the breaker holds across a fresh controller, and two controllers on one
state directory never both drain; removal from the run requeues a drained node's job once.
The whole story with real servers is
`test_tainter_e2e_real.py`.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from fleetwatch.sim.loopback_servers import wait_until
from fleetwatch.sim.slurm import MissingSlurm, SlurmCluster, small_disk
from fleetwatch.tainter.after_sync import AfterSync
from fleetwatch.tainter.breaker import Breaker, BreakerStore
from fleetwatch.tainter.controller import Controller, NodeSyncError
from fleetwatch.tainter.election import LeaderElector, LeaderOnlyNodeApi, Leadership, NotLeader
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.quarantine import read_history
from fleetwatch.tainter.server import make_app
from fleetwatch.tainter.service import connect_backend, manual_untaint
from fleetwatch.tainter.settings import (
    BreakerPolicy,
    ControllerSettings,
    ElectionSettings,
    RetryPolicy,
    SlurmAccess,
)
from fleetwatch.tainter.slurm_backend import GuardedScontrol, SlurmNodeApi, StateFile
from fleetwatch.tainter.slurm_requeue import JobRemover
from fleetwatch.tainter.taint_policy import TaintPolicy
from fleetwatch.tainter.writes import DryRunNodeApi, records
from tests.tainter.conftest import FakeEvidence, alert, resolved, webhook

pytestmark = pytest.mark.integration

OURS = "fleetwatch:gpu-overheat GPUOverheating"


def drained(slurm: SlurmCluster, node: str) -> bool:
    """The node is drained or draining."""
    return "DRAIN" in slurm.state(node).split("+")


FAST = RetryPolicy(attempts=6, base_delay=0.001, max_delay=0.01)


async def slurm_backend(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmNodeApi:
    """The backend as `fleetwatch taint --orchestrator=slurm` builds it with no Slurm flag:
    SLURM_CONF and scontrol on PATH."""
    for key, value in slurm.env.items():
        monkeypatch.setenv(key, value)
    api, _ = await connect_backend("slurm", slurm=SlurmAccess())
    assert isinstance(api, SlurmNodeApi)
    return api


def controller(
    api: object,
    *,
    evidence: FakeEvidence,
    lease: str,
    max_new_taints: int = 10,
    store: SlurmNodeApi | None = None,
    after_sync: Sequence[AfterSync] = (),
    metrics: TainterMetrics | None = None,
) -> Controller:
    """A controller on `api` (the backend, or it gated by leadership); the breaker's state
    on the lease `lease` of `store` (default: `api`)."""
    return Controller(
        api=api,  # type: ignore[arg-type]
        breaker=Breaker(policy=BreakerPolicy(max_new_taints=max_new_taints, max_fraction=1.0)),
        evidence=evidence,
        alerts=None,
        metrics=metrics or TainterMetrics(),
        settings=ControllerSettings(hold_seconds=0.0, retry=FAST),
        policy=TaintPolicy(declared_reasons=None),
        breaker_store=BreakerStore(api=store or api, namespace="slurm", name=lease),  # type: ignore[arg-type]
        after_sync=after_sync,
    )


async def test_state_beside_slurmctlds_breaker_and_quarantine_across_controllers(
    slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = await slurm_backend(slurm, monkeypatch)
    assert api.where == slurm.workdir / "state" / "fleetwatch" / "fleetwatch-tainter.json"
    evidence = FakeEvidence()
    first = controller(api, evidence=evidence, lease="breaker", max_new_taints=1)
    outcome = await first.handle_alerts(
        parse_webhook(webhook(alert("gpu01", fp="a"), alert("gpu02", fp="b")))
    )
    (refused,) = [r.alert.node for r in outcome.refused]  # the rate cap: one node only
    (taken,) = {"gpu01", "gpu02"} - {refused}
    assert slurm.node(taken)["Reason"].startswith(OURS)
    assert not drained(slurm, refused)
    second = controller(await slurm_backend(slurm, monkeypatch), evidence=evidence, lease="breaker")
    await second.prepare_to_lead()
    assert second.breaker.open  # kept in the state file, adopted by a fresh controller
    outcome = await second.handle_alerts(parse_webhook(webhook(alert(refused, fp="c"))))
    assert [r.why for r in outcome.refused] == ["breaker_new_taints"]
    assert not drained(slurm, refused)
    evidence.clear[taken] = True
    fp = "a" if taken == "gpu01" else "b"
    await second.handle_alerts(parse_webhook(webhook(resolved(taken, fp=fp))))
    await second.reconcile()
    slurm.wait_for(taken, "IDLE")
    assert not drained(slurm, taken)


async def test_two_controllers_never_both_drain(
    slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two candidates on one state directory: one holds the lease and drains; the other's
    every node write is refused before scontrol runs."""
    replicas = []
    for identity in ("host-a", "host-b"):
        api = await slurm_backend(slurm, monkeypatch)
        leadership = Leadership(renew_deadline=4.0)
        settings = ElectionSettings(
            namespace="slurm",
            name="fleetwatch-tainter-ha",
            identity=identity,
            lease_duration=6.0,
            renew_deadline=4.0,
            retry_period=1.0,
        )

        async def elected() -> None:
            return None

        elector = LeaderElector(
            api=api,
            settings=settings,
            leadership=leadership,
            on_elected=elected,
            on_change=lambda _: None,
        )
        gated = LeaderOnlyNodeApi(real=api, leadership=leadership)
        replicas.append(
            (
                elector,
                leadership,
                controller(gated, evidence=FakeEvidence(), lease="ha-breaker", store=api),
            )
        )
    for elector, _, _ in replicas:
        await elector.step()
    leaders = [leadership.is_leader for _, leadership, _ in replicas]
    assert sorted(leaders) == [False, True]
    follower = replicas[leaders.index(False)][2]
    leader = replicas[leaders.index(True)][2]
    with pytest.raises(NodeSyncError) as refused:
        await follower.handle_alerts(parse_webhook(webhook(alert("gpu02", fp="ha"))))
    assert all(isinstance(e, NotLeader) for e in refused.value.failures.values())
    assert not drained(slurm, "gpu02")
    await leader.handle_alerts(parse_webhook(webhook(alert("gpu02", fp="ha"))))
    assert slurm.node("gpu02")["Reason"].startswith(OURS)
    slurm.resume("gpu02")


def test_state_file_is_where_the_docs_say(slurm: SlurmCluster) -> None:
    """StateSaveLocation as slurmctld reports it: the default state directory's parent."""
    config = slurm.run("scontrol", "show", "config").stdout
    line = next(x for x in config.splitlines() if x.startswith("StateSaveLocation"))
    assert Path(line.partition("=")[2].strip()) == slurm.workdir / "state"


async def test_removal_from_the_run_requeues_the_drained_nodes_job_once(
    slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Opted in for gpu-overheat: the batch job running on the drained gpu01 is requeued
    (Restarts=1), once, however often the node is synced."""
    submitted = slurm.run(
        "sbatch",
        "--parsable",
        "--requeue",
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

    def job_state() -> str:
        return slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()

    wait_until(lambda: job_state() == "RUNNING", timeout=30, what="the job running on gpu01")
    api = await slurm_backend(slurm, monkeypatch)
    metrics = TainterMetrics()
    remover = JobRemover(
        access=SlurmAccess(),
        reasons=frozenset({"gpu-overheat"}),
        leadership=Leadership(renew_deadline=None),
        metrics=metrics,
        dry_run=False,
    )
    control = controller(
        api, evidence=FakeEvidence(), lease="jobs", after_sync=(remover,), metrics=metrics
    )
    try:
        await control.handle_alerts(parse_webhook(webhook(alert("gpu01", fp="jobs"))))
        wait_until(lambda: job_state() != "RUNNING", timeout=30, what="the job requeued")
        await control.reconcile()  # a later sync of the drained node: not requeued again
        shown = slurm.run("scontrol", "show", "job", "-o", job).stdout
        assert " Restarts=1 " in shown
        assert metrics.evictions.labels(reason="gpu-overheat", result="evicted")._value.get() == 1
    finally:
        slurm.run("scancel", job, check=False)
        await manual_untaint(api=api, node="gpu01", reasons=None)


async def test_every_answer_of_the_webhook_on_slurm_names_slurm(
    slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A refusal is an answer: an alert for a node an admin drained is answered 200 naming
    the node and why, counted `left_alone` (not a failure), and the admin's reason is never
    touched; so are a policy refusal and a dry run. Only what a retry can fix is a 5xx, and
    every answer names Slurm, never the Kubernetes API."""
    api = await slurm_backend(slurm, monkeypatch)
    admin = "admin: fan check"
    slurm.drain("gpu02", admin)
    admins = slurm.node("gpu02")["Reason"]
    metrics = TainterMetrics()
    app = make_app(
        controller=controller(api, evidence=FakeEvidence(), lease="answers", metrics=metrics),
        metrics=metrics,
        auth=None,
        max_body_bytes=1 << 20,
        orchestrator="slurm",
    )
    answers: list[tuple[int, dict[str, Any]]] = []
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:

        async def post(body: object) -> dict[str, Any]:
            response = await client.post("/alerts", json=body)
            answers.append((response.status, await response.json()))
            return answers[-1][1]

        held = await post(webhook(alert("gpu02", fp="held")))
        assert answers[-1][0] == 200
        assert [(r["node"], r["why"]) for r in held["left_alone"]] == [("gpu02", "held_by_others")]
        assert "Slurm node gpu02" in held["message"]
        assert admin in held["message"]
        assert slurm.node("gpu02")["Reason"] == admins  # never rewritten
        # Alertmanager's redelivery of it changes nothing and is answered the same.
        assert (await post(webhook(alert("gpu02", fp="held"))))["left_alone"]
        noexecute = await post(webhook(alert("gpu01", fp="nx", effect="NoExecute")))
        assert [r["why"] for r in noexecute["left_alone"]] == ["noexecute"]
        assert not drained(slurm, "gpu01")
        assert await post(webhook(alert("gpu01", fp="ok"))) == {"status": "ok", "alerts": 1}
        assert drained(slurm, "gpu01")
        await post({"version": "3"})
    slurm.resume("gpu01")
    slurm.resume("gpu02")
    assert [status for status, _ in answers] == [200, 200, 200, 200, 400]
    counted = {
        result: metrics.registry.get_sample_value(
            "fleetwatch_tainter_webhook_requests_total", {"result": result}
        )
        for result in ("ok", "left_alone", "bad_request", "api_error")
    }
    assert counted == {"ok": 1.0, "left_alone": 3.0, "bad_request": 1.0, "api_error": None}
    assert not any("Kubernetes" in json.dumps(body) for _, body in answers)


async def test_a_failing_scontrol_is_a_503_naming_slurm_and_dry_run_says_so(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """scontrol that cannot run is what a retry can fix: 503, naming Slurm; under
    `--dry-run` the answer says nothing was written, and nothing was."""
    broken = SlurmNodeApi(
        scontrol=GuardedScontrol(command=str(tmp_path / "no-scontrol"), conf=slurm.conf),
        state=StateFile(tmp_path / "state"),
    )
    real = SlurmNodeApi(
        scontrol=GuardedScontrol(conf=slurm.conf), state=StateFile(tmp_path / "dry-state")
    )
    for api, dry_run in ((broken, False), (DryRunNodeApi(real=real), True)):
        metrics = TainterMetrics()
        app = make_app(
            controller=controller(api, evidence=FakeEvidence(), lease="dry", store=real),
            metrics=metrics,
            auth=None,
            max_body_bytes=1 << 20,
            orchestrator="slurm",
            dry_run=dry_run,
        )
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            response = await client.post("/alerts", json=webhook(alert("gpu01", fp="dry")))
            body = await response.json()
        if dry_run:
            assert response.status == 200
            assert "nothing was written" in body["dry_run"]
            assert not drained(slurm, "gpu01")
            result = "dry_run"
        else:
            assert response.status == 503
            assert body["error"].startswith("Slurm (scontrol) failed, retry later: ")
            assert "Kubernetes" not in body["error"]
            result = "api_error"
        assert (
            metrics.registry.get_sample_value(
                "fleetwatch_tainter_webhook_requests_total", {"result": result}
            )
            == 1.0
        )


@contextlib.contextmanager
def tiny_disk(where: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs at `where` (`small_disk`), unmounted on exit; skipped, saying why, when
    it cannot be mounted (not root, or no mount in this container)."""
    with contextlib.ExitStack() as stack:
        try:
            disk = stack.enter_context(small_disk(where, 64 * 1024))
        except MissingSlurm as exc:
            pytest.skip(f"cannot mount a tmpfs for a full disk: {exc}")
        yield disk


async def test_the_state_file_on_a_full_disk_keeps_the_drain_whole_and_counted(
    slurm: SlurmCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tainter's state file (beside slurmctld's state) on a full disk: the drain is made
    once and stands, the state file stays whole (never half-written), and the failed write is
    counted and logged. The drain's audit record and its entry in the taint history are kept
    in memory and written by the first delivery after there is room again: nothing lost."""
    caplog.set_level(logging.INFO)
    with tiny_disk(tmp_path / "disk") as disk:
        state = StateFile(disk / "fleetwatch")
        state.update(lambda data: None)  # the state file exists before the disk fills
        before = state.path.read_bytes()
        with contextlib.suppress(OSError), open(disk / "filler", "wb") as out:  # until full
            while True:
                out.write(b"\0" * 4096)
                out.flush()
        api = SlurmNodeApi(scontrol=GuardedScontrol(conf=slurm.conf), state=state)
        metrics = TainterMetrics()
        app = make_app(
            controller=controller(api, evidence=FakeEvidence(), lease="disk", metrics=metrics),
            metrics=metrics,
            auth=None,
            max_body_bytes=1 << 20,
            orchestrator="slurm",
        )
        try:
            async with TestClient(TestServer(app, host="127.0.0.1")) as client:
                first = await client.post("/alerts", json=webhook(alert("gpu01", fp="disk")))
                reason = slurm.node("gpu01")["Reason"]
                again = await client.post("/alerts", json=webhook(alert("gpu01", fp="disk")))
                said = (await again.json())["error"]
                assert state.path.read_bytes() == before  # whole, not half-written
                assert records(await api.get_node("gpu01")) == {}  # not written yet
                (disk / "filler").unlink()  # room again
                room = await client.post("/alerts", json=webhook(alert("gpu01", fp="disk")))
            # While the record cannot be written the webhook asks Alertmanager to come back.
            assert (first.status, again.status, room.status) == (503, 503, 200)
            assert "No space left on device" in said
            view = await api.get_node("gpu01")
            assert set(records(view)) == {"fleetwatch.io/gpu-overheat"}
            assert len(read_history(view).taints["gpu-overheat"]) == 1
            assert reason.startswith(OURS)
            assert slurm.node("gpu01")["Reason"] == reason  # drained once, not again
            assert not state.path.with_suffix(".tmp").exists()
            errors = metrics.registry.get_sample_value(
                "fleetwatch_tainter_api_errors_total", {"status": "0"}
            )
            assert errors is not None
            assert errors >= 1
            assert any(
                "No space left on device" in str(getattr(r, "error", ""))
                for r in caplog.records
                if r.getMessage() == "call retried"
            )
        finally:
            slurm.resume("gpu01")
