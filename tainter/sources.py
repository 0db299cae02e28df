"""What the tainter reads besides Kubernetes: Prometheus evidence and Alertmanager's alerts.

A resolved alert is not evidence that a node is healthy (it also resolves when the
exporter dies and the series vanish), so untainting asks Prometheus a per-reason PromQL
"condition clear" question that returns a non-empty vector only when the node's exporter
is up and the condition is gone. An answer Prometheus marks with `warnings` (built from
partial data: a remote store or a Thanos/Mimir querier that could not reach every source) is
no evidence either, nor is an error or no answer within the deadline. The questions are the
rules' remediation contract (`fleetwatch.rules.contract`, generated beside the alerts), never
PromQL of the tainter's own. Alertmanager's `GET /api/v2/alerts` is the live list of
firing alerts the periodic reconcile compares against, to restore missed taints and to
notice resolves that were never delivered.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from fleetwatch.promclient import PrometheusAccess, PrometheusClientError
from fleetwatch.rules.contract import NODE_PLACEHOLDER
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import (
    AlertState,
    PayloadError,
    alert_from_labels,
    required_time,
    string_map,
)

log = logging.getLogger(__name__)


def promql_string(value: str) -> str:
    """`value` escaped for use inside a double-quoted PromQL string."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


class SourceError(Exception):
    """A source (Alertmanager) could not be read; the message says why."""


@dataclass(frozen=True, slots=True)
class EvidenceResult:
    """Whether a node's condition is positively clear, and why (for logs and Events)."""

    clear: bool
    detail: str


class EvidenceSource(Protocol):
    """Answers "is it safe to remove this taint?" for reasons that have a query."""

    def has_query(self, reason: str) -> bool: ...

    async def condition_clear(self, *, node: str, reason: str) -> EvidenceResult: ...


class AlertSource(Protocol):
    """The taint-requesting alerts that fire now."""

    async def firing_alerts(self) -> list[AlertState]: ...


class PrometheusEvidence:
    """EvidenceSource over the Prometheus HTTP API (`/api/v1/query`), reached with the
    `--prometheus.*` client options (TLS, bearer token or basic auth)."""

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        access: PrometheusAccess,
        queries: Mapping[str, str],
        metrics: TainterMetrics,
        timeout: float = 10.0,
    ) -> None:
        self._session = session
        self._access = access
        self._queries = dict(queries)
        self._metrics = metrics
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    def has_query(self, reason: str) -> bool:
        return reason in self._queries

    async def condition_clear(self, *, node: str, reason: str) -> EvidenceResult:
        query = self._queries.get(reason)
        if query is None:
            return EvidenceResult(clear=False, detail=f"no evidence query for reason {reason!r}")
        expr = query.replace(NODE_PLACEHOLDER, promql_string(node))
        try:
            async with self._session.get(
                f"{self._access.url}/api/v1/query",
                params={"query": expr},
                headers=self._access.headers(),
                ssl=self._access.ssl_context(),
                timeout=self._timeout,
            ) as response:
                if response.status in (401, 403):
                    return self._failed(
                        f"Prometheus refused the credentials: HTTP {response.status} (check "
                        "--prometheus.bearer-token-file or --prometheus.basic-auth.*)"
                    )
                body: Any = await response.json(content_type=None)
        # ValueError: not JSON (a bad byte quoted by an excerpt); RecursionError: nested too deep
        except (
            aiohttp.ClientError,
            TimeoutError,
            ValueError,
            RecursionError,
            PrometheusClientError,
        ) as exc:
            return self._failed(f"Prometheus query failed: {repr(exc)[:300]}")
        result = _vector(body)
        if isinstance(result, str):
            return self._failed(f"Prometheus query failed: {result}")
        if result:
            return EvidenceResult(clear=True, detail=f"Prometheus confirms clear: {expr}")
        return EvidenceResult(
            clear=False,
            detail="Prometheus does not confirm the condition is clear "
            "(exporter down, data missing, or still over threshold)",
        )

    def _failed(self, detail: str) -> EvidenceResult:
        """No evidence: Prometheus could not be asked, or answered something unusable."""
        self._metrics.source_errors.labels(source="prometheus").inc()
        log.warning("cannot read positive evidence; taint kept", extra={"error": detail})
        return EvidenceResult(clear=False, detail=detail)


def _vector(body: Any) -> list[Any] | str:
    """The `data.result` list of a successful, complete instant-vector answer, or why there
    is none (an error status, partial data, `"data": null`, an HTML page, a scalar...)."""
    if not isinstance(body, dict):
        return f"answer is not a JSON object: {str(body)[:80]!r}"
    if body.get("status") != "success":
        return f"status {str(body.get('status'))[:80]!r}: {str(body.get('error'))[:400]}"
    if body.get("warnings"):
        return f"partial data (warnings: {str(body['warnings'])[:160]})"
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        return f"data is not an instant vector: {str(data)[:80]!r}"
    result = data.get("result")
    if not isinstance(result, list):
        return "data.result is not a list"
    return result


class NoEvidence:
    """EvidenceSource for running without Prometheus: nothing is ever confirmed clear."""

    def has_query(self, reason: str) -> bool:
        return False

    async def condition_clear(self, *, node: str, reason: str) -> EvidenceResult:
        return EvidenceResult(clear=False, detail="no --prometheus.url: taints stay until untaint")


class AlertmanagerAlerts:
    """AlertSource over Alertmanager's API v2 (`GET /api/v2/alerts`)."""

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        url: str,
        timeout: float = 10.0,
    ) -> None:
        self._session = session
        self._url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def firing_alerts(self) -> list[AlertState]:
        """Active, unsilenced, uninhibited alerts that ask for a taint.

        Raises SourceError when Alertmanager cannot be read; the caller then skips that
        part of the reconcile."""
        params = {
            "active": "true",
            "silenced": "false",
            "inhibited": "false",
            "filter": 'fleetwatch_taint=~".+"',
        }
        try:
            async with self._session.get(
                f"{self._url}/api/v2/alerts",
                params=params,
                timeout=self._timeout,
            ) as response:
                response.raise_for_status()
                body: Any = await response.json(content_type=None)
        # ValueError: not JSON (a bad byte quoted by an excerpt); RecursionError: nested too deep
        except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError) as exc:
            raise SourceError(f"cannot read {self._url}/api/v2/alerts: {repr(exc)[:300]}") from exc
        if not isinstance(body, list):
            raise SourceError(f"{self._url}/api/v2/alerts did not return a list")
        alerts: list[AlertState] = []
        for item in body:
            if not isinstance(item, dict):
                log.warning("skipping malformed Alertmanager alert", extra={"item": str(item)[:80]})
                continue
            where = f"alertmanager alert {str(item.get('fingerprint'))[:80]}"
            try:
                state = alert_from_labels(
                    labels=string_map(item.get("labels"), f"{where}.labels"),
                    fingerprint=item.get("fingerprint", ""),
                    firing=True,
                    starts_at=required_time(item.get("startsAt"), f"{where}.startsAt"),
                    ends_at=None,
                    where=where,
                )
            except PayloadError as exc:
                log.warning("skipping malformed Alertmanager alert", extra={"error": str(exc)})
                continue
            if state is not None:
                alerts.append(state)
        return alerts
