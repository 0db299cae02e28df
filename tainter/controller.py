"""The reconcile loop: desired taints per (node, key) from alerts, applied to nodes safely.

Desired state (`tainter.desired`) is kept per alert, not per notification: for each (node,
taint key) the set of firing alert fingerprints that want it. The taint policy first
refuses what an alert may never ask for (NoExecute without the operator's leave, undeclared
reasons). A notification then only updates those sets: a resolve is remembered for a
bounded time by fingerprint and startsAt, so a late (retried) firing of the same alert
instance does not taint. Each touched node is synced: add missing taints whose set is
non-empty (if the breaker allows a newly tainted node, and the node stays within the
per-node cap), and remove taints whose set is empty only when the reason is not manual, the
hold time has passed since the alert was last seen firing, Prometheus confirms the
condition is clear, and the reason is not quarantined on the node (`tainter.quarantine`:
the `--quarantine.after`-th taint for one reason within the window keeps it until a person
lifts it). The periodic `reconcile` does the same from live state: Alertmanager's active
alerts and the nodes' own taints and annotations, which is also how a restarted tainter (or
a new leader) rebuilds its state. Whether the breaker is open is kept in the cluster. What
each sync did is logged, counted and recorded as Events by `tainter.events`; then the
`after_sync` steps (`tainter.after_sync`: the node condition, removal from the run) see
the node as written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field

from fleetwatch.tainter.after_sync import AfterSync
from fleetwatch.tainter.backend import NodeApi
from fleetwatch.tainter.breaker import (
    Breaker,
    BreakerRecord,
    BreakerRefusal,
    BreakerStore,
    counts_toward_share,
    node_out,
)
from fleetwatch.tainter.desired import Intent, ResolvedMemory
from fleetwatch.tainter.events import SyncReport
from fleetwatch.tainter.kube_objects import ApiError, NodeView, Taint, now_rfc3339
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import KEY_PREFIX, AlertState
from fleetwatch.tainter.quarantine import Marks, Quarantine
from fleetwatch.tainter.settings import ControllerSettings
from fleetwatch.tainter.sources import AlertSource, EvidenceSource, SourceError
from fleetwatch.tainter.taint_policy import Refusal, TaintPolicy
from fleetwatch.tainter.writes import (
    TAINTED_LABEL,
    UNTAINT_ANNOTATION,
    Change,
    guarded_update,
    new_record,
    our_taints,
    untaint_requests,
    with_retries,
)

log = logging.getLogger(__name__)


@dataclass
class _SyncAttempt:
    """Per-sync bookkeeping that survives re-plans after a conflict."""

    reserved: bool = False
    refusal: BreakerRefusal | None = None  # the breaker's, once it refused this node
    refused: list[Intent] = field(default_factory=list)  # by the breaker
    capped: list[Intent] = field(default_factory=list)  # by the per-node cap
    marks: Marks = field(default_factory=Marks)  # taint history and quarantine changes


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
        self._evidence = evidence
        self._alerts = alerts
        self._metrics = metrics
        self._settings = settings
        self._policy = policy
        self._breaker_store = breaker_store
        self._stored_breaker: BreakerRecord | None = None  # the record last read or written
        self._intents: dict[tuple[str, str], Intent] = {}
        self._resolved = ResolvedMemory(
            seconds=settings.resolved_memory_seconds, size=settings.resolved_memory_size
        )
        # One lock per node being synced now; dropped when no one holds or waits for it.
        self._node_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._slots = asyncio.Semaphore(settings.concurrency)
        self._count_lock = asyncio.Lock()
        self.wake = asyncio.Event()  # set when the periodic reconcile should run now
        self._told = SyncReport(
            api=api, metrics=metrics, settings=settings, policy=policy, breaker=breaker
        )
        self._quarantine = Quarantine(settings=settings.quarantine, metrics=metrics)

    @property
    def breaker(self) -> Breaker:
        return self._breaker

    def intents(self) -> list[Intent]:
        """A snapshot of the desired state (for tests and the landing page)."""
        return list(self._intents.values())

    def state_sizes(self) -> dict[str, int]:
        """How many entries each per-node or per-alert structure holds: all are bounded
        (forgotten when done, or capped), which tests and the memory bench check."""
        return {
            "intents": len(self._intents),
            "node_locks": len(self._node_locks),
            "resolved_memory": len(self._resolved),
        }

    # -- desired state -----------------------------------------------------------------

    def record_alerts(
        self, alerts: Iterable[AlertState], *, now: float | None = None
    ) -> tuple[set[str], list[Refusal]]:
        """Fold alert states into the desired state; returns the nodes touched and the
        alerts the policy refused (those change nothing)."""
        now = time.time() if now is None else now
        touched: set[str] = set()
        refused: list[Refusal] = []
        for alert in alerts:
            if alert.firing and (refusal := self._policy.check(alert)) is not None:
                refused.append(refusal)
                self._metrics.policy_refusals.labels(why=refusal.why).inc()
                continue
            if not alert.firing:
                self._resolved.remember(alert.fingerprint, alert.starts_at, now=now)
            elif self._resolved.resolved(alert.fingerprint, alert.starts_at, now=now):
                log.info(
                    "late firing of an alert already resolved; ignored",
                    extra={"node": alert.node, "key": alert.key, "fingerprint": alert.fingerprint},
                )
                continue
            intent = self._intents.get((alert.node, alert.key))
            if intent is None:
                if not alert.firing:
                    continue  # a resolve for something we never tainted for
                intent = Intent(
                    node=alert.node, key=alert.key, effect=alert.effect, value=alert.alertname
                )
                self._intents[(alert.node, alert.key)] = intent
            touched.add(alert.node)
            if alert.firing:
                intent.firing[alert.fingerprint] = alert.starts_at
                intent.last_firing = now
            elif alert.fingerprint in intent.firing:
                del intent.firing[alert.fingerprint]
                intent.last_firing = now
        return touched, refused

    def _forget(self, node: str, key: str) -> None:
        self._intents.pop((node, key), None)

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
        await self._ensure_live_counts()
        held = await self.sync_nodes(touched)
        await self._store_breaker_change()
        for alert in alerts:
            if alert.firing and (alert.node, alert.key) in held:
                by_breaker = held[(alert.node, alert.key)]
                refused.append(
                    self._policy.capped(alert) if by_breaker is None else by_breaker.of(alert)
                )
        return Outcome(refused=refused)

    async def reconcile(self) -> None:
        """Re-derive everything from live state: Alertmanager's alerts and the nodes.

        Raises NodeSyncError when some nodes could not be read or written."""
        if self._alerts is not None:
            await self._reconcile_alerts()
        await self._store_breaker_change()
        live = await self._observe_live_counts()
        wanted = {node for (node, _), intent in self._intents.items() if intent.firing}
        await self.sync_nodes(live | wanted | {node for node, _ in self._intents})
        await self._store_breaker_change()

    async def _reconcile_alerts(self) -> None:
        assert self._alerts is not None
        try:
            firing = await self._alerts.firing_alerts()
        except SourceError as exc:
            self._metrics.source_errors.labels(source="alertmanager").inc()
            log.warning(
                "cannot read Alertmanager alerts; reconciling nodes only",
                extra={"error": str(exc)},
            )
            return
        now = time.time()
        _, refused = self.record_alerts(firing, now=now)
        if refused:
            log.warning(
                "active alerts refused by the taint policy",
                extra={"count": len(refused), "first": refused[0].detail},
            )
        live = {(a.node, a.key, a.fingerprint) for a in firing}
        for intent in self._intents.values():
            for fingerprint, starts_at in list(intent.firing.items()):
                if (intent.node, intent.key, fingerprint) not in live:
                    log.info(
                        "alert no longer active in Alertmanager; treating as resolved",
                        extra={"node": intent.node, "key": intent.key, "fingerprint": fingerprint},
                    )
                    del intent.firing[fingerprint]
                    self._resolved.remember(fingerprint, starts_at, now=now)
                    intent.last_firing = now

    async def _observe_live_counts(self) -> set[str]:
        """Tell the breaker how many nodes are selected and which carry our taints (live,
        from the API); returns the tainted ones."""
        selected = await self._list_nodes(self._settings.node_selector)
        self._breaker.set_selected_nodes(len(selected))
        tainted = [n for n in await self._list_nodes(f"{TAINTED_LABEL}=true") if our_taints(n)]
        self._breaker.observe({n.name: bool(node_out(n, manual=self._manual)) for n in tainted})
        self._quarantine.observe(tainted)
        self._publish_gauges()
        return {n.name for n in tainted}

    async def _ensure_live_counts(self) -> None:
        """Before the first write of a new process (or leader), learn the live counts, so
        the breaker's cap counts the nodes an earlier process tainted."""
        async with self._count_lock:  # one list for a burst of first notifications
            if self._breaker.selected_nodes is None:
                await self._observe_live_counts()

    async def _list_nodes(self, selector: str) -> list[NodeView]:
        """List nodes, retrying what a retry can fix (like writes)."""
        return await with_retries(
            lambda: self._api.list_nodes(label_selector=selector),
            retry=self._settings.retry,
            metrics=self._metrics,
            what=f"list nodes {selector!r}",
        )

    def reset_breaker(self, *, by: str) -> None:
        """Close the breaker and restart its rate count; the next reconcile (woken now)
        re-evaluates live state."""
        self._breaker.reset()
        self._breaker_closed(by=by)

    def _breaker_closed(self, *, by: str) -> None:
        for intent in self._intents.values():
            intent.refused = False
        self._publish_gauges()
        self.wake.set()
        log.warning("circuit breaker reset", extra={"by": by})

    # -- the breaker's state in the cluster ---------------------------------------------

    async def prepare_to_lead(self) -> None:
        """Before this replica acts as leader: adopt the breaker state stored in the
        cluster (an open breaker stays open) and learn the live counts. Raises ApiError,
        and then the replica does not lead yet."""
        self._stored_breaker = None
        await self.sync_breaker(store=False)  # not leader yet: adopt only, write later
        await self._observe_live_counts()

    async def sync_breaker(self, *, store: bool = True) -> None:
        """Make the breaker agree with the cluster: adopt a change made there (a reset by
        `fleetwatch breaker reset`, or the state a previous leader left: open or not, and
        its take-outs within the window), or store a change made here (it opened, took a
        node out, or auto-closed). A follower passes `store=False`: it only adopts, so its
        metrics show the cluster's state and it writes nothing. Raises ApiError."""
        if self._breaker_store is None:
            return
        _, record = await self._breaker_store.read()
        if record is not None and record != self._stored_breaker:
            self._stored_breaker = record
            was_open = self._breaker.open
            self._breaker.adopt(record)
            if record.open and not was_open:
                log.warning(
                    "circuit breaker open, as stored in the cluster",
                    extra={"since": record.opened_at, "cap": record.cap, "by": record.changed_by},
                )
            elif not record.open and was_open:
                self._breaker_closed(by=record.changed_by)
            self._publish_gauges()
            return
        if store and (record is None or not self._breaker.matches(record)):
            new = self._breaker.record(by=self._settings.owner)
            await self._breaker_store.write(new)
            self._stored_breaker = new
            log.info(
                "circuit breaker state stored",
                extra={"open": new.open, "lease": self._breaker_store.where},
            )

    async def _store_breaker_change(self) -> None:
        """Store the breaker's state now if it changed here; a failure is logged and
        left to the breaker loop, so it never fails a webhook."""
        stored = self._stored_breaker
        if self._breaker_store is None or (stored is not None and self._breaker.matches(stored)):
            return
        try:
            await self.sync_breaker()
        except ApiError as exc:
            log.warning(
                "cannot store the breaker state yet; the breaker loop retries",
                extra={"error": str(exc)},
            )

    async def sync_nodes(
        self, nodes: Iterable[str]
    ) -> dict[tuple[str, str], BreakerRefusal | None]:
        """Sync each node (concurrently, bounded); raises NodeSyncError listing failures.
        Returns the (node, key) pairs kept from being added: by the breaker (its refusal)
        or by the per-node cap (None)."""
        names = sorted(set(nodes))
        results = await asyncio.gather(*(self._sync_node(n) for n in names), return_exceptions=True)
        failures: dict[str, ApiError] = {}
        held: dict[tuple[str, str], BreakerRefusal | None] = {}
        for name, result in zip(names, results, strict=True):
            if isinstance(result, ApiError):
                failures[name] = result
            elif isinstance(result, BaseException):
                raise result
            else:
                held.update(((name, key), why) for key, why in result.items())
        self._publish_gauges()
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

    async def _sync_node(self, name: str) -> dict[str, BreakerRefusal | None]:
        """Sync one node; returns the keys kept from being added (`sync_nodes`)."""
        async with self._node_lock(name), self._slots:
            attempt = _SyncAttempt()

            async def plan(node: NodeView) -> Change:
                attempt.refused.clear()
                attempt.capped.clear()
                return await self._plan(node, attempt)

            try:
                node, change = await guarded_update(
                    api=self._api,
                    name=name,
                    plan=plan,
                    retry=self._settings.retry,
                    metrics=self._metrics,
                )
            except ApiError as exc:
                if attempt.reserved:
                    self._breaker.release(name)
                if exc.status == 404:
                    log.warning(
                        "node not found; forgetting its taint requests", extra={"node": name}
                    )
                    for key in [k for n, k in self._intents if n == name]:
                        self._forget(name, key)
                    return {}
                log.error("node sync failed", extra={"node": name, "error": str(exc)})
                raise
            self._breaker.commit(name, out=node_out(node, manual=self._manual))
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
            held = dict.fromkeys((intent.key for intent in attempt.capped), None)
            return held | {intent.key: attempt.refusal for intent in attempt.refused}

    async def _plan(self, node: NodeView, attempt: _SyncAttempt) -> Change:
        """Decide what to add and remove on `node`, given its current state."""
        current = our_taints(node)
        history = self._quarantine.history(node)
        requested = frozenset(k for k in untaint_requests(node) or () if k in current)
        for key in requested:
            self._forget(node.name, key)
        remove: set[str] = set(requested)
        for key, taint in current.items():
            if key in remove:
                continue
            intent = self._intents.get((node.name, key))
            if intent is None:
                # A taint we did not know of: written before a restart. Its alert, if still
                # firing, was restored from Alertmanager; otherwise the hold starts now.
                intent = Intent(
                    node=node.name,
                    key=key,
                    effect=taint.effect,
                    value=taint.value,
                    last_firing=time.time(),
                )
                self._intents[(node.name, key)] = intent
            if intent.firing:
                continue
            if self._quarantine.holds(node, history, intent.reason):
                self._metrics.untaint_deferred.labels(why="quarantined").inc()
            elif await self._may_untaint(intent):
                remove.add(key)
        wanted = sorted(
            (
                i
                for (n, k), i in self._intents.items()
                if n == node.name and i.firing and k not in current
            ),
            key=lambda i: i.key,
        )
        room = max(0, self._policy.max_per_node - len(current.keys() - remove))
        attempt.capped.extend(wanted[room:])
        wanted = wanted[:room]
        released = [k.removeprefix(KEY_PREFIX) for k in requested]
        marks = self._quarantine.plan(
            node, history, added=[i.reason for i in wanted], released=released
        )
        shares = counts_toward_share(
            reasons=[i.reason for i in wanted],
            labels={**node.labels, **marks.labels},
            manual=self._manual,
        )
        if (
            wanted
            and not current.keys() - remove
            and not await self._reserve(node, attempt, shares)
        ):
            attempt.refused.extend(wanted)
            wanted = []
            marks = self._quarantine.plan(node, history, added=[], released=released)
        attempt.marks = marks
        add = tuple(
            Taint(key=i.key, value=i.value, effect=i.effect, time_added=now_rfc3339())
            for i in wanted
        )
        new_records = {
            t.key: new_record(
                taint=t, alertname=i.value, fingerprints=list(i.firing), owner=self._settings.owner
            )
            for t, i in zip(add, wanted, strict=True)
        }
        for (node_name, key), intent in list(self._intents.items()):
            if (
                node_name == node.name
                and not intent.firing
                and (key in remove or key not in current)
            ):
                self._forget(node_name, key)
        return Change(
            add=add,
            remove=frozenset(remove),
            new_records=new_records,
            requested=requested,
            clear_untaint_request=UNTAINT_ANNOTATION in node.annotations,
            labels=marks.labels,
            annotations=marks.annotations,
        )

    async def _reserve(self, node: NodeView, attempt: _SyncAttempt, shares: bool) -> bool:
        """Ask the breaker (once per sync) for a slot for a node that has no fleetwatch
        taint yet; `shares`: whether it will count toward the share cap."""
        if not attempt.reserved and attempt.refusal is None:
            attempt.refusal = await self._breaker.reserve(node.name, shares=shares)
            attempt.reserved = attempt.refusal is None
        return attempt.reserved

    def _manual(self, reason: str) -> bool:
        """True when only a person lifts `reason`'s taint: a manual-untaint reason, or one
        without untaint evidence."""
        return reason in self._settings.manual_reasons or not self._evidence.has_query(reason)

    async def _may_untaint(self, intent: Intent) -> bool:
        """Positive evidence: not manual, hold time passed, Prometheus says clear."""
        if self._manual(intent.reason):
            self._metrics.untaint_deferred.labels(why="manual").inc()
            return False
        if time.time() - intent.last_firing < self._settings.hold_seconds:
            self._metrics.untaint_deferred.labels(why="hold").inc()
            return False
        result = await self._evidence.condition_clear(node=intent.node, reason=intent.reason)
        if not result.clear:
            self._metrics.untaint_deferred.labels(why="evidence").inc()
            log.info(
                "taint kept: no positive evidence",
                extra={"node": intent.node, "key": intent.key, "detail": result.detail},
            )
            return False
        return True

    def _publish_gauges(self) -> None:
        self._metrics.tainted_nodes.set(len(self._breaker.tainted))
        self._metrics.breaker_open.set(1 if self._breaker.open else 0)
        self._metrics.breaker_limit.set(self._breaker.limit())
        self._metrics.breaker_sharing.set(len(self._breaker.sharing))
        self._metrics.breaker_new_taints.set(len(self._breaker.taken_out()))
