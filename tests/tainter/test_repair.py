"""The repair engine's decisions on a backend the test drives (the real stories are
tests/slurm/test_repair_real.py and tests/tainter/test_repair_kube_real.py): dry-run asks
nothing and tells once, a kind not opted in waits for a person, a node that does not answer is
not repaired, a repair not back within --repair.timeout quarantines, the breaker holds repairs
back, the attempts round-trip through their annotation; and the Kubernetes backend's reading
of a reset Job's outcome and of someone else's hold on a node."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pytest

from fleetwatch.tainter.backend import RepairTicket, RepairView
from fleetwatch.tainter.breaker import Breaker
from fleetwatch.tainter.condition import desired
from fleetwatch.tainter.desired import Intents
from fleetwatch.tainter.kube_objects import NodeView, Taint, rfc3339
from fleetwatch.tainter.kube_repair import job_outcome, others_hold
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.quarantine import QUARANTINE_LABEL, Quarantine
from fleetwatch.tainter.repair import (
    REPAIRS_ANNOTATION,
    Attempt,
    Repairer,
    attempts_annotation,
    carried_out_as,
    read_attempts,
)
from fleetwatch.tainter.repair_settings import RepairSettings
from fleetwatch.tainter.settings import (
    BreakerPolicy,
    QuarantineSettings,
    RetryPolicy,
)
from fleetwatch.tainter.writes import RECORD_ANNOTATION

NOW = 1_800_000_000
KEY = "fleetwatch.io/xid-critical"


@dataclass
class Backend:
    """One node, its jobs and repair as the test sets them, and what was asked of it."""

    node: NodeView
    view: RepairView = field(
        default_factory=lambda: RepairView(jobs_running=False, repairing=False)
    )
    started: list[str] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)
    can_repair: bool = True

    async def get_node(self, name: str) -> NodeView:
        return self.node

    async def list_nodes(self, *, label_selector: str = "") -> list[NodeView]:
        return [self.node]

    async def patch_node(
        self,
        name: str,
        *,
        resource_version: str,
        taints: Sequence[Taint] | None,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> NodeView:
        merged = {k: v for k, v in {**self.node.labels, **labels}.items() if v is not None}
        notes = {k: v for k, v in {**self.node.annotations, **annotations}.items() if v is not None}
        self.node = replace(self.node, labels=merged, annotations=notes)
        return self.node

    async def create_event(
        self, *, node: NodeView, reason: str, message: str, warning: bool
    ) -> None:
        self.events.append((reason, message))

    async def repair_view(
        self, name: str, *, repair: str, ticket: RepairTicket | None
    ) -> RepairView:
        return self.view

    async def start_repair(
        self, node: NodeView, *, repair: str, reason: str, alert: str
    ) -> RepairTicket:
        self.started.append(repair)
        return RepairTicket(boot_id="boot-1")


def held_node(repair: str = "reboot", *, attempts: Sequence[Attempt] = ()) -> NodeView:
    """A node fleetwatch took out for xid-critical, whose alerts asked for `repair`."""
    record = {KEY: {"alert": "GPUXidCritical", "repair": repair, "time": rfc3339(NOW - 600)}}
    annotations = {RECORD_ANNOTATION: json.dumps(record)}
    if attempts:
        annotations[REPAIRS_ANNOTATION] = attempts_annotation(tuple(attempts)) or ""
    return NodeView(
        name="gpu01",
        uid="gpu01",
        resource_version="1",
        taints=(Taint(key=KEY, value="GPUXidCritical", effect="NoSchedule"),),
        labels={},
        annotations=annotations,
    )


def fleet_breaker() -> Breaker:
    """A (closed) breaker over ten nodes, every one allowed out."""
    breaker = Breaker(policy=BreakerPolicy(max_new_taints=10, max_fraction=1.0))
    breaker.set_selected_nodes(10)
    return breaker


def repairer(
    backend: Backend, metrics: TainterMetrics, breaker: Breaker | None = None, **settings: object
) -> Repairer:

    async def event(node: NodeView, reason: str, message: str, *, warning: bool = False) -> None:
        await backend.create_event(node=node, reason=reason, message=message, warning=warning)

    return Repairer(
        api=backend,
        intents=Intents(resolved_seconds=60, resolved_size=10),
        breaker=breaker or fleet_breaker(),
        quarantine=Quarantine(settings=QuarantineSettings(), metrics=metrics),
        metrics=metrics,
        settings=RepairSettings(**{"mode": "on", "kinds": frozenset({"reboot"}), **settings}),  # type: ignore[arg-type]
        retry=RetryPolicy(attempts=2, base_delay=0.0, max_delay=0.0),
        event=event,
        clock=lambda: NOW,
    )


def sample(metrics: TainterMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_dry_run_asks_nothing_and_tells_once() -> None:
    backend, metrics = Backend(held_node()), TainterMetrics()
    engine = repairer(backend, metrics, mode="dry-run")
    for _ in range(3):
        await engine.node_synced(backend.node)
    assert backend.started == []
    assert [reason for reason, _ in backend.events] == ["RepairDryRun"]
    assert (
        sample(metrics, "fleetwatch_tainter_repairs_total", repair="reboot", result="dry_run") == 1
    )
    assert REPAIRS_ANNOTATION not in backend.node.annotations


async def test_a_running_job_holds_the_repair_back() -> None:
    backend, metrics = Backend(held_node()), TainterMetrics()
    backend.view = RepairView(jobs_running=True, repairing=False)
    await repairer(backend, metrics).node_synced(backend.node)
    assert backend.started == []
    backend.view = RepairView(jobs_running=False, repairing=False)
    await repairer(backend, metrics).node_synced(backend.node)
    assert backend.started == ["reboot"]
    (attempt,) = read_attempts(backend.node)
    assert (attempt.repair, attempt.asked, attempt.returned) == ("reboot", NOW, None)


async def test_a_node_that_does_not_answer_is_neither_repaired_nor_seen_back() -> None:
    """A reboot asked of a Slurm node whose slurmd does not answer yet (it just restarted)
    was lost by slurmctld 22.05 in tests/slurm/test_repair_real.py; wait for it to answer."""
    backend, metrics = Backend(held_node()), TainterMetrics()
    backend.view = RepairView(jobs_running=False, repairing=False, answering=False)
    await repairer(backend, metrics).node_synced(backend.node)
    assert backend.started == []
    backend.view = RepairView(jobs_running=False, repairing=False)
    await repairer(backend, metrics).node_synced(backend.node)
    assert backend.started == ["reboot"]
    backend.view = RepairView(jobs_running=False, repairing=False, answering=False)
    await repairer(backend, metrics).node_synced(backend.node)
    assert read_attempts(backend.node)[0].returned is None, "not back while it does not answer"


@pytest.mark.parametrize(
    ("asked_for", "kinds", "by_reboot", "carried"),
    [
        ("reboot", {"reboot"}, True, "reboot"),
        ("gpu-reset", {"reboot"}, True, None),  # not opted in
        ("gpu-reset", {"gpu-reset"}, True, "reboot"),
        ("gpu-reset", {"gpu-reset"}, False, None),  # no reset Job image named
        ("hardware-inspection", {"reboot", "gpu-reset"}, True, None),
        ("none", {"reboot", "gpu-reset"}, True, None),
    ],
)
def test_what_is_carried_out(
    asked_for: str, kinds: set[str], by_reboot: bool, carried: str | None
) -> None:
    settings = RepairSettings(mode="on", kinds=frozenset(kinds), reset_by_reboot=by_reboot)
    assert carried_out_as(asked_for, settings) == carried


async def test_a_repair_not_back_in_time_quarantines() -> None:
    flying = Attempt(
        reason="xid-critical",
        alert="GPUXidCritical",
        asked_for="reboot",
        repair="reboot",
        taken_out=NOW - 9000,
        asked=NOW - 7200,
    )
    backend, metrics = Backend(held_node(attempts=[flying])), TainterMetrics()
    backend.view = RepairView(jobs_running=False, repairing=True)
    await repairer(backend, metrics, timeout=3600.0).node_synced(backend.node)
    assert backend.node.labels[QUARANTINE_LABEL] == "xid-critical"
    assert read_attempts(backend.node)[0].timed_out
    assert (
        sample(metrics, "fleetwatch_tainter_repairs_total", repair="reboot", result="timeout") == 1
    )
    assert [reason for reason, _ in backend.events] == ["NodeQuarantined"]


async def test_the_breaker_holds_repairs_back_while_open() -> None:
    backend, metrics = Backend(held_node()), TainterMetrics()
    breaker = fleet_breaker()
    breaker.open = True  # as a refused take-out leaves it
    await repairer(backend, metrics, breaker).node_synced(backend.node)
    assert backend.started == []
    breaker.reset()
    await repairer(backend, metrics, breaker).node_synced(backend.node)
    assert backend.started == ["reboot"]


def test_attempts_round_trip_through_their_annotation() -> None:
    attempt = Attempt(
        reason="gpu-lost",
        alert="GPUFallenOffBus",
        asked_for="reboot",
        repair="reboot",
        taken_out=NOW - 60,
        asked=NOW,
        returned=NOW + 300,
    )
    node = held_node(attempts=[attempt])
    assert read_attempts(node) == (attempt,)
    broken = replace(node, annotations={REPAIRS_ANNOTATION: '[{"reason": "x"}]'})
    with pytest.raises(ValueError, match="lacks"):
        read_attempts(broken)


def test_the_node_condition_names_the_repair_asked_for() -> None:
    condition = desired(held_node("reboot"), condition_type="GPUHealthy")
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", "XidCritical")
    assert condition.message == (
        "fleetwatch holds fleetwatch.io/xid-critical (alert GPUXidCritical, repair reboot) "
        "on this node"
    )
    quiet = desired(held_node("none"), condition_type="GPUHealthy")
    assert quiet is not None
    assert "repair" not in quiet.message


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        ({}, (False, False)),
        ({"active": 1}, (False, False)),
        ({"conditions": [{"type": "Complete", "status": "True"}]}, (True, False)),
        (
            {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]},
            (True, True),
        ),
        ({"conditions": [{"type": "Failed", "status": "False"}], "succeeded": 1}, (True, False)),
        ({"failed": 1}, (True, True)),
    ],
    ids=["new", "running", "complete", "deadline", "counts-succeeded", "counts-failed"],
)
def test_the_reset_jobs_outcome(status: dict[str, object], outcome: tuple[bool, bool]) -> None:
    finished, failed, _ = job_outcome({"status": status})
    assert (finished, failed) == outcome


@pytest.mark.parametrize(
    ("taints", "cordoned", "held"),
    [
        ((), False, ""),
        ((Taint(key=KEY, value="GPUXidCritical", effect="NoSchedule"),), False, ""),
        ((Taint(key="node.kubernetes.io/unreachable", value="", effect="NoExecute"),), False, ""),
        ((Taint(key="example.com/soft", value="", effect="PreferNoSchedule"),), False, ""),
        ((Taint(key="example.com/maintenance", value="", effect="NoSchedule"),), False, "tainted"),
        ((), True, "cordoned"),
    ],
    ids=["none", "ours", "kubernetes-state", "prefer", "someone-elses", "cordoned"],
)
def test_someone_elses_hold(taints: tuple[Taint, ...], cordoned: bool, held: str) -> None:
    node = replace(held_node(), taints=taints, unschedulable=cordoned)
    assert others_hold(node).startswith(held)
    assert bool(others_hold(node)) == bool(held)
