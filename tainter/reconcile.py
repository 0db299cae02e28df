"""Live state read back: Alertmanager's active alerts and the nodes fleetwatch tainted.

The tainter's memory is only a cache of the cluster. The periodic reconcile re-reads
Alertmanager's active alerts (a firing instance missing there is treated as resolved: its
resolve was lost) and the nodes: how many the node selector selects and which carry
fleetwatch taints, which the breaker counts and quarantine remembers. This is also how a
restarted tainter, or a new leader, rebuilds its state; before the first write of a process
the counts are read once, so the breaker's caps count nodes an earlier process tainted.
The controller (`tainter.controller`) then syncs every node that is tainted or wanted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from fleetwatch.tainter.backend import NodeApi
from fleetwatch.tainter.breaker import Breaker, node_out
from fleetwatch.tainter.breaker_sync import publish_gauges
from fleetwatch.tainter.desired import Intents
from fleetwatch.tainter.kube_objects import NodeView
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import AlertState
from fleetwatch.tainter.quarantine import Quarantine
from fleetwatch.tainter.settings import ControllerSettings
from fleetwatch.tainter.sources import AlertSource, SourceError
from fleetwatch.tainter.taint_policy import Refusal
from fleetwatch.tainter.untaint_gate import UntaintGate
from fleetwatch.tainter.writes import TAINTED_LABEL, our_taints, with_retries

log = logging.getLogger(__name__)

Record = Callable[[Iterable[AlertState], float], tuple[set[str], list[Refusal]]]
"""Folds alert states into the desired state at a time; returns the nodes touched and the
alerts the taint policy refused (`Controller.record_alerts`)."""


class LiveState:
    """Reads Alertmanager and the nodes back into the desired state, the breaker and
    quarantine."""

    def __init__(
        self,
        *,
        api: NodeApi,
        alerts: AlertSource | None,
        intents: Intents,
        record: Record,
        breaker: Breaker,
        quarantine: Quarantine,
        gate: UntaintGate,
        settings: ControllerSettings,
        metrics: TainterMetrics,
    ) -> None:
        self._api = api
        self._alerts = alerts
        self._intents = intents
        self._record = record
        self._breaker = breaker
        self._quarantine = quarantine
        self._gate = gate
        self._settings = settings
        self._metrics = metrics
        self._count_lock = asyncio.Lock()

    async def read_alerts(self) -> None:
        """Fold Alertmanager's active alerts in and resolve the firing instances it no
        longer lists; when it cannot be read, say so and change nothing (no Alertmanager
        configured: nothing to do)."""
        if self._alerts is None:
            return
        try:
            firing = await self._alerts.firing_alerts()
        except SourceError as exc:
            self._metrics.source_errors.labels(source="alertmanager").inc()
            log.warning(
                "cannot read Alertmanager alerts; reconciling nodes only",
                extra={"error": str(exc)},
            )
            return
        now = time.monotonic()
        _, refused = self._record(firing, now)
        if refused:
            log.warning(
                "active alerts refused by the taint policy",
                extra={"count": len(refused), "first": refused[0].detail},
            )
        self._intents.resolve_missing(firing, now=now)

    async def observe_counts(self) -> set[str]:
        """Tell the breaker how many nodes are selected and which carry our taints (live,
        from the API); returns the tainted ones."""
        selected = await self._list_nodes(self._settings.node_selector)
        self._breaker.set_selected_nodes(len(selected))
        tainted = [n for n in await self._list_nodes(f"{TAINTED_LABEL}=true") if our_taints(n)]
        self._breaker.observe(
            {n.name: bool(node_out(n, manual=self._gate.manual)) for n in tainted}
        )
        self._quarantine.observe(tainted)
        publish_gauges(self._breaker, self._metrics)
        return {n.name for n in tainted}

    async def ensure_counts(self) -> None:
        """Before the first write of a new process (or leader), learn the live counts, so
        the breaker's cap counts the nodes an earlier process tainted."""
        async with self._count_lock:  # one list for a burst of first notifications
            if self._breaker.selected_nodes is None:
                await self.observe_counts()

    async def _list_nodes(self, selector: str) -> list[NodeView]:
        """List nodes, retrying what a retry can fix (like writes)."""
        return await with_retries(
            lambda: self._api.list_nodes(label_selector=selector),
            retry=self._settings.retry,
            metrics=self._metrics,
            what=f"list nodes {selector!r}",
        )
