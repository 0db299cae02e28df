"""The node condition fleetwatch keeps: `GPUHealthy=False` while it holds a taint.

Tools that read node conditions (kubectl describe, node-problem-detector consumers, the
node repair of cluster autoscalers) do not read taints of a foreign prefix; a condition
tells them. After each node sync the condition is made to match the node's fleetwatch
taints: `False` with a CamelCase reason for the taint reason (`gpu-overheat` →
`GpuOverheat`) and a message naming the alert while any is held; `True` once the last is
gone (a node that never carried the condition is left without it). The message names, per
hold, the repair its alerts ask for (`repair reboot`), as its audit record says; node-repair
controllers select by type, status and duration (docs/tainter.md, "Repair after the
drain"). Only the condition of the configured type is written, by a strategic-merge
patch of `status.conditions` (a list merged by `type`, so Ready and the rest stay) guarded
by the node's resourceVersion. `lastTransitionTime` moves only when the status changes;
`lastHeartbeatTime` on each write.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fleetwatch.rules.contract import NO_REPAIR
from fleetwatch.tainter.backend import RemediationApi
from fleetwatch.tainter.election import Leadership
from fleetwatch.tainter.kube_objects import ApiError, NodeCondition, NodeView, now_rfc3339
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import KEY_PREFIX
from fleetwatch.tainter.settings import NodeConditionSettings, RetryPolicy
from fleetwatch.tainter.writes import our_taints, records, with_retries

log = logging.getLogger(__name__)

HEALTHY_REASON = "NoFleetwatchTaint"


def camel_case(reason: str) -> str:
    """A taint reason as a condition reason: `gpu-overheat` → `GpuOverheat`."""
    return "".join(word[:1].upper() + word[1:] for word in reason.split("-") if word)


def desired(node: NodeView, *, condition_type: str) -> NodeCondition | None:
    """The condition `node` should carry, without times; None when it should be left
    alone (no fleetwatch taint and no condition of ours to turn back to True)."""
    taints = sorted(our_taints(node).values(), key=lambda t: t.key)
    if taints:
        audit = records(node)
        return NodeCondition(
            type=condition_type,
            status="False",
            reason=camel_case(taints[0].key.removeprefix(KEY_PREFIX)),
            message="fleetwatch holds "
            + ", ".join(f"{t.key} ({_about(t.value, audit.get(t.key))})" for t in taints)
            + " on this node",
        )
    if any(c.type == condition_type for c in node.conditions):
        return NodeCondition(
            type=condition_type,
            status="True",
            reason=HEALTHY_REASON,
            message="fleetwatch holds no taint on this node",
        )
    return None


def _about(alert: str, record: Mapping[str, Any] | None) -> str:
    """`alert GPUXidCritical, repair reboot`: the alert, and the repair it asks for (from
    the hold's audit record; left out when none)."""
    repair = str((record or {}).get("repair", NO_REPAIR))
    return f"alert {alert}" + ("" if repair == NO_REPAIR else f", repair {repair}")


def current(node: NodeView, condition_type: str) -> NodeCondition | None:
    """The node's condition of `condition_type`, if it has one."""
    return next((c for c in node.conditions if c.type == condition_type), None)


class ConditionKeeper:
    """Keeps each synced node's condition in step with its fleetwatch taints."""

    def __init__(
        self,
        *,
        api: RemediationApi,
        leadership: Leadership,
        metrics: TainterMetrics,
        settings: NodeConditionSettings,
        retry: RetryPolicy,
        dry_run: bool,
    ) -> None:
        self._api = api
        self._leadership = leadership
        self._metrics = metrics
        self._type = settings.condition_type
        self._retry = retry
        self._dry_run = dry_run

    async def node_synced(self, node: NodeView) -> None:
        """Write the condition if it differs; an API failure is logged and counted, and
        the next sync of the node (the periodic reconcile) tries again."""
        if not self._type or not self._leadership.is_leader:
            return
        want = desired(node, condition_type=self._type)
        if want is None or _same(current(node, self._type), want):
            return
        if self._dry_run:
            self._metrics.node_condition_writes.labels(status=want.status, result="dry_run").inc()
            log.info(
                "node condition not written (dry run)",
                extra={"node": node.name, "condition": self._type, "status": want.status},
            )
            return
        try:
            await with_retries(
                lambda: self._write(node.name),
                retry=self._retry,
                metrics=self._metrics,
                what=f"write node {node.name} condition {self._type}",
            )
        except ApiError as exc:
            self._metrics.node_condition_writes.labels(status=want.status, result="error").inc()
            log.error(
                "cannot write the node condition; the next reconcile retries",
                extra={"node": node.name, "condition": self._type, "error": str(exc)},
            )

    async def _write(self, name: str) -> None:
        """Re-read the node (a retry after a conflict plans from what is there now) and
        patch the condition if it still differs."""
        node = await self._api.get_node(name)
        want = desired(node, condition_type=self._type)
        had = current(node, self._type)
        if want is None or _same(had, want):
            return
        now = now_rfc3339()
        same_status = had is not None and had.status == want.status
        written = NodeCondition(
            type=want.type,
            status=want.status,
            reason=want.reason,
            message=want.message,
            last_transition_time=had.last_transition_time if had and same_status else now,
            last_heartbeat_time=now,
        )
        await self._api.patch_node_conditions(
            name, resource_version=node.resource_version, conditions=[written]
        )
        self._metrics.node_condition_writes.labels(status=want.status, result="ok").inc()
        log.info(
            "node condition written",
            extra={
                "node": name,
                "condition": want.type,
                "status": want.status,
                "reason": want.reason,
            },
        )


def _same(had: NodeCondition | None, want: NodeCondition) -> bool:
    return had is not None and (had.status, had.reason, had.message) == (
        want.status,
        want.reason,
        want.message,
    )
