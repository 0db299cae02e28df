"""What one node sync writes: the taints to add and remove, given the node as read.

`NodePlanner.plan` reads the node's own taints and that node's intents only
(`tainter.desired.Intents`), and decides:

- remove: taints a person asked to lift (the untaint annotation), and taints whose alerts
  all resolved where the untaint gate (`tainter.untaint_gate`) allows it and quarantine does
  not keep them;
- add: the firing intents' taints the node lacks, up to the per-node cap of the taint
  policy, and for a node that carries no fleetwatch taint yet only when the breaker grants
  it a slot (asked once per sync: a re-plan after a conflict reuses the answer);
- the quarantine marks (labels, annotations) that go with them.

A taint written before a restart that no intent knows of gets one, whose hold starts now;
intents that no longer want anything are forgotten. The plan is applied by a guarded write
(`tainter.writes.guarded_update`), which plans again on a conflict.

An added taint's audit record and its entry in the taint history are kept in memory until
the node shows the record. On Slurm the drain and the state file are two writes: a drain
made whose state-file write failed (a full disk) stands without them, and the next plan
(the write's retry, or a later sync) writes them, changing no taint, and reports the taint
added then: quarantine counts that drain once, neither zero times nor twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fleetwatch.tainter.breaker import Breaker, BreakerRefusal, counts_toward_share
from fleetwatch.tainter.desired import Intent, Intents
from fleetwatch.tainter.kube_objects import NodeView, Taint, now_rfc3339
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import KEY_PREFIX
from fleetwatch.tainter.quarantine import Marks, Quarantine
from fleetwatch.tainter.repair import in_flight, repaired
from fleetwatch.tainter.untaint_gate import UntaintGate
from fleetwatch.tainter.writes import (
    UNTAINT_ANNOTATION,
    Change,
    new_record,
    our_taints,
    records,
    untaint_requests,
)


@dataclass
class SyncAttempt:
    """Per-sync bookkeeping that survives re-plans after a conflict."""

    reserved: bool = False
    refusal: BreakerRefusal | None = None  # the breaker's, once it refused this node
    refused: list[Intent] = field(default_factory=list)  # by the breaker
    capped: list[Intent] = field(default_factory=list)  # by the per-node cap
    marks: Marks = field(default_factory=Marks)  # taint history and quarantine changes


@dataclass(frozen=True)
class _Unwritten:
    """An added taint's audit record and history reason, planned but not yet seen written."""

    record: dict[str, Any]
    reason: str


class NodePlanner:
    """Plans node syncs against the desired state, the breaker and quarantine."""

    def __init__(
        self,
        *,
        intents: Intents,
        breaker: Breaker,
        quarantine: Quarantine,
        gate: UntaintGate,
        max_per_node: int,
        owner: str,
        metrics: TainterMetrics,
    ) -> None:
        self._intents = intents
        self._breaker = breaker
        self._quarantine = quarantine
        self._gate = gate
        self._max_per_node = max_per_node
        self._owner = owner
        self._metrics = metrics
        self._unwritten: dict[str, dict[str, _Unwritten]] = {}  # by node, then taint key

    async def plan(self, node: NodeView, attempt: SyncAttempt) -> Change:
        """Decide what to add and remove on `node`, given its current state; what the
        breaker or the per-node cap kept from being added goes in `attempt`."""
        attempt.refused.clear()
        attempt.capped.clear()
        current = our_taints(node)
        history = self._quarantine.history(node)
        requested = frozenset(k for k in untaint_requests(node) or () if k in current)
        for key in requested:
            self._intents.forget(node.name, key)
        remove: set[str] = set(requested)
        for key, taint in current.items():
            if key in remove:
                continue
            intent = self._intents.on(node.name).get(key)
            if intent is None:
                # A taint we did not know of: written before a restart. Its alert, if still
                # firing, was restored from Alertmanager; otherwise the hold starts now.
                intent = Intent(
                    node=node.name,
                    key=key,
                    effect=taint.effect,
                    value=taint.value,
                    last_firing=time.monotonic(),
                )
                self._intents.add(intent)
            if intent.firing:
                continue
            if self._quarantine.holds(node, history, intent.reason):
                self._metrics.untaint_deferred.labels(why="quarantined").inc()
            elif (flying := in_flight(node)) is not None and flying.reason == intent.reason:
                self._metrics.untaint_deferred.labels(why="repairing").inc()
            elif await self._gate.may_untaint(intent, repaired=repaired(node, intent.reason)):
                remove.add(key)
        mine = self._intents.on(node.name)
        wanted = sorted(
            (i for k, i in mine.items() if i.firing and k not in current), key=lambda i: i.key
        )
        room = max(0, self._max_per_node - len(current.keys() - remove))
        attempt.capped.extend(wanted[room:])
        wanted = wanted[:room]
        released = [k.removeprefix(KEY_PREFIX) for k in requested]
        owed = self._owed(node, current.keys() - remove)
        marks = self._quarantine.plan(
            node,
            history,
            added=[i.reason for i in wanted] + [u.reason for u in owed.values()],
            released=released,
        )
        shares = counts_toward_share(
            reasons=[i.reason for i in wanted],
            labels={**node.labels, **marks.labels},
            manual=self._gate.manual,
        )
        if (
            wanted
            and not current.keys() - remove
            and not await self._reserve(node, attempt, shares)
        ):
            attempt.refused.extend(wanted)
            wanted = []
            marks = self._quarantine.plan(
                node, history, added=[u.reason for u in owed.values()], released=released
            )
        attempt.marks = marks
        add = tuple(
            Taint(key=i.key, value=i.value, effect=i.effect, time_added=now_rfc3339())
            for i in wanted
        )
        new_records = {
            t.key: new_record(
                taint=t,
                alertname=i.value,
                fingerprints=list(i.firing),
                owner=self._owner,
                repair=i.repair,
            )
            for t, i in zip(add, wanted, strict=True)
        }
        for taint, intent in zip(add, wanted, strict=True):
            self._unwritten.setdefault(node.name, {})[taint.key] = _Unwritten(
                record=new_records[taint.key], reason=intent.reason
            )
        # The standing taint itself, unchanged: the write changes no taint for it, and the
        # sync reports it added (count, log, Event) once, as the failed write never did.
        add = tuple(current[k] for k in sorted(owed)) + add
        new_records = {**{k: u.record for k, u in owed.items()}, **new_records}
        for key, intent in list(self._intents.on(node.name).items()):
            if not intent.firing and (key in remove or key not in current):
                self._intents.forget(node.name, key)
        return Change(
            add=add,
            remove=frozenset(remove),
            new_records=new_records,
            requested=requested,
            clear_untaint_request=UNTAINT_ANNOTATION in node.annotations,
            labels=marks.labels,
            annotations=marks.annotations,
        )

    def _owed(self, node: NodeView, standing: set[str]) -> dict[str, _Unwritten]:
        """The records (with their history reasons) of taints this planner added that stand
        on `node` without them; forgets those written and those of taints gone."""
        planned = self._unwritten.pop(node.name, {})
        if not planned:
            return {}
        written = records(node)
        owed = {k: u for k, u in planned.items() if k in standing and k not in written}
        if owed:
            self._unwritten[node.name] = dict(owed)
        return owed

    async def _reserve(self, node: NodeView, attempt: SyncAttempt, shares: bool) -> bool:
        """Ask the breaker (once per sync) for a slot for a node that has no fleetwatch
        taint yet; `shares`: whether it will count toward the share cap."""
        if not attempt.reserved and attempt.refusal is None:
            attempt.refusal = await self._breaker.reserve(node.name, shares=shares)
            attempt.reserved = attempt.refusal is None
        return attempt.reserved
