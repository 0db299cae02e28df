"""The controller: alert notifications and the periodic reconcile, turned into node syncs.

Desired state (`tainter.desired`) is kept per alert, not per notification: for each (node,
taint key) the set of firing alert fingerprints that want it. The taint policy
(`tainter.taint_policy`) first refuses what an alert may never ask for (NoExecute without
the operator's leave, undeclared reasons); a notification then only updates those sets and
syncs each node it touched. The periodic `reconcile` re-reads live state first
(`tainter.reconcile`: Alertmanager's active alerts, the nodes' taints), then syncs every
node that is tainted or wanted.

A node sync is one guarded write (`tainter.writes`) of what `tainter.node_plan` decides:
missing taints added (if the breaker allows a newly tainted node, within the per-node cap),
resolved ones removed where the untaint gate (`tainter.untaint_gate`) and quarantine
(`tainter.quarantine`) allow. Syncs of one node are serialized, of different nodes run
concurrently up to a bound. Whether the breaker is open is kept in the cluster
(`tainter.breaker_sync`). What each sync did is logged, counted and recorded as Events by
`tainter.events`; then the `after_sync` steps (`tainter.after_sync`: the node condition,
removal from the run) see the node as written.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field

from fleetwatch.rules.contract import repair_of
from fleetwatch.tainter.after_sync import AfterSync
from fleetwatch.tainter.backend import NodeApi
from fleetwatch.tainter.breaker import Breaker, BreakerRefusal, BreakerStore, node_out
from fleetwatch.tainter.breaker_sync import BreakerSync, publish_gauges
from fleetwatch.tainter.desired import Intent, Intents
from fleetwatch.tainter.events import SyncReport
from fleetwatch.tainter.kube_objects import ApiError, NodeView
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.node_plan import NodePlanner, SyncAttempt
from fleetwatch.tainter.payload import AlertState
from fleetwatch.tainter.quarantine import Quarantine
from fleetwatch.tainter.reconcile import LiveState
from fleetwatch.tainter.repair import Repairer
from fleetwatch.tainter.settings import ControllerSettings
from fleetwatch.tainter.sources import AlertSource, EvidenceSource
from fleetwatch.tainter.taint_policy import Refusal, TaintPolicy
from fleetwatch.tainter.untaint_gate import UntaintGate
from fleetwatch.tainter.writes import Change, LeftAlone, guarded_update

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What became of one notification: the alerts refused (by policy or per-node cap)."""

    refused: list[Refusal] = field(default_factory=list)


class NodeSyncError(ApiError):
    """Some nodes could not be synced because the Kubernetes API failed."""

    def __init__(self, failures: dict[str, ApiError]) -> None:
        detail = "; ".join(f"{node}: {exc}" for node, exc in sorted(failures.items())[:5])
        first = min(failures.values(), key=lambda exc: exc.status)
        super().__init__(
            status=first.status, reason=f"{len(failures)} node(s) not synced: {detail}"
        )
        self.failures = failures


class Controller:
    """Owns the desired state and every node write. One per process."""

    def __init__(
        self,
        *,
        api: NodeApi,
        breaker: Breaker,
        evidence: EvidenceSource,
        alerts: AlertSource | None,
        metrics: TainterMetrics,
        settings: ControllerSettings,
        policy: TaintPolicy,
        breaker_store: BreakerStore | None = None,
        after_sync: Sequence[AfterSync] = (),
    ) -> None:
        self._api = api
        self._after_sync = tuple(after_sync)  # node condition, removal from the run
        self._breaker = breaker
        self._metrics = metrics
        self._settings = settings
        self._policy = policy
        self._intents = Intents(
            resolved_seconds=settings.resolved_memory_seconds,
            resolved_size=settings.resolved_memory_size,
        )
        # One lock per node being synced now; dropped when no one holds or waits for it.
        self._node_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._slots = asyncio.Semaphore(settings.concurrency)
        self.wake = asyncio.Event()  # set when the periodic reconcile should run now
        self._told = SyncReport(
            api=api, metrics=metrics, settings=settings, policy=policy, breaker=breaker
        )
        self._quarantine = Quarantine(settings=settings.quarantine, metrics=metrics)
        self._repairer = Repairer(
            api=api,
            intents=self._intents,
            breaker=breaker,
            quarantine=self._quarantine,
            metrics=metrics,
            settings=settings.repair,
            retry=settings.retry,
            event=self._told.event,
        )
        self._gate = UntaintGate(settings=settings, evidence=evidence, metrics=metrics)
        self._planner = NodePlanner(
            intents=self._intents,
            breaker=breaker,
            quarantine=self._quarantine,
            gate=self._gate,
            max_per_node=policy.max_per_node,
            owner=settings.owner,
            metrics=metrics,
        )
        self._live = LiveState(
            api=api,
            alerts=alerts,
            intents=self._intents,
            record=lambda alerts, now: self.record_alerts(alerts, now=now),
            breaker=breaker,
            quarantine=self._quarantine,
            gate=self._gate,
            settings=settings,
            metrics=metrics,
        )
        self._breaker_sync = BreakerSync(
            breaker=breaker,
            store=breaker_store,
            owner=settings.owner,
            metrics=metrics,
            on_closed=lambda by: self._breaker_closed(by=by),
        )

    @property
    def breaker(self) -> Breaker:
        return self._breaker

    def intents(self) -> list[Intent]:
        """A snapshot of the desired state (for tests and the landing page)."""
        return self._intents.all()

    def state_sizes(self) -> dict[str, int]:
        """How many entries each per-node or per-alert structure holds: all are bounded
        (forgotten when done, or capped), which tests and the memory bench check."""
        return {
            "intents": len(self._intents),
            "node_locks": len(self._node_locks),
            "resolved_memory": len(self._intents.resolved),
        }

    # -- desired state -----------------------------------------------------------------

    def record_alerts(
        self, alerts: Iterable[AlertState], *, now: float | None = None
    ) -> tuple[set[str], list[Refusal]]:
        """Fold alert states into the desired state; returns the nodes touched and the
        alerts the policy refused (those change nothing)."""
        now = time.monotonic() if now is None else now
        allowed: list[AlertState] = []
        refused: list[Refusal] = []
        for told in alerts:
            alert = told
            if told.firing:
                asks = repair_of(self._settings.repairs, told.reason, told.labels)
                alert = dataclasses.replace(told, repair=asks)
            if alert.firing and (refusal := self._policy.check(alert)) is not None:
                refused.append(refusal)
                self._metrics.policy_refusals.labels(why=refusal.why).inc()
            else:
                allowed.append(alert)
        return self._intents.record(allowed, now=now), refused

    # -- entry points ------------------------------------------------------------------

    async def handle_alerts(self, alerts: list[AlertState]) -> Outcome:
        """Apply one webhook notification. Raises NodeSyncError when the API failed; the
        refused alerts (which changed nothing) are in the outcome."""
        touched, refused = self.record_alerts(alerts)
        for refusal in refused:
            log.warning(
                "taint refused by policy",
                extra={
                    "alertname": refusal.alert.alertname,
                    "node": refusal.alert.node,
                    "reason": refusal.alert.reason,
                    "effect": refusal.alert.effect,
                    "why": refusal.why,
                },
            )
        await self._live.ensure_counts()
        held = await self.sync_nodes(touched)
        await self._breaker_sync.store_change()
        for alert in alerts:
            if alert.firing and (alert.node, alert.key) in held:
                why = held[(alert.node, alert.key)]
                if why is None:
                    refused.append(self._policy.capped(alert))
                elif isinstance(why, LeftAlone):
                    refused.append(Refusal(alert=alert, why=why.why, detail=why.reason))
                else:
                    refused.append(why.of(alert))
        return Outcome(refused=refused)

    async def reconcile(self) -> None:
        """Re-derive everything from live state: Alertmanager's alerts and the nodes.

        Raises NodeSyncError when some nodes could not be read or written."""
        await self._live.read_alerts()
        await self._breaker_sync.store_change()
        live = await self._live.observe_counts()
        await self.sync_nodes(live | self._intents.nodes())
        await self._breaker_sync.store_change()

    def reset_breaker(self, *, by: str) -> None:
        """Close the breaker and restart its rate count; the next reconcile (woken now)
        re-evaluates live state."""
        self._breaker.reset()
        self._breaker_closed(by=by)

    def _breaker_closed(self, *, by: str) -> None:
        for intent in self._intents.all():
            intent.refused = False
        publish_gauges(self._breaker, self._metrics)
        self.wake.set()
        log.warning("circuit breaker reset", extra={"by": by})

    async def prepare_to_lead(self) -> None:
        """Before this replica acts as leader: adopt the breaker state stored in the
        cluster (an open breaker stays open) and learn the live counts. Raises ApiError,
        and then the replica does not lead yet."""
        self._breaker_sync.forget()
        await self.sync_breaker(store=False)  # not leader yet: adopt only, write later
        await self._live.observe_counts()

    async def sync_breaker(self, *, store: bool = True) -> None:
        """Make the breaker agree with the cluster (`BreakerSync.sync`); a follower passes
        `store=False` and only adopts. Raises ApiError."""
        await self._breaker_sync.sync(store=store)

    async def sync_nodes(
        self, nodes: Iterable[str]
    ) -> dict[tuple[str, str], BreakerRefusal | LeftAlone | None]:
        """Sync each node (concurrently, bounded); raises NodeSyncError listing failures.
        Returns the (node, key) pairs kept from being added: by the breaker (its refusal),
        by the backend leaving the node alone (someone else holds it) or by the per-node cap
        (None)."""
        names = sorted(set(nodes))
        results = await asyncio.gather(*(self._sync_node(n) for n in names), return_exceptions=True)
        failures: dict[str, ApiError] = {}
        held: dict[tuple[str, str], BreakerRefusal | LeftAlone | None] = {}
        for name, result in zip(names, results, strict=True):
            if isinstance(result, ApiError):
                failures[name] = result
            elif isinstance(result, BaseException):
                raise result
            else:
                held.update(((name, key), why) for key, why in result.items())
        publish_gauges(self._breaker, self._metrics)
        if failures:
            raise NodeSyncError(failures)
        return held

    # -- one node ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _node_lock(self, name: str) -> AsyncIterator[None]:
        """Serialize syncs of one node; the lock lives only while someone needs it, so
        alerts for ever new node names cannot grow memory."""
        lock, users = self._node_locks.get(name) or (asyncio.Lock(), 0)
        self._node_locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._node_locks[name]
            if users == 1:
                del self._node_locks[name]
            else:
                self._node_locks[name] = (lock, users - 1)

    async def _sync_node(self, name: str) -> dict[str, BreakerRefusal | LeftAlone | None]:
        """Sync one node; returns the keys kept from being added (`sync_nodes`)."""
        async with self._node_lock(name), self._slots:
            attempt = SyncAttempt()

            async def plan(node: NodeView) -> Change:
                return await self._planner.plan(node, attempt)

            try:
                node, change = await guarded_update(
                    api=self._api,
                    name=name,
                    plan=plan,
                    retry=self._settings.retry,
                    metrics=self._metrics,
                )
            except LeftAlone as exc:
                if attempt.reserved:
                    self._breaker.release(name)
                log.info(
                    "node left alone", extra={"node": name, "why": exc.why, "detail": exc.reason}
                )
                return {key: exc for key, intent in self._intents.on(name).items() if intent.firing}
            except ApiError as exc:
                if attempt.reserved:
                    self._breaker.release(name)
                if exc.status == 404:
                    log.warning(
                        "node not found; forgetting its taint requests", extra={"node": name}
                    )
                    self._intents.forget_node(name)
                    return {}
                log.error("node sync failed", extra={"node": name, "error": str(exc)})
                raise
            self._breaker.commit(name, out=node_out(node, manual=self._gate.manual))
            await self._quarantine.report(node, attempt.marks, event=self._told.event)
            await self._told.sync_done(
                node,
                change,
                capped=attempt.capped,
                refused=attempt.refused,
                refusal=attempt.refusal,
            )
            for step in self._after_sync:
                await step.node_synced(node)
            await self._repairer.node_synced(node)
            held = dict.fromkeys((intent.key for intent in attempt.capped), None)
            return held | {intent.key: attempt.refusal for intent in attempt.refused}
