"""Prometheus HTTP API client for the report: range queries, chunked, bounded, retried.

The report reads only the documented HTTP API (`/api/v1/query_range`,
`/api/v1/label/__name__/values`), so it runs unchanged against Prometheus, Thanos, Mimir
or VictoriaMetrics. A long window is split into chunks of at most `MAX_POINTS` steps
(Prometheus refuses more than 11,000 points per series), chunks run with bounded
concurrency, and 5xx answers, 429 and timeouts are retried with backoff. Failures are
typed so the caller can tell "Prometheus is down" from "this one query is wrong". An answer
the store marks as incomplete (Prometheus `warnings`, VictoriaMetrics `isPartial`) comes back
with its data and the reason, so the report can say which part is missing. The client counts
the response bytes it reads (`bytes_fetched`), the figure the benchmark prints.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from fleetwatch.promclient import PrometheusAccess, PrometheusCredentialsError, api_error

MAX_POINTS = 11_000


class PrometheusError(Exception):
    """Base of the errors below; the message names the URL or query and the reason."""


class PrometheusUnreachable(PrometheusError):
    """Connection refused, DNS, timeouts or 5xx after every retry."""


class PrometheusAuthError(PrometheusError):
    """401 or 403: the credentials are missing or wrong; retrying will not help."""


class QueryError(PrometheusError):
    """Prometheus rejected one query (bad PromQL, too many samples, ...)."""


@dataclass(frozen=True)
class Series:
    """One result series: its labels and its points as parallel sequences."""

    labels: dict[str, str]
    timestamps: list[float]
    values: list[float]


@dataclass(frozen=True)
class Answer:
    """A query's series, and why the store says they may be incomplete (empty: complete)."""

    series: list[Series]
    warnings: list[str]


class Progress(Protocol):
    """What the client reports progress to (a tqdm bar, or nothing)."""

    def update(self, n: int = 1) -> object: ...

    def reset(self, total: int | None = None) -> object: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> object: ...


class _NoProgress:
    def update(self, n: int = 1) -> object:
        return None

    def reset(self, total: int | None = None) -> object:
        return None

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> object:
        return None


def chunks(start: float, end: float, step: float) -> list[tuple[float, float]]:
    """Split [start, end] at `step` into ranges of at most MAX_POINTS points each."""
    if step <= 0 or end < start:
        raise ValueError(f"invalid range: start={start} end={end} step={step}")
    total = math.floor((end - start) / step) + 1
    span = MAX_POINTS * step
    return [
        (start + i * span, min(end, start + i * span + (MAX_POINTS - 1) * step))
        for i in range(math.ceil(total / MAX_POINTS))
    ]


class PrometheusClient:
    """Async client for one Prometheus-compatible endpoint, reached with the `--prometheus.*`
    client options (`access`: TLS, bearer token or basic auth, read again for each request).

    Use as an async context manager; it owns its aiohttp session.
    """

    def __init__(
        self,
        *,
        access: PrometheusAccess,
        concurrency: int = 4,
        retries: int = 3,
        timeout_s: float = 120.0,
        backoff_s: float = 0.5,
        progress: Progress | None = None,
    ) -> None:
        self._access = access
        self._url = access.url
        self._limit = asyncio.Semaphore(concurrency)
        self._retries = retries
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._backoff_s = backoff_s
        self._session: aiohttp.ClientSession | None = None
        self.progress: Progress = _NoProgress() if progress is None else progress
        self.bytes_fetched = 0
        """Response bytes read so far (bodies, as received)."""

    async def __aenter__(self) -> PrometheusClient:
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def metric_names(self, *, start: float, end: float, match: str | None) -> set[str]:
        """Names of the metrics that have samples in [start, end] (optionally matching)."""
        return await self.label_values("__name__", start=start, end=end, match=match)

    async def label_values(
        self, label: str, *, start: float, end: float, match: str | None
    ) -> set[str]:
        """Values of `label` on series with samples in [start, end] (optionally matching)."""
        params: list[tuple[str, str]] = [("start", _ts(start)), ("end", _ts(end))]
        if match:
            params.append(("match[]", match))
        what = f"{label} values"
        data, _ = await self._get(f"/api/v1/label/{label}/values", params, what=what)
        return label_set(data, what=what)

    async def query_range(self, expr: str, *, start: float, end: float, step: float) -> Answer:
        """Evaluate `expr` over [start, end] every `step` seconds; chunks are merged per series,
        and so are their warnings."""
        answers = await asyncio.gather(
            *(
                self._query_chunk(expr, start=a, end=b, step=step)
                for a, b in chunks(start, end, step)
            )
        )
        merged: dict[tuple[tuple[str, str], ...], Series] = {}
        warnings: list[str] = []
        for answer in answers:
            warnings += [w for w in answer.warnings if w not in warnings]
            for series in answer.series:
                key = tuple(sorted(series.labels.items()))
                if key in merged:
                    merged[key].timestamps.extend(series.timestamps)
                    merged[key].values.extend(series.values)
                else:
                    merged[key] = series
        return Answer(list(merged.values()), warnings)

    async def _query_chunk(self, expr: str, *, start: float, end: float, step: float) -> Answer:
        params = [("query", expr), ("start", _ts(start)), ("end", _ts(end)), ("step", _ts(step))]
        what = f"query {expr!r}"
        data, warnings = await self._get("/api/v1/query_range", params, what=what)
        self.progress.update(1)
        return Answer(range_series(data, what=what), warnings)

    async def _get(
        self, path: str, params: Sequence[tuple[str, str]], *, what: str
    ) -> tuple[Any, list[str]]:
        """The answer's `data` and its incompleteness warnings, after retries."""
        if self._session is None:
            raise RuntimeError("PrometheusClient used outside `async with`")
        url = self._url + path
        last = ""
        for attempt in range(self._retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff_s * 2 ** (attempt - 1))
            try:
                async with (
                    self._limit,
                    self._session.get(
                        url,
                        params=params,
                        headers=self._access.headers(),
                        ssl=self._access.ssl_context(),
                    ) as response,
                ):
                    if response.status in (401, 403):
                        raise PrometheusAuthError(
                            f"{url}: HTTP {response.status}: Prometheus refused the credentials "
                            "(check --prometheus.bearer-token-file or --prometheus.basic-auth.*)"
                        )
                    if response.status >= 500 or response.status == 429:
                        last = f"HTTP {response.status}: {(await response.text())[:200]}"
                        continue
                    raw = await response.read()
                    self.bytes_fetched += len(raw)
                    body = _json(raw, response.status, url)
            except PrometheusCredentialsError as exc:
                raise PrometheusAuthError(str(exc)) from exc
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            return answer_data(body, what=what)
        raise PrometheusUnreachable(
            f"cannot reach Prometheus at {self._url} ({what}) after {self._retries + 1} "
            f"attempts: {last}"
        )


def _json(raw: bytes, status: int, url: str) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep
        raise QueryError(f"{url}: HTTP {status}: not a Prometheus API answer") from exc
    if not isinstance(body, dict) or (body.get("status") == "success" and "data" not in body):
        raise QueryError(f"{url}: HTTP {status}: not a Prometheus API answer")
    return body


def answer_data(body: dict[str, Any], *, what: str) -> tuple[Any, list[str]]:
    """A decoded answer's `data` and its incompleteness warnings; QueryError naming the
    error Prometheus gave (cut short: a proxy may answer anything) when it did not succeed."""
    if body.get("status") != "success":
        raise QueryError(f"{what} failed: {api_error(body)}")
    return body["data"], _warnings(body)


def range_series(data: Any, *, what: str) -> list[Series]:
    """The series of a range query's `data`; QueryError when it is not a matrix of
    `[time, "value"]` pairs (a proxy's page, another engine's shape, a truncated body)."""
    try:
        return [_series(item) for item in data["result"]]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise QueryError(f"{what}: not a range query answer: {repr(exc)[:200]}") from exc


def label_set(data: Any, *, what: str) -> set[str]:
    """The values of a label values answer's `data` (a list of strings)."""
    if data is None:
        return set()
    if not isinstance(data, list):
        raise QueryError(f"{what}: not a list of label values: {str(data)[:80]!r}")
    return {str(value) for value in data}


def _warnings(body: dict[str, Any]) -> list[str]:
    """Why a successful answer may be incomplete: Prometheus' `warnings` (a store or shard
    that did not answer, behind Thanos or Mimir) and VictoriaMetrics' `isPartial` (a
    vmstorage node that did not answer)."""
    raw = body.get("warnings") or []
    warnings = [str(w) for w in raw] if isinstance(raw, list) else [str(raw)]
    if body.get("isPartial") is True:
        warnings.append("partial response: some storage nodes did not answer (isPartial)")
    return warnings


def _series(item: dict[str, Any]) -> Series:
    values = item.get("values", [])
    timestamps = [float(t) for t, _ in values]
    if not all(math.isfinite(t) for t in timestamps):  # JSON may hold 1e999 or Infinity
        raise ValueError("a sample time that is not a finite number")
    return Series(
        labels={str(k): str(v) for k, v in item["metric"].items()},
        timestamps=timestamps,
        values=[float(v) for _, v in values],
    )


def _ts(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")
