"""Repair after the drain, and escalation when a repair does not hold.

A node fleetwatch took out waits for a person unless its reason's declared repair (the
remediation contract: none, gpu-reset, reboot, hardware-inspection; written into each hold's
audit record when it is taken out) is one the operator opted in to (`--repair.kinds`) and
`--repair.mode` is not off. Then, after each sync of the node, this engine:

- once the node's jobs are gone, asks the orchestrator for the repair (`backend.RepairApi`:
  on Slurm `scontrol reboot ASAP nextstate=RESUME`, whose RebootProgram reboots and whose
  slurmctld puts the node back; on Kubernetes `tainter.kube_repair`: the node-repair
  controllers' reboot seen by the boot ID, or a GPU reset Job), one repair per node at a
  time, never of a node someone else holds out or one that does not answer, and only while
  the breaker allows it (repairs in flight count toward its share cap); `dry-run` logs,
  counts and records an Event instead, once per take-out;
- treats the firing alerts that asked for it as answered (`Intents.consume`), so a late
  notification of the same alert does not take the repaired node out again;
- watches the repair: back when the orchestrator no longer carries it out (time from taken
  out to back in service is observed per reason; a manual reason is then lifted, as a person
  would: `repaired`); failed (the reset Job failed) or not back within `--repair.timeout`,
  it did not work;
- escalates as gpud does after two reboots: a reason back within `--repair.window` after
  its repair returned means the repair did not hold; after `--repair.max-attempts` repairs
  of one reason within the window (or one that failed or timed out) the engine stops repairing and
  quarantines the node for hardware inspection (`tainter.quarantine`: the label, the
  history annotation and a `NodeQuarantined` Event naming the repairs).

The attempts are kept on the node (annotation `fleetwatch.io/repairs`), never only in
memory, so a restart or a new leader carries on; the node planner keeps a hold whose repair
is in flight (`in_flight`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from fleetwatch.durations import format_duration
from fleetwatch.tainter.backend import NodeApi, RepairApi, RepairTicket, repair_backend
from fleetwatch.tainter.breaker import Breaker
from fleetwatch.tainter.desired import Intents
from fleetwatch.tainter.kube_objects import ApiError, NodeView, parse_rfc3339, rfc3339
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import KEY_PREFIX
from fleetwatch.tainter.quarantine import EventSink, Quarantine
from fleetwatch.tainter.repair_settings import RepairSettings
from fleetwatch.tainter.settings import RetryPolicy
from fleetwatch.tainter.writes import our_taints, records, with_retries

log = logging.getLogger(__name__)

REPAIRS_ANNOTATION: Final = "fleetwatch.io/repairs"
REBOOT: Final = "reboot"
GPU_RESET: Final = "gpu-reset"
MAX_ATTEMPTS_KEPT: Final = 16


@dataclass(frozen=True, slots=True)
class Attempt:
    """One repair asked of the orchestrator: for which reason and alert, which repair
    (`asked_for`) carried out how (`repair`), when the node was taken out and the repair
    asked (Unix seconds), and when it came back (None while in flight), `timed_out` or
    `failed`; the node's boot ID when it started or the reset Job (`backend.RepairTicket`)."""

    reason: str
    alert: str
    asked_for: str
    repair: str
    taken_out: int
    asked: int
    returned: int | None = None
    timed_out: bool = False
    failed: bool = False
    boot_id: str = ""
    job: str = ""

    @property
    def ticket(self) -> RepairTicket:
        """What the backend gave when the repair started (`backend.RepairTicket`)."""
        return RepairTicket(boot_id=self.boot_id, job=self.job)

    @property
    def flying(self) -> bool:
        """Still in flight: neither back, nor timed out, nor failed."""
        return self.returned is None and not self.timed_out and not self.failed

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "reason": self.reason,
            "alert": self.alert,
            "askedFor": self.asked_for,
            "repair": self.repair,
            "takenOut": rfc3339(self.taken_out),
            "asked": rfc3339(self.asked),
        }
        if self.returned is not None:
            data["returned"] = rfc3339(self.returned)
        if self.timed_out:
            data["timedOut"] = True
        if self.failed:
            data["failed"] = True
        if self.boot_id:
            data["bootID"] = self.boot_id
        if self.job:
            data["job"] = self.job
        return data

    @classmethod
    def from_json(cls, data: Any) -> Attempt:
        """One attempt of the annotation; ValueError naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("each attempt must be an object")
        try:
            returned = data.get("returned")
            return cls(
                reason=str(data["reason"]),
                alert=str(data.get("alert", "")),
                asked_for=str(data.get("askedFor", data["repair"])),
                repair=str(data["repair"]),
                taken_out=parse_rfc3339(data["takenOut"]),
                asked=parse_rfc3339(data["asked"]),
                returned=None if returned is None else parse_rfc3339(returned),
                timed_out=bool(data.get("timedOut", False)),
                failed=bool(data.get("failed", False)),
                boot_id=str(data.get("bootID", "")),
                job=str(data.get("job", "")),
            )
        except KeyError as exc:
            raise ValueError(f"an attempt lacks {exc.args[0]!r}") from exc


def read_attempts(node: NodeView) -> tuple[Attempt, ...]:
    """The node's repair attempts, oldest first; ValueError when unreadable."""
    text = node.annotations.get(REPAIRS_ANNOTATION)
    if text is None:
        return ()
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError(f"{REPAIRS_ANNOTATION}: expected a list of attempts")
    return tuple(Attempt.from_json(item) for item in data)


def attempts_annotation(attempts: tuple[Attempt, ...]) -> str | None:
    """The annotation value for `attempts` (the newest MAX_ATTEMPTS_KEPT); None when none."""
    kept = attempts[-MAX_ATTEMPTS_KEPT:]
    if not kept:
        return None
    return json.dumps([a.to_json() for a in kept], separators=(",", ":"), sort_keys=True)


def in_flight(node: NodeView) -> Attempt | None:
    """The node's repair in flight, if any (an unreadable annotation: none)."""
    try:
        attempts = read_attempts(node)
    except ValueError:
        return None
    return next((a for a in attempts if a.flying), None)


def repaired(node: NodeView, reason: str) -> bool:
    """Whether a repair of `reason` asked since its hold's take-out (its audit record's
    time) came back: the evidence a person gives by releasing a manual reason, which lets the
    untaint gate lift it (`tainter.untaint_gate`)."""
    record = records(node).get(KEY_PREFIX + reason) or {}
    try:
        attempts = read_attempts(node)
        taken_out = parse_rfc3339(record.get("time"))
    except ValueError:
        return False
    return any(
        a.reason == reason and a.asked >= taken_out and a.returned is not None for a in attempts
    )


def carried_out_as(asked_for: str, settings: RepairSettings) -> str | None:
    """The repair fleetwatch asks the orchestrator for, for a hold whose reason asks for
    `asked_for`; None when it waits for a person (not opted in, or not a repair an
    orchestrator carries out). A GPU reset is a reboot unless the operator named the reset
    Job's image (`--repair.reset-image`) and turned `--repair.reset-by-reboot` off."""
    if asked_for not in settings.kinds:
        return None
    if asked_for == GPU_RESET:
        if settings.reset_by_reboot:
            return REBOOT
        return GPU_RESET if settings.reset_image else None
    return asked_for if asked_for == REBOOT else None


@dataclass(frozen=True, slots=True)
class Hold:
    """One fleetwatch hold on a node, as its audit record says: the reason and alert, the
    repair they ask for and how fleetwatch carries it out, and when it was taken out."""

    reason: str
    alert: str
    asked_for: str
    repair: str
    taken_out: int


class Repairer:
    """The repair engine: run after each sync of a node (`node_synced`)."""

    def __init__(
        self,
        *,
        api: NodeApi,
        intents: Intents,
        breaker: Breaker,
        quarantine: Quarantine,
        metrics: TainterMetrics,
        settings: RepairSettings,
        retry: RetryPolicy,
        event: EventSink,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._repairs = repair_backend(api)
        self._intents = intents
        self._breaker = breaker
        self._quarantine = quarantine
        self._metrics = metrics
        self._settings = settings
        self._retry = retry
        self._event = event
        self._clock = clock
        self._in_flight: set[str] = set()
        # The take-out (reason, when) each node's dry run told of last: told once, bounded.
        self._dry_runs: dict[str, tuple[str, int]] = {}

    @property
    def in_flight_nodes(self) -> frozenset[str]:
        """Nodes whose repair is in flight, as last seen."""
        return frozenset(self._in_flight)

    def _note(self, node: str, flying: bool) -> None:
        (self._in_flight.add if flying else self._in_flight.discard)(node)
        self._metrics.repairs_in_flight.set(len(self._in_flight))

    async def node_synced(self, node: NodeView) -> None:
        """Repair, watch or escalate `node`; failures are logged and counted, and the next
        sync of the node tries again."""
        if self._settings.mode == "off" or self._repairs is None:
            return
        try:
            await self._step(node, self._repairs)
        except ApiError as exc:
            log.error(
                "repair step failed; the next sync retries",
                extra={"node": node.name, "error": str(exc)},
            )

    async def _step(self, node: NodeView, repairs: RepairApi) -> None:
        try:
            attempts = read_attempts(node)
        except ValueError as exc:
            self._metrics.malformed_annotations.labels(annotation=REPAIRS_ANNOTATION).inc()
            log.warning(
                "repair history unreadable; read as empty",
                extra={"node": node.name, "error": str(exc)},
            )
            attempts = ()
        now = int(self._clock())
        flying = next((a for a in attempts if a.flying), None)
        self._note(node.name, flying is not None)
        if flying is not None:
            await self._watch(node, repairs, attempts, flying, now)
            return
        history = self._quarantine.history(node)
        audit = records(node)
        for key in sorted(our_taints(node)):
            reason = key.removeprefix(KEY_PREFIX)
            record = audit.get(key) or {}
            asked_for = str(record.get("repair", "none"))
            repair = carried_out_as(asked_for, self._settings)
            if repair is None or self._quarantine.holds(node, history, reason):
                continue
            hold = Hold(
                reason=reason,
                alert=str(record.get("alert", "")),
                asked_for=asked_for,
                repair=repair,
                taken_out=_time(record.get("time"), default=now),
            )
            await self._repair(node, repairs, attempts, hold, now)
            return

    async def _watch(
        self,
        node: NodeView,
        repairs: RepairApi,
        attempts: tuple[Attempt, ...],
        flying: Attempt,
        now: int,
    ) -> None:
        """A repair in flight: back, failed, still going, or past `--repair.timeout`."""
        view = await repairs.repair_view(node.name, repair=flying.repair, ticket=flying.ticket)
        if view.failed:
            await self._event(
                node,
                "RepairFailed",
                f"{flying.repair} for {KEY_PREFIX}{flying.reason} (alert {flying.alert}) did "
                f"not work: {view.detail}",
                warning=True,
            )
            await self._not_back(node, attempts, flying, result="failed", why="failed")
            return
        if view.repairing or not view.answering:
            if now - flying.asked <= self._settings.timeout:
                return
            await self._not_back(
                node,
                attempts,
                flying,
                result="timeout",
                why=f"was not back within {format_duration(self._settings.timeout)}",
            )
            return
        done = replace(flying, returned=now)
        self._metrics.repairs.labels(repair=flying.repair, result="returned").inc()
        self._metrics.back_in_service.labels(reason=flying.reason).observe(
            max(0, now - flying.taken_out)
        )
        await self._store(node.name, _swap(attempts, flying, done))
        self._note(node.name, False)
        log.info(
            "repair returned",
            extra={"node": node.name, "reason": flying.reason, "repair": flying.repair},
        )
        await self._event(
            node,
            "RepairReturned",
            f"{flying.repair} for {KEY_PREFIX}{flying.reason} (alert {flying.alert}) came "
            f"back after {format_duration(float(now - flying.asked))}; out "
            f"{format_duration(float(now - flying.taken_out))} in all"
            + (f" ({view.detail})" if view.detail else ""),
        )

    async def _not_back(
        self,
        node: NodeView,
        attempts: tuple[Attempt, ...],
        flying: Attempt,
        *,
        result: str,
        why: str,
    ) -> None:
        """A repair that ended without the node back (`result` failed, or timeout): recorded
        on the node, counted, and escalated to quarantine."""
        done = replace(flying, failed=result == "failed", timed_out=result == "timeout")
        self._metrics.repairs.labels(repair=flying.repair, result=result).inc()
        await self._store(node.name, _swap(attempts, flying, done))
        self._note(node.name, False)
        await self._escalate(node, flying.reason, f"its {flying.repair} {why}")

    async def _repair(
        self,
        node: NodeView,
        repairs: RepairApi,
        attempts: tuple[Attempt, ...],
        hold: Hold,
        now: int,
    ) -> None:
        """Escalate a reason whose repairs did not hold, else repair it once its jobs left."""
        since = now - self._settings.window
        recent = [a for a in attempts if a.reason == hold.reason and a.asked > since]
        live = self._settings.mode == "on"
        back = [a for a in recent if a.returned is not None and a.returned <= hold.taken_out]
        if (
            any(a.timed_out or a.failed for a in recent)
            or len(recent) >= self._settings.max_attempts
        ):
            if live:
                self._not_held(hold, back)
                window = format_duration(self._settings.window)
                await self._escalate(
                    node,
                    hold.reason,
                    f"it came back after {len(recent)} {hold.repair}(s) within {window} "
                    f"(--repair.max-attempts={self._settings.max_attempts})",
                )
            return
        view = await repairs.repair_view(node.name, repair=hold.repair, ticket=None)
        if view.others_hold:
            log.info(
                "not repaired: someone else holds the node out",
                extra={"node": node.name, "reason": hold.reason, "held": view.others_hold},
            )
            return
        if view.jobs_running or view.repairing or not view.answering:
            return
        refusal = self._breaker.may_repair(self._in_flight - {node.name})
        if refusal is not None:
            log.warning(
                "repair held back by the breaker",
                extra={"node": node.name, "reason": hold.reason, "why": refusal},
            )
            return
        what = (
            f"{hold.repair} for {KEY_PREFIX}{hold.reason} (alert {hold.alert}, "
            f"asked for: {hold.asked_for})"
        )
        if not live:
            told = (hold.reason, hold.taken_out)
            if self._dry_runs.get(node.name) != told:
                self._dry_runs[node.name] = told
                self._metrics.repairs.labels(repair=hold.repair, result="dry_run").inc()
                await self._event(
                    node, "RepairDryRun", f"would ask for {what} (--repair.mode=dry-run)"
                )
            return
        self._not_held(hold, back)
        await self._start(node, repairs, (attempts, hold, now), what=what, count=len(recent) + 1)

    def _not_held(self, hold: Hold, back: list[Attempt]) -> None:
        """Count the repair that returned before this take-out of the same reason: it did
        not hold (counted once: the caller escalates or repairs again right after)."""
        if back:
            self._metrics.repairs_not_held.labels(reason=hold.reason, repair=back[-1].repair).inc()

    async def _start(
        self,
        node: NodeView,
        repairs: RepairApi,
        state: tuple[tuple[Attempt, ...], Hold, int],
        *,
        what: str,
        count: int,
    ) -> None:
        """Ask the orchestrator for the repair and record the attempt on the node."""
        attempts, hold, now = state
        try:
            ticket = await repairs.start_repair(
                node, repair=hold.repair, reason=hold.reason, alert=hold.alert
            )
        except ApiError as exc:
            self._metrics.repairs.labels(repair=hold.repair, result="error").inc()
            await self._event(
                node, "RepairFailed", f"could not ask for {what}: {exc}", warning=True
            )
            return
        self._metrics.repairs.labels(repair=hold.repair, result="started").inc()
        self._intents.consume(node.name, KEY_PREFIX + hold.reason, now=float(now))
        attempt = Attempt(
            reason=hold.reason,
            alert=hold.alert,
            asked_for=hold.asked_for,
            repair=hold.repair,
            taken_out=hold.taken_out,
            asked=now,
            boot_id=ticket.boot_id,
            job=ticket.job,
        )
        await self._store(node.name, (*attempts, attempt))
        self._note(node.name, True)
        log.warning(
            "repair started",
            extra={"node": node.name, "reason": hold.reason, "repair": hold.repair},
        )
        await self._event(
            node,
            "RepairStarted",
            f"asked for {what}"
            + (f": {ticket.how}" if ticket.how else "")
            + f"; attempt {count} of {self._settings.max_attempts} within "
            f"{format_duration(self._settings.window)}",
        )

    async def _escalate(self, node: NodeView, reason: str, why: str) -> None:
        """Stop repairing `reason` and quarantine the node for hardware inspection."""
        name = node.name

        async def write() -> None:
            fresh = await self._api.get_node(name)
            marks = self._quarantine.hold_for_inspection(
                fresh, self._quarantine.history(fresh), reason
            )
            if marks.labels or marks.annotations:
                await self._api.patch_node(
                    name,
                    resource_version=fresh.resource_version,
                    taints=None,
                    labels=marks.labels,
                    annotations=marks.annotations,
                )

        await with_retries(
            write, retry=self._retry, metrics=self._metrics, what=f"quarantine node {name}"
        )
        self._metrics.quarantines.labels(reason=reason).inc()
        log.error(
            "repair did not hold: node quarantined for hardware inspection",
            extra={"node": name, "reason": reason},
        )
        await self._event(
            node,
            "NodeQuarantined",
            f"{KEY_PREFIX}{reason}: repair stopped, {why}; hardware inspection: the hold stays "
            f"until a person runs `fleetwatch untaint {name} --reason={reason}` "
            f"(history in annotation {REPAIRS_ANNOTATION})",
            warning=True,
        )

    async def _store(self, name: str, attempts: tuple[Attempt, ...]) -> None:
        """Write the attempts on the node (re-read: a repair changes the node's version)."""
        text = attempts_annotation(attempts)

        async def write() -> None:
            fresh = await self._api.get_node(name)
            if fresh.annotations.get(REPAIRS_ANNOTATION) == text:
                return
            await self._api.patch_node(
                name,
                resource_version=fresh.resource_version,
                taints=None,
                labels={},
                annotations={REPAIRS_ANNOTATION: text},
            )

        await with_retries(
            write, retry=self._retry, metrics=self._metrics, what=f"record repairs of node {name}"
        )


def _swap(attempts: tuple[Attempt, ...], old: Attempt, new: Attempt) -> tuple[Attempt, ...]:
    return tuple(new if a == old else a for a in attempts)


def _time(value: Any, *, default: int) -> int:
    """An audit record's RFC 3339 time as Unix seconds; `default` when missing or unreadable."""
    try:
        return parse_rfc3339(value) if isinstance(value, str) else default
    except ValueError:
        return default
