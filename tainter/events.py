"""What the controller did, told: log lines, metrics and Kubernetes Events per node sync.

Kept apart from what decides what to write (`tainter.controller`, `tainter.node_plan`);
this module only reports the outcome of each write to people (logs, Events on the node)
and to Prometheus (the `fleetwatch_tainter_*` counters).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fleetwatch.tainter.backend import NodeApi
from fleetwatch.tainter.breaker import Breaker, BreakerRefusal
from fleetwatch.tainter.desired import Intent
from fleetwatch.tainter.kube_objects import ApiError, NodeView
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.settings import ControllerSettings
from fleetwatch.tainter.taint_policy import TaintPolicy
from fleetwatch.tainter.writes import UNTAINT_ANNOTATION, Change

log = logging.getLogger(__name__)


class SyncReport:
    """Reports node syncs for one controller."""

    def __init__(
        self,
        *,
        api: NodeApi,
        metrics: TainterMetrics,
        settings: ControllerSettings,
        policy: TaintPolicy,
        breaker: Breaker,
    ) -> None:
        self._api = api
        self._metrics = metrics
        self._settings = settings
        self._policy = policy
        self._breaker = breaker

    async def sync_done(
        self,
        node: NodeView,
        change: Change,
        *,
        capped: Sequence[Intent],
        refused: Sequence[Intent],
        refusal: BreakerRefusal | None = None,
    ) -> None:
        """Log, count and record Events for what one sync did to `node`: the taints it
        added and removed, and those the per-node cap (`capped`) or the breaker
        (`refused`, for `refusal`) kept off. A refusal is logged and recorded once per
        intent; the breaker's is counted once per sync by the cap that refused."""
        dry = self._settings.dry_run
        for taint in change.add:
            self._metrics.taint_operations.labels(op="add", result="dry_run" if dry else "ok").inc()
            if dry:
                self._metrics.dry_run_actions.labels(op="add").inc()
            log.warning(
                "taint added" + (" (dry run)" if dry else ""),
                extra={
                    "node": node.name,
                    "key": taint.key,
                    "value": taint.value,
                    "effect": taint.effect,
                },
            )
            await self.event(
                node,
                "TaintAdded",
                f"{taint.key}={taint.value}:{taint.effect} "
                f"added by {self._settings.owner} for alert {taint.value}",
            )
        for key in sorted(change.remove):
            self._metrics.taint_operations.labels(
                op="remove", result="dry_run" if dry else "ok"
            ).inc()
            if dry:
                self._metrics.dry_run_actions.labels(op="remove").inc()
            log.warning(
                "taint removed" + (" (dry run)" if dry else ""),
                extra={"node": node.name, "key": key},
            )
            why = (
                "an operator asked (annotation " + UNTAINT_ANNOTATION + ")"
                if key in change.requested
                else "alert resolved, hold time passed, condition confirmed clear"
            )
            await self.event(
                node, "TaintRemoved", f"{key} removed by {self._settings.owner}: {why}"
            )
        for intent in capped:
            self._metrics.policy_refusals.labels(why="max_per_node").inc()
            if intent.refused:
                continue
            intent.refused = True
            log.error(
                "taint refused: node at the per-node cap",
                extra={"node": node.name, "key": intent.key, "cap": self._policy.max_per_node},
            )
            await self.event(
                node,
                "TaintRefused",
                f"{intent.key} refused: the node already carries {self._policy.max_per_node} "
                "fleetwatch taints",
                warning=True,
            )
        if refused and refusal is not None:
            self._metrics.breaker_refusals.labels(cap=refusal.cap).inc()
        for intent in refused:
            self._metrics.taint_operations.labels(op="add", result="refused").inc()
            if intent.refused or refusal is None:
                continue
            intent.refused = True
            log.error(
                "taint refused: circuit breaker open",
                extra={
                    "node": node.name,
                    "key": intent.key,
                    "cap": refusal.cap,
                    "detail": refusal.detail,
                    "new_taints": len(self._breaker.taken_out()),
                    "share_nodes": len(self._breaker.sharing),
                    "share_limit": self._breaker.limit(),
                },
            )
            await self.event(
                node, "TaintRefused", f"{intent.key} refused: {refusal.detail}", warning=True
            )

    async def event(
        self, node: NodeView, reason: str, message: str, *, warning: bool = False
    ) -> None:
        """Record an Event on `node`; a failure is logged and counted, never raised (an
        Event is a report, not part of the write)."""
        try:
            await self._api.create_event(node=node, reason=reason, message=message, warning=warning)
        except ApiError as exc:
            self._metrics.api_errors.labels(status=str(exc.status)).inc()
            log.warning(
                "cannot record Event",
                extra={"node": node.name, "reason": reason, "error": str(exc)},
            )
