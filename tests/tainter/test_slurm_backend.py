"""The tainter on Slurm (`--orchestrator=slurm`), against a fake scontrol (`testbed.fake_scontrol`).

The same controller as on Kubernetes drains with `fleetwatch:<reason> <alert>`, resumes only
its own drains, never changes a drain, down or failure someone else set, keeps its history,
quarantine, breaker and lease in the state file (read back by a second controller, as on the
backup host), gives a slow scontrol one deadline and backs off, and two controllers on one
state directory never both drain. The real Slurm story is `test_slurm_real.py`.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from fleetwatch.catalog.tainter import TAINTER_DRY_RUN_ACTIONS_TOTAL
from fleetwatch.cli import build_parser
from fleetwatch.slurm.scontrol import Node
from fleetwatch.tainter import cli
from fleetwatch.tainter.backend import Unavailable
from fleetwatch.tainter.breaker import Breaker, BreakerStore
from fleetwatch.tainter.controller import Controller
from fleetwatch.tainter.kube_objects import ApiError, Taint
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.quarantine import QUARANTINE_LABEL, read_history
from fleetwatch.tainter.service import build_app, manual_untaint
from fleetwatch.tainter.settings import (
    BreakerPolicy,
    ControllerSettings,
    QuarantineSettings,
    RetryPolicy,
)
from fleetwatch.tainter.slurm_backend import (
    OTHERS_KEY,
    STATE_FILE,
    GuardedScontrol,
    SlurmNodeApi,
    StateFile,
    answering,
    booted_this_second,
    drain_reason,
    drained_by_us,
    held_by_others,
    holds_of,
)
from fleetwatch.tainter.taint_policy import TaintPolicy
from fleetwatch.tainter.writes import records
from testbed.fake_scontrol import FakeSlurm
from tests.tainter.conftest import AUTH, FakeEvidence, alert, resolved, webhook

REAL_LINE = (
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=1 CPUTot=1 "
    "CPULoad=0.01 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 "
    "NodeAddr=127.0.0.1 NodeHostName=host Version=22.05.8 OS=Linux 6.1.0 RealMemory=1 "
    "AllocMem=0 FreeMem=1000 Sockets=1 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 "
    "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=main "
    "BootTime=2026-12-03T05:00:00 SlurmdStartTime=2026-12-03T06:00:00 "
    "LastBusyTime=2026-12-03T06:00:00 CfgTRES=cpu=1,billing=1 AllocTRES= CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=fleetwatch:gpu-overheat GPUOverheating [root@2026-12-03T06:10:00]"
)


def whose(node: Node) -> tuple[bool, bool]:
    return drained_by_us(node), held_by_others(node)


def test_reads_state_and_reason_without_slurms_suffix() -> None:
    admin = REAL_LINE.replace(
        "Reason=fleetwatch:gpu-overheat GPUOverheating", "Reason=bad fan, ticket 42 (see wiki)"
    )
    free = REAL_LINE.replace("State=IDLE+DRAIN", "State=MIXED")
    ours, theirs, idle = (
        Node.parse(line) for line in (REAL_LINE, admin, free[: free.index(" Reason=")])
    )
    assert (ours.state, ours.reason) == ("IDLE+DRAIN", "fleetwatch:gpu-overheat GPUOverheating")
    assert whose(ours) == (True, False)
    assert theirs.reason == "bad fan, ticket 42 (see wiki)"
    assert whose(theirs) == (False, True)
    assert whose(idle) == (False, False)


@pytest.mark.parametrize(
    ("state", "reason", "by_us", "by_others"),
    [
        ("DOWN+DRAIN", "fleetwatch:gpu-overheat GPUOverheating", True, True),  # Slurm downed it
        ("IDLE+DRAIN", "fleetwatch maintenance", False, True),  # not our prefix
        ("DOWN*", "Not responding", False, True),
        ("ALLOCATED+DRAIN", "fleetwatch:xid XidCritical", True, False),  # draining
        ("IDLE+FAIL", "fleetwatch:xid XidCritical", False, True),  # FAIL is not our drain
    ],
)
def test_whose_hold(state: str, reason: str, by_us: bool, by_others: bool) -> None:
    node = Node.parse(
        REAL_LINE.replace("State=IDLE+DRAIN", f"State={state}").replace(
            "fleetwatch:gpu-overheat GPUOverheating", reason
        )
    )
    assert whose(node) == (by_us, by_others)


@pytest.mark.parametrize(
    ("state", "boot_time", "seconds_after", "answers", "just_booted"),
    [
        ("IDLE+DRAIN", "2026-12-03T05:00:00", 0.0, True, True),  # registered in this second
        ("IDLE+DRAIN", "2026-12-03T05:00:00", 0.99, True, True),
        ("IDLE+DRAIN", "2026-12-03T05:00:00", 1.0, True, False),
        ("IDLE+DRAIN", "None", 0.0, True, False),  # never registered: nothing to wait out
        ("IDLE*+DRAIN", "2026-12-03T05:00:00", 60.0, False, False),
        ("IDLE+DRAIN+NOT_RESPONDING", "2026-12-03T05:00:00", 60.0, False, False),
    ],
)
def test_a_reboot_waits_for_a_node_that_answers_and_did_not_boot_this_second(
    state: str, boot_time: str, seconds_after: float, answers: bool, just_booted: bool
) -> None:
    """slurmctld 22.05 loses the end of a reboot asked of a node that does not answer, or in
    the second the node booted."""
    node = Node.parse(
        REAL_LINE.replace("State=IDLE+DRAIN", f"State={state}").replace(
            "BootTime=2026-12-03T05:00:00", f"BootTime={boot_time}"
        )
    )
    booted = datetime.fromisoformat("2026-12-03T05:00:00").timestamp()
    assert answering(node) is answers
    assert booted_this_second(node, now=booted + seconds_after) is just_booted


def test_drain_reason_names_fleetwatch_the_reason_and_the_alert() -> None:
    one = [Taint(key="fleetwatch.io/gpu-overheat", value="GPUOverheating", effect="NoSchedule")]
    assert drain_reason(one) == "fleetwatch:gpu-overheat GPUOverheating"
    two = [*one, Taint(key="fleetwatch.io/xid", value="XidCritical", effect="NoExecute")]
    text = drain_reason(two)
    assert text == "fleetwatch:gpu-overheat GPUOverheating; xid XidCritical"
    assert [(t.key, t.value) for t in holds_of(text)] == [(t.key, t.value) for t in two]


# -- the controller on the fake ---------------------------------------------------------------

FAST = RetryPolicy(attempts=6, base_delay=0.001, max_delay=0.01)


@pytest.fixture
def fake(tmp_path: Path) -> FakeSlurm:
    return FakeSlurm(tmp_path / "slurm")


def slurm_api(fake: FakeSlurm, state: Path, *, timeout: float = 5.0) -> SlurmNodeApi:
    return SlurmNodeApi(
        scontrol=GuardedScontrol(command=str(fake.scontrol), timeout=timeout, backoff=0.5),
        state=StateFile(state),
    )


def controller(
    api: SlurmNodeApi,
    *,
    evidence: FakeEvidence | None = None,
    max_new_taints: int = 100,
    metrics: TainterMetrics | None = None,
    store: bool = False,
    after: int = 3,
) -> Controller:
    return Controller(
        api=api,
        breaker=Breaker(policy=BreakerPolicy(max_new_taints=max_new_taints, max_fraction=1.0)),
        evidence=evidence or FakeEvidence(),
        alerts=None,
        metrics=metrics or TainterMetrics(),
        settings=ControllerSettings(
            hold_seconds=0.0, retry=FAST, quarantine=QuarantineSettings(after=after)
        ),
        policy=TaintPolicy(declared_reasons=None),
        breaker_store=BreakerStore(api=api, namespace="slurm", name="fleetwatch-tainter")
        if store
        else None,
    )


def alerts(*bodies: dict[str, Any]) -> list[Any]:
    return parse_webhook(webhook(*bodies))


async def test_drains_with_fleetwatchs_reason_and_resumes_on_evidence(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    evidence = FakeEvidence()
    control = controller(slurm_api(fake, tmp_path / "state"), evidence=evidence)
    await control.handle_alerts(alerts(alert("gpu01")))
    assert fake.node("gpu01")["state"] == "IDLE+DRAIN"
    assert fake.node("gpu01")["reason"] == "fleetwatch:gpu-overheat GPUOverheating"
    assert fake.updates() == [
        ["update", "nodename=gpu01", "state=drain", "reason=fleetwatch:gpu-overheat GPUOverheating"]
    ]
    await control.handle_alerts(alerts(resolved("gpu01")))
    assert fake.node("gpu01")["state"] == "IDLE+DRAIN"  # no positive evidence yet
    evidence.clear["gpu01"] = True
    await control.reconcile()
    assert fake.node("gpu01") == {"state": "IDLE", "reason": "", "user": ""}
    assert fake.updates()[-1] == ["update", "nodename=gpu01", "state=resume"]


async def test_a_drain_someone_else_set_is_never_changed(fake: FakeSlurm, tmp_path: Path) -> None:
    evidence = FakeEvidence(clear={"gpu02": True})
    fake.admin("gpu02", state="IDLE+DRAIN", reason="fleetwatch maintenance by alice")
    control = controller(slurm_api(fake, tmp_path / "state"), evidence=evidence)
    outcome = await control.handle_alerts(alerts(alert("gpu02")))  # left alone: no failure
    assert [(r.alert.node, r.why) for r in outcome.refused] == [("gpu02", "held_by_others")]
    assert "someone else" in outcome.refused[0].detail
    await control.handle_alerts(alerts(resolved("gpu02")))
    await control.reconcile()
    assert fake.node("gpu02") == {
        "state": "IDLE+DRAIN",
        "reason": "fleetwatch maintenance by alice",
        "user": "admin",
    }
    assert fake.updates() == []  # not even rewritten with the same text


async def test_never_resumes_a_drain_a_person_took_over(fake: FakeSlurm, tmp_path: Path) -> None:
    evidence = FakeEvidence()
    control = controller(slurm_api(fake, tmp_path / "state"), evidence=evidence)
    await control.handle_alerts(alerts(alert("gpu01")))
    fake.admin("gpu01", state="IDLE+DRAIN", reason="RMA ticket 7")  # a person re-drains it
    await control.handle_alerts(alerts(resolved("gpu01")))
    evidence.clear["gpu01"] = True
    await control.reconcile()
    assert fake.node("gpu01")["reason"] == "RMA ticket 7"
    assert [u for u in fake.updates() if "state=resume" in u] == []


async def test_a_downed_node_is_not_drained_over(fake: FakeSlurm, tmp_path: Path) -> None:
    fake.admin("gpu01", state="DOWN", reason="Not responding")
    api = slurm_api(fake, tmp_path / "state")
    outcome = await controller(api).handle_alerts(alerts(alert("gpu01")))
    assert [r.why for r in outcome.refused] == ["held_by_others"]
    view = await api.get_node("gpu01")
    assert [t.key for t in view.taints] == [OTHERS_KEY]
    assert fake.updates() == []


async def test_quarantine_survives_a_new_controller_on_another_host(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    """The third drain within the window quarantines; a controller started afresh on the
    same state directory (the backup host) keeps the node drained with evidence clear."""
    state = tmp_path / "state"
    evidence = FakeEvidence()
    first = controller(slurm_api(fake, state), evidence=evidence)
    for round_ in range(3):
        await first.handle_alerts(alerts(alert("gpu01", fp=f"fp-{round_}")))
        if round_ < 2:
            evidence.clear["gpu01"] = True
            await first.handle_alerts(alerts(resolved("gpu01", fp=f"fp-{round_}")))
            await first.reconcile()
            assert fake.node("gpu01")["state"] == "IDLE"
            evidence.clear["gpu01"] = False
    assert fake.node("gpu01")["state"] == "IDLE+DRAIN"
    api = slurm_api(fake, state)  # a new process: nothing in memory
    assert (await api.get_node("gpu01")).labels[QUARANTINE_LABEL] == "gpu-overheat"
    second = controller(api, evidence=FakeEvidence(clear={"gpu01": True}))
    await second.reconcile()
    assert fake.node("gpu01")["state"] == "IDLE+DRAIN"
    assert await manual_untaint(api=api, node="gpu01", reasons=None) == [
        "fleetwatch.io/gpu-overheat"
    ]
    assert fake.node("gpu01")["state"] == "IDLE"
    assert QUARANTINE_LABEL not in (await api.get_node("gpu01")).labels


async def test_a_drain_whose_state_write_failed_keeps_its_record_and_history(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    """The drain is made, then the state file's write fails on a full disk (its temporary
    file is /dev/full, which answers every write with ENOSPC, once: the failed write removes
    it). The retry finds the drain standing and writes its audit record and its entry in the
    taint history with nothing else: the drain is counted once, not lost, not doubled."""
    state = tmp_path / "state"
    api = slurm_api(fake, state)
    state.mkdir()
    (state / STATE_FILE).with_suffix(".tmp").symlink_to("/dev/full")
    metrics, evidence = TainterMetrics(), FakeEvidence()
    control = controller(api, evidence=evidence, metrics=metrics, after=2)
    await control.handle_alerts(alerts(alert("gpu01", fp="full")))
    assert not (state / STATE_FILE).with_suffix(".tmp").exists()
    assert (
        metrics.registry.get_sample_value("fleetwatch_tainter_api_errors_total", {"status": "0"})
        == 1.0
    )
    assert [u[2] for u in fake.updates()] == ["state=drain"]  # drained once
    view = await api.get_node("gpu01")
    assert set(records(view)) == {"fleetwatch.io/gpu-overheat"}
    assert records(view)["fleetwatch.io/gpu-overheat"]["alert"] == "GPUOverheating"
    assert len(read_history(view).taints["gpu-overheat"]) == 1
    assert (
        metrics.registry.get_sample_value(
            "fleetwatch_tainter_taint_operations_total", {"op": "add", "result": "ok"}
        )
        == 1.0
    )
    # The second drain within the window quarantines (after=2): the first one was counted.
    evidence.clear["gpu01"] = True
    await control.handle_alerts(alerts(resolved("gpu01", fp="full")))
    await control.reconcile()
    assert fake.node("gpu01")["state"] == "IDLE"
    evidence.clear["gpu01"] = False
    await control.handle_alerts(alerts(alert("gpu01", fp="again")))
    assert (await api.get_node("gpu01")).labels[QUARANTINE_LABEL] == "gpu-overheat"


async def test_breaker_state_is_kept_in_the_state_file(fake: FakeSlurm, tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = controller(slurm_api(fake, state), max_new_taints=1, store=True)
    outcome = await first.handle_alerts(alerts(alert("gpu01"), alert("gpu02")))
    assert [r.why for r in outcome.refused] == ["breaker_new_taints"]
    (refused,) = [r.alert.node for r in outcome.refused]  # the two syncs race: either one
    (taken,) = {"gpu01", "gpu02"} - {refused}
    assert [u[1] for u in fake.updates()] == [f"nodename={taken}"]
    second = controller(slurm_api(fake, state), max_new_taints=100, store=True)
    await second.prepare_to_lead()
    assert second.breaker.open  # adopted from the state file, not from memory
    outcome = await second.handle_alerts(alerts(alert(refused)))
    assert [r.why for r in outcome.refused] == ["breaker_new_taints"]
    assert fake.node(refused)["state"] == "IDLE"


async def test_a_hung_scontrol_costs_one_deadline_is_counted_and_backs_off(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    metrics = TainterMetrics()
    api = slurm_api(fake, tmp_path / "state", timeout=0.5)
    control = controller(api, metrics=metrics)
    fake.set(hang=True)
    started = time.monotonic()
    with pytest.raises(ApiError):
        await control.handle_alerts(alerts(alert("gpu01")))
    assert time.monotonic() - started < 2.5  # one deadline, then Unavailable at once
    assert metrics.api_errors.labels(status="0")._value.get() == 1
    with pytest.raises(Unavailable):
        await api.get_node("gpu01")
    fake.set(hang=False)
    deadline = time.monotonic() + 10
    while True:  # the backoff (0.5 s after one failure) passes; then it works again
        try:
            await control.reconcile()
            break
        except ApiError:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
    assert fake.node("gpu01")["reason"] == "fleetwatch:gpu-overheat GPUOverheating"
    hung = subprocess.run(
        ["pgrep", "-f", f"fake_scontrol.py {fake.directory}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert hung.stdout == ""  # the hung scontrol was killed at its deadline


# -- the whole app: two controllers, one state directory --------------------------------------


def slurm_settings(fake: FakeSlurm, state: Path, *extra: str) -> Any:
    args = build_parser().parse_args(
        [
            "taint",
            "--orchestrator=slurm",
            "--web.insecure-no-token",
            f"--slurm.scontrol={fake.scontrol}",
            f"--slurm.state-dir={state}",
            "--leader-elect.lease-duration=2s",
            "--leader-elect.renew-deadline=1500ms",
            "--leader-elect.retry-period=200ms",
            "--reconcile.interval=1s",
            "--taint.allow-undeclared-reasons",
            *extra,
        ]
    )
    return cli.settings_from_args(args)


async def wait_for(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := await check()):
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)
    return result


@pytest.fixture
async def two_controllers(
    fake: FakeSlurm, tmp_path: Path
) -> AsyncIterator[Sequence[TestClient[Any, Any]]]:
    state = tmp_path / "state"
    clients = []
    for _ in range(2):
        app = await build_app(slurm_settings(fake, state))
        client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
    yield clients
    for client in clients:
        await client.close()


async def test_two_controllers_never_both_drain(
    fake: FakeSlurm, two_controllers: Sequence[TestClient[Any, Any]]
) -> None:
    async def statuses() -> list[int]:
        answers = []
        for client in two_controllers:
            response = await client.post("/alerts", json=webhook(alert("gpu01")), headers=AUTH)
            answers.append(response.status)
        return answers if sorted(answers) == [200, 503] else []

    answers = await wait_for(statuses)
    leader = two_controllers[answers.index(200)]
    assert fake.node("gpu01")["reason"] == "fleetwatch:gpu-overheat GPUOverheating"
    assert len(fake.updates()) == 1  # the follower wrote nothing
    await leader.close()  # the leader goes away: the other takes over and acts
    other = two_controllers[answers.index(503)]

    async def drains_gpu02() -> bool:
        response = await other.post("/alerts", json=webhook(alert("gpu02")), headers=AUTH)
        return bool(response.status == 200)

    await wait_for(drains_gpu02)
    assert fake.node("gpu02")["reason"] == "fleetwatch:gpu-overheat GPUOverheating"
    assert [u[1] for u in fake.updates()] == ["nodename=gpu01", "nodename=gpu02"]


def test_slurm_controller_never_loads_the_kubernetes_client(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    """`fleetwatch taint --orchestrator=slurm` builds its whole app without kubernetes_asyncio,
    finding the state directory through `scontrol show config`."""
    code = f"""
import asyncio, sys
from fleetwatch.catalog.tainter import TAINTER_DRY_RUN_ACTIONS_TOTAL
from fleetwatch.cli import build_parser
from fleetwatch.tainter import cli
from fleetwatch.tainter.service import build_app
args = build_parser().parse_args(["taint", "--orchestrator=slurm", "--web.insecure-no-token",
                                  "--slurm.scontrol={fake.scontrol}"])
async def main():
    await build_app(cli.settings_from_args(args))
    print("built")
asyncio.run(main())
print("kubernetes_asyncio" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["built", "False"]
    assert fake.calls() == [["show", "config"]]


async def test_dry_run_drains_nothing_and_says_so(fake: FakeSlurm, tmp_path: Path) -> None:
    app = await build_app(slurm_settings(fake, tmp_path / "state", "--dry-run"))
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:

        async def accepted() -> bool:
            response = await client.post("/alerts", json=webhook(alert("gpu01")), headers=AUTH)
            return bool(response.status == 200)

        await wait_for(accepted)  # once it leads
        metrics = (await (await client.get("/metrics")).text()).splitlines()
    finally:
        await client.close()
    assert fake.updates() == []
    assert fake.node("gpu01")["state"] == "IDLE"
    added = f'{TAINTER_DRY_RUN_ACTIONS_TOTAL.name}{{op="add"}} 1.0'
    assert added in metrics


def test_unreachable_slurm_at_start_is_one_clear_error(fake: FakeSlurm) -> None:
    fake.set(fail=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetwatch",
            "taint",
            "--orchestrator=slurm",
            "--web.insecure-no-token",
            "--web.listen-address=127.0.0.1:0",
            f"--slurm.scontrol={fake.scontrol}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "cannot find slurmctld's StateSaveLocation" in done.stderr
    assert "--slurm.state-dir" in done.stderr


async def test_the_health_checks_drain_is_fleetwatchs_and_lifts_on_evidence(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    """`fleetwatch slurm healthcheck` drains with the controller's reason format, so the
    controller owns that drain: it holds it while the condition lasts and resumes the node on
    Prometheus' evidence, as after a restart."""
    fake.admin("gpu01", state="IDLE+DRAIN", reason="fleetwatch:gpu-overheat GPUOverheating")
    evidence = FakeEvidence()
    control = controller(slurm_api(fake, tmp_path / "state"), evidence=evidence)
    await control.reconcile()
    assert fake.node("gpu01")["state"] == "IDLE+DRAIN"  # no evidence yet
    evidence.clear["gpu01"] = True
    await control.reconcile()
    assert fake.node("gpu01")["state"] == "IDLE"
    assert fake.updates() == [["update", "nodename=gpu01", "state=resume"]]


# -- GPU nodes: the breaker's share ----------------------------------------------------------


@pytest.mark.parametrize(
    ("gres", "has_gpus"),
    [
        ("gpu:2", True),
        ("gpu:h100:8(S:0-1)", True),
        ("nic:1,gpu:4", True),
        ("gpu", True),
        ("(null)", False),
        ("gpumem:1", False),
        ("mps:100", False),
        (None, False),
    ],
)
def test_a_node_has_gpus_when_its_gres_names_gpu(gres: str | None, has_gpus: bool) -> None:
    line = "NodeName=n1 State=IDLE CPUTot=8" + (f" Gres={gres}" if gres is not None else "")
    assert Node.parse(line).has_gpus is has_gpus


async def test_gpu_nodes_carry_the_gpu_present_label(tmp_path: Path) -> None:
    fake = FakeSlurm(tmp_path / "slurm", cpu_nodes=("login01",))
    api = slurm_api(fake, tmp_path / "state")
    selected = await api.list_nodes(label_selector="nvidia.com/gpu.present=true")
    assert sorted(n.name for n in selected) == ["gpu01", "gpu02"]
    assert sorted(n.name for n in await api.list_nodes()) == ["gpu01", "gpu02", "login01"]


@pytest.mark.parametrize(
    ("selector", "drained"),
    [("nvidia.com/gpu.present=true", ["gpu01", "gpu02"]), ("", ["gpu01", "gpu02", "gpu03"])],
)
async def test_the_share_of_gpu_nodes_leaves_out_cpu_nodes(
    tmp_path: Path, selector: str, drained: list[str]
) -> None:
    """Half of the nodes out at most: of the four GPU nodes with the GPU selector (two), of
    all eight nodes without (four, so all three overheating GPU nodes go)."""
    gpus = ("gpu01", "gpu02", "gpu03", "gpu04")
    fake = FakeSlurm(tmp_path / "slurm", gpus, cpu_nodes=("cpu01", "cpu02", "cpu03", "cpu04"))
    control = Controller(
        api=slurm_api(fake, tmp_path / "state"),
        breaker=Breaker(policy=BreakerPolicy(max_new_taints=100, max_fraction=0.5)),
        evidence=FakeEvidence(),
        alerts=None,
        metrics=TainterMetrics(),
        settings=ControllerSettings(hold_seconds=0.0, retry=FAST, node_selector=selector),
        policy=TaintPolicy(declared_reasons=None),
    )
    for name in gpus[:3]:
        await control.handle_alerts(alerts(alert(name)))
    assert [name for name in gpus if "DRAIN" in fake.node(name)["state"]] == drained
