"""Guarded taint writes: read the node, plan a change, patch with its resourceVersion.

Only taints under `fleetwatch.io/` are ever added or removed; every other taint (and
`spec.unschedulable`) is carried over exactly as read. Because a merge patch replaces
`spec.taints` whole, each write carries the resourceVersion it was planned from; a 409
means another writer got in between, so the node is re-read and the change re-planned
(jittered exponential backoff). Each write also updates the audit annotation
`fleetwatch.io/taints` (who, which alert, value, effect, when) and the label
`fleetwatch.io/tainted=true` that lets tainted nodes be listed by selector.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from fleetwatch.tainter.backend import (
    NodeApi,
    RepairTicket,
    RepairView,
    Unavailable,
    repair_backend,
    view_of,
)
from fleetwatch.tainter.kube_objects import ApiError, Conflict, NodeView, Taint, now_rfc3339
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import KEY_PREFIX
from fleetwatch.tainter.settings import RetryPolicy

log = logging.getLogger(__name__)

RECORD_ANNOTATION: Final = "fleetwatch.io/taints"
UNTAINT_ANNOTATION: Final = "fleetwatch.io/untaint"
TAINTED_LABEL: Final = "fleetwatch.io/tainted"
T = TypeVar("T")
RETRY_AFTER_LIMIT: Final = 10.0
"""The longest `Retry-After` a write waits for; a server asking for longer is failed at once
(the webhook answers 503, Alertmanager and the reconcile loop come back later), so a retry
never holds a webhook or a node's lock for long."""
RETRIED_STATUSES: Final = frozenset({0, 409, 429, 500, 502, 503, 504})
"""Answers a retry can fix: the guard's conflict (409: the node changed since it was read),
throttling, the API server's own failures and no answer at all. Never a 4xx refusal such as
the chart's admission policy's denial (422 Invalid, or 403): the same write is denied again."""


class LeftAlone(ApiError):
    """A write the backend deliberately does not make, because the node is not fleetwatch's
    to change (someone else drained, downed or failed it): not a failure, and no retry
    changes it. `why` is a metric label; the reason says what was left alone, for people.
    The webhook answers it with success, naming the node and why."""

    def __init__(self, *, why: str, reason: str) -> None:
        super().__init__(status=423, reason=reason)
        self.why = why


class Throttled(ApiError):
    """The server asked to be called again later (429 or 503 with `Retry-After`, in
    seconds): the next attempt waits at least that long."""

    def __init__(self, *, status: int, reason: str, retry_after: float) -> None:
        super().__init__(status=status, reason=reason)
        self.retry_after = retry_after


def retry_after(value: str | None) -> float | None:
    """A `Retry-After` header in seconds (Kubernetes writes whole seconds; an HTTP date, or
    anything else, is not honoured: None)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < float("inf") else None


def pause_before(attempt: int, retry: RetryPolicy, error: ApiError) -> float:
    """How long to wait before `attempt` (1 = the first retry) after `error`: the jittered
    backoff, or the server's `Retry-After` when that is longer."""
    backoff = retry.delay(attempt - 1)
    if isinstance(error, Throttled):
        return max(backoff, error.retry_after)
    return backoff


def ours(taint: Taint) -> bool:
    """True for taints fleetwatch owns (key under `fleetwatch.io/`)."""
    return taint.key.startswith(KEY_PREFIX)


def our_taints(node: NodeView) -> dict[str, Taint]:
    """fleetwatch's taints on `node`, by key."""
    return {t.key: t for t in node.taints if ours(t)}


def records(node: NodeView) -> dict[str, dict[str, Any]]:
    """The audit records in the node's annotation (empty when absent or unreadable)."""
    try:
        data = json.loads(node.annotations.get(RECORD_ANNOTATION, "{}"))
    except ValueError:
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def untaint_requests(node: NodeView) -> frozenset[str] | None:
    """Keys an operator asked to remove via the `fleetwatch.io/untaint` annotation
    (`all` or comma-separated reasons); None when there is no request."""
    text = node.annotations.get(UNTAINT_ANNOTATION)
    if text is None:
        return None
    words = {w.strip() for w in text.split(",") if w.strip()}
    if "all" in words or not words:
        return frozenset(our_taints(node))
    return frozenset(KEY_PREFIX + w for w in words)


@dataclass(frozen=True, slots=True)
class Change:
    """What to do to one node's fleetwatch taints."""

    add: tuple[Taint, ...] = ()
    remove: frozenset[str] = frozenset()
    new_records: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    requested: frozenset[str] = frozenset()  # removals an operator asked for
    clear_untaint_request: bool = False
    # Further fleetwatch.io/ labels and annotations to set (None deletes): the taint history
    # and quarantine label (tainter.quarantine).
    labels: Mapping[str, str | None] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(
            self.add or self.remove or self.clear_untaint_request or self.labels or self.annotations
        )


def apply_change(
    node: NodeView, change: Change
) -> tuple[list[Taint], dict[str, str | None], dict[str, str | None]]:
    """The full new taint list, label changes and annotation changes for `change`."""
    added_keys = {t.key for t in change.add}
    taints = [t for t in node.taints if not (ours(t) and t.key in change.remove | added_keys)]
    taints.extend(change.add)
    audit = records(node)
    for key in change.remove:
        audit.pop(key, None)
    audit.update(change.new_records)
    audit = {k: v for k, v in audit.items() if any(t.key == k for t in taints)}
    annotations: dict[str, str | None] = {
        RECORD_ANNOTATION: json.dumps(audit, sort_keys=True) if audit else None,
    }
    if change.clear_untaint_request:
        annotations[UNTAINT_ANNOTATION] = None
    annotations.update(change.annotations)
    labels: dict[str, str | None] = {
        TAINTED_LABEL: "true" if any(ours(t) for t in taints) else None,
        **change.labels,
    }
    return taints, labels, annotations


Planner = Callable[[NodeView], Awaitable[Change]]


async def with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    retry: RetryPolicy,
    metrics: TainterMetrics,
    what: str,
) -> T:
    """Run `call` until it succeeds, at most `retry.attempts` times, retrying what
    RETRIED_STATUSES names (the guard's conflicts, throttling, 5xx, an unreachable API) with
    jittered backoff, never sooner than a `Retry-After` the server sent (one longer than
    RETRY_AFTER_LIMIT fails at once); counts every failure and logs every retried fault.
    Raises the last ApiError, or at once one retrying cannot fix (a refusal, or a backend
    that says it is `Unavailable` while it backs off). A `LeftAlone` is no failure: raised
    at once, not counted as an API error."""
    last_error: ApiError | None = None
    for attempt in range(retry.attempts):
        if last_error is not None:
            await asyncio.sleep(pause_before(attempt, retry, last_error))
        try:
            return await call()
        except LeftAlone:
            raise
        except ApiError as exc:
            last_error = exc
            if isinstance(exc, Conflict):
                metrics.api_conflicts.inc()
            else:
                metrics.api_errors.labels(status=str(exc.status)).inc()
            if exc.status not in RETRIED_STATUSES or isinstance(exc, Unavailable):
                raise
            if isinstance(exc, Throttled) and exc.retry_after > RETRY_AFTER_LIMIT:
                raise
            # A conflict is the guard doing its job (debug); anything else is a fault
            # worth a line in the log.
            log.log(
                logging.DEBUG if isinstance(exc, Conflict) else logging.INFO,
                "call retried",
                extra={
                    "what": what,
                    "attempt": attempt + 1,
                    "status": exc.status,
                    "error": exc.reason,
                    "retry_after": exc.retry_after if isinstance(exc, Throttled) else None,
                },
            )
    assert last_error is not None
    raise last_error


async def guarded_update(
    *,
    api: NodeApi,
    name: str,
    plan: Planner,
    retry: RetryPolicy,
    metrics: TainterMetrics,
) -> tuple[NodeView, Change]:
    """Read `name`, plan, and write guarded by resourceVersion until it sticks.

    Returns the node as written (or as read when the plan is empty) and the change made.
    Raises ApiError when the API keeps failing or answers a status retrying cannot fix."""

    async def attempt() -> tuple[NodeView, Change]:
        node = await api.get_node(name)
        change = await plan(node)
        if not change:
            return node, change
        taints, labels, annotations = apply_change(node, change)
        written = await api.patch_node(
            name,
            resource_version=node.resource_version,
            taints=taints,
            labels=labels,
            annotations=annotations,
        )
        return written, change

    return await with_retries(attempt, retry=retry, metrics=metrics, what=f"write node {name}")


class DryRunNodeApi:
    """A NodeApi that reads the real nodes but keeps its writes in memory.

    `--dry-run` runs the whole controller (breaker, evidence, Events, metrics) against
    this, so what it logs is exactly what it would have done."""

    def __init__(self, *, real: NodeApi) -> None:
        self._real = real
        self._overlay: dict[str, tuple[tuple[Taint, ...], dict[str, str], dict[str, str]]] = {}

    def _view(self, node: NodeView) -> NodeView:
        overlay = self._overlay.get(node.name)
        if overlay is None:
            return node
        taints, labels, annotations = overlay
        return NodeView(
            name=node.name,
            uid=node.uid,
            resource_version=node.resource_version,
            taints=taints,
            labels=labels,
            annotations=annotations,
            conditions=node.conditions,
        )

    async def get_node(self, name: str) -> NodeView:
        return self._view(await self._real.get_node(name))

    async def list_nodes(self, *, label_selector: str = "") -> list[NodeView]:
        nodes = [self._view(n) for n in await self._real.list_nodes()]
        if label_selector == f"{TAINTED_LABEL}=true":
            return [n for n in nodes if n.labels.get(TAINTED_LABEL) == "true"]
        if not label_selector:
            return nodes
        return await self._real.list_nodes(label_selector=label_selector)

    async def patch_node(
        self,
        name: str,
        *,
        resource_version: str,
        taints: Sequence[Taint] | None,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> NodeView:
        node = await self.get_node(name)
        new_labels = {k: v for k, v in {**node.labels, **labels}.items() if v is not None}
        new_annotations = {
            k: v for k, v in {**node.annotations, **annotations}.items() if v is not None
        }
        new_taints = node.taints if taints is None else tuple(taints)
        self._overlay[name] = (new_taints, new_labels, new_annotations)
        return self._view(node)

    async def create_event(
        self,
        *,
        node: NodeView,
        reason: str,
        message: str,
        warning: bool,
    ) -> None:
        await self._real.create_event(
            node=node,
            reason=reason,
            message=f"dry run: {message}",
            warning=warning,
        )

    @property
    def can_repair(self) -> bool:
        return repair_backend(self._real) is not None

    async def repair_view(
        self, name: str, *, repair: str, ticket: RepairTicket | None
    ) -> RepairView:
        """The real node's jobs; a repair this dry run pretended to start (a ticket) is
        never under way, so it reads as back at the next sync."""
        if ticket is not None:
            return RepairView(jobs_running=False, repairing=False)
        return await view_of(self._real, name, repair=repair, ticket=None)

    async def start_repair(
        self, node: NodeView, *, repair: str, reason: str, alert: str
    ) -> RepairTicket:
        """Asks nothing of the orchestrator: the attempt is kept in memory with the rest."""
        log.info(
            "repair not asked for (dry run)",
            extra={"node": node.name, "repair": repair, "reason": reason, "alert": alert},
        )
        return RepairTicket(how="not asked (dry run)")


def new_record(
    *, taint: Taint, alertname: str, fingerprints: Sequence[str], owner: str, repair: str = "none"
) -> dict[str, Any]:
    """The audit record for a taint fleetwatch adds, with the repair its alerts ask for."""
    return {
        "repair": repair,
        "owner": owner,
        "alert": alertname,
        "value": taint.value,
        "effect": taint.effect,
        "time": now_rfc3339(),
        "fingerprints": sorted(fingerprints),
    }
