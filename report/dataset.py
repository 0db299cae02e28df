"""What the report pulls from Prometheus, as typed pandas frames, and Parquet snapshots.

`fetch` runs the queries of `fleetwatch.report.query_table` whose metrics have samples in
the window. Every frame is long-format: the query's label columns (categorical),
`timestamp` (int64 epoch seconds) and `value` (float64), sorted, so a snapshot written
with `save_snapshot` and read back with `load_snapshot` yields identical frames.

A large fleet is read in node batches (`--query.batch-nodes`: the nodes with
fleetwatch series in the window, listed first, then one request per query and batch, at
most `--query.concurrency` in flight), so no single answer or store evaluation covers the
whole fleet. A batch that fails, times out or comes back partial leaves its query's other
batches standing and is named in `Dataset.missing`, which the report shows per section.

A query with a recorded form (`Query.recorded`) reads the recording rule's series when the
store holds them over the whole window, its raw expression otherwise; which one each such
query read is logged and kept in `Dataset.sources` (and in a snapshot's manifest).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from fleetwatch.report.promapi import (
    PrometheusAuthError,
    PrometheusClient,
    PrometheusError,
    Series,
    chunks,
)
from fleetwatch.report.query import COVERAGE_LOOKBACK_SECONDS, Query, Window, coverage
from fleetwatch.report.query_table import BY_AREA, QUERIES, node_list_lookups
from fleetwatch.rules.config import ModelPolicy

log = logging.getLogger(__name__)

RAW = "raw expression"
"""`Dataset.sources` of a query that read its raw expression rather than recorded series."""


@dataclass
class Dataset:
    """Frames by query name, why each absent frame is absent, and which parts of the
    present frames are missing (a batch the store failed or answered partially)."""

    window: Window
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    missing: dict[str, list[str]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    """For each query with a recorded form that ran: the recording rule it read, or `RAW`."""

    def frame(self, name: str) -> pd.DataFrame | None:
        """The frame, or None when its query could not run (see `problems`)."""
        return self.frames.get(name)


def _columns(series: list[Series], keys: tuple[str, ...]) -> pd.DataFrame:
    """One answer's points as categorical `keys`, int64 `timestamp` and float64 `value`
    (not yet sorted). Built from one code per series, repeated, never a Python object per
    point: at 10,000 nodes the answers hold millions of points."""
    counts = np.fromiter((len(s.values) for s in series), dtype=np.int64, count=len(series))
    columns: dict[str, object] = {}
    for k in keys:
        labels = [s.labels.get(k, "") for s in series]
        categories = sorted(set(labels))
        code = {label: i for i, label in enumerate(categories)}
        codes = np.repeat(np.fromiter((code[v] for v in labels), np.int32, len(labels)), counts)
        columns[k] = pd.Categorical.from_codes(
            codes, categories=pd.Index(categories, dtype="string")
        )
    total = int(counts.sum())
    columns["timestamp"] = np.fromiter(
        (t for s in series for t in s.timestamps), dtype=np.float64, count=total
    ).astype(np.int64)
    columns["value"] = np.fromiter(
        (v for s in series for v in s.values), dtype=np.float64, count=total
    )
    return pd.DataFrame(columns)


def _finish(parts: list[pd.DataFrame], keys: tuple[str, ...]) -> pd.DataFrame:
    """The batches' points as one long-format frame: categorical keys (categories sorted,
    so sorting by them is sorting by the labels), int64 `timestamp`, float64 `value`,
    sorted."""
    columns: dict[str, object] = {}
    for k in keys:
        joined = union_categoricals([part[k].array for part in parts], sort_categories=True)
        columns[k] = joined
    for k in ("timestamp", "value"):
        columns[k] = np.concatenate([part[k].to_numpy() for part in parts])
    frame = pd.DataFrame(columns)
    return frame.sort_values([*keys, "timestamp"], ignore_index=True)


def _range_for(query: Query, window: Window) -> tuple[float, float, float]:
    if query.shape == "summary":
        return window.end, window.end, window.step
    if query.shape == "bucketed":
        return window.start + window.bucket, window.end, window.bucket
    return window.start, window.end, window.step


@dataclass(frozen=True)
class Part:
    """One batch's answer as a frame, and the store's warnings about it."""

    frame: pd.DataFrame
    warnings: list[str]


@dataclass(frozen=True)
class Batch:
    """Some nodes of the fleet, as a PromQL regex and as a name a person can read."""

    regex: str
    label: str
    nodes: tuple[str, ...] = ()


def batches(nodes: list[str], size: int) -> list[Batch]:
    """`nodes` (sorted) in groups of at most `size`; no nodes: one batch of the whole fleet."""
    if not nodes:
        return [Batch("", "all nodes")]
    out = []
    for i in range(0, len(nodes), size):
        group = nodes[i : i + size]
        regex = "|".join(re.escape(n).replace("\\", "\\\\") for n in group)
        label = group[0] if len(group) == 1 else f"{group[0]} … {group[-1]} ({len(group)} nodes)"
        out.append(Batch(regex, label, tuple(group)))
    return out


MAX_QUERY_BYTES: Final = 16 * 1024
"""The longest query sent: VictoriaMetrics' default `-search.maxQueryLen`. A query that
names a batch's nodes in several selectors (the overheat policy's, one per model) would pass
it at `--query.batch-nodes=200`, so its batches are split until it fits."""


def fitted(build: Callable[[Window], str], window: Window, batch: Batch) -> list[Batch]:
    """`batch`, or its halves (recursively) where the query `build` makes for it is longer
    than MAX_QUERY_BYTES; a single node is sent as it is (the store says if it is too long)."""
    expr = build(dataclasses.replace(window, nodes=batch.regex))
    if len(expr.encode()) <= MAX_QUERY_BYTES or len(batch.nodes) < 2:
        return [batch]
    half = batches(list(batch.nodes), (len(batch.nodes) + 1) // 2)
    return [part for piece in half for part in fitted(build, window, piece)]


async def fleet_nodes(client: PrometheusClient, window: Window, present: set[str]) -> list[str]:
    """Every node with fleetwatch's GPU count or InfiniBand ports (or dcgm-exporter series
    naming it by `Hostname`) in the window and the selector, sorted."""
    found: set[str] = set()
    for label, match in node_list_lookups(window, present):
        found |= await client.label_values(label, start=window.start, end=window.end, match=match)
    return sorted(found - {""})


LEFT_OUT: Final = "its section was not asked for (--report.section)"
"""`Dataset.problems` of a query of an area the report was not asked to compute."""


async def fetch(
    client: PrometheusClient,
    window: Window,
    *,
    batch_nodes: int = 200,
    areas: tuple[str, ...] = (),
) -> Dataset:
    """Run every query (of `areas`, when given) whose required metrics exist in the window,
    per node batch; record the rest, and every batch that failed or came back partial.

    Raises `PrometheusUnreachable`/`PrometheusAuthError` when nothing can be read at all
    (the metric names or the node list); a batch's error only marks that batch missing,
    and a query whose every batch failed is not computed.
    """
    present = await client.metric_names(start=window.start, end=window.end, match=None)
    dataset = Dataset(window=window)
    asked = [q for area in areas for q in BY_AREA[area]] if areas else list(QUERIES)
    dataset.problems.update((q.name, LEFT_OUT) for q in QUERIES if q not in asked)
    recorded = {q.name for q in asked if await _recorded(client, window, q, present)}
    runnable = [q for q in asked if _runnable(q, present, dataset, q.name in recorded)]
    builds = {q.name: q.build for q in runnable}
    for query in runnable:
        if query.recorded is not None:
            source = RAW
            if query.name in recorded:
                builds[query.name], source = query.recorded.build, query.recorded.record
            dataset.sources[query.name] = source
            log.info("report: %s reads %s", query.name, source, extra={"query": query.name})
    groups = (
        batches(await fleet_nodes(client, window, present), batch_nodes)
        if any(q.batched for q in runnable)
        else []
    )
    work = [
        (q, part)
        for q in runnable
        for b in (groups if q.batched else [Batch("", "")])
        for part in fitted(builds[q.name], window, b)
    ]
    client.progress.reset(total=sum(len(chunks(*_range_for(q, window))) for q, _ in work))
    waiting: list[str] = []

    async def run(query: Query, batch: Batch) -> tuple[Query, Batch, Part | PrometheusError]:
        """One query for one batch, its answer made a frame at once: the answer's Python
        lists go as soon as it arrives, so only the requests in flight hold any."""
        what = f"{query.name} {batch.label}".strip()
        waiting.append(what)
        client.progress.set_postfix_str(_waiting(waiting))
        start, end, step = _range_for(query, window)
        try:
            expr = builds[query.name](dataclasses.replace(window, nodes=batch.regex))
            answer = await client.query_range(expr, start=start, end=end, step=step)
            return query, batch, Part(_columns(answer.series, query.keys), answer.warnings)
        except PrometheusAuthError:
            raise
        except PrometheusError as exc:
            return query, batch, exc
        finally:
            waiting.remove(what)
            client.progress.set_postfix_str(_waiting(waiting))

    parts: dict[str, list[pd.DataFrame]] = {}
    errors: dict[str, list[str]] = {}
    for query, batch, result in await asyncio.gather(*(run(q, b) for q, b in work)):
        part = f"{batch.label}: " if batch.label else ""
        if isinstance(result, PrometheusError):
            errors.setdefault(query.name, []).append(str(result))
            dataset.missing.setdefault(query.name, []).append(f"{part}{result}")
            continue
        parts.setdefault(query.name, []).append(result.frame)
        if result.warnings:
            dataset.missing.setdefault(query.name, []).append(
                f"{part}the store answered partially: {'; '.join(result.warnings)}"
            )
    for query in runnable:
        if query.name in parts:
            dataset.frames[query.name] = _finish(parts[query.name], query.keys)
        else:
            dataset.problems[query.name] = errors[query.name][0]
            del dataset.missing[query.name]
    share_categories(dataset.frames)
    return dataset


def share_categories(frames: dict[str, pd.DataFrame]) -> None:
    """Give each label column one categorical dtype across `frames` (the union of its
    categories, sorted), in place.

    The analysis joins the per-GPU bucket frames (at 10,000 nodes, 80,000 GPUs x 24
    buckets each) on their label columns: with one dtype on both sides pandas joins the
    integer codes and the result stays categorical, where differing categories (a GPU
    without allocations, a node without GPM) would make it convert every key to Python
    strings first, most of the report's memory."""
    columns: dict[str, list[pd.DataFrame]] = {}
    for frame in frames.values():
        for column in frame.columns:
            if isinstance(frame[column].dtype, pd.CategoricalDtype):
                columns.setdefault(column, []).append(frame)
    for column, holders in columns.items():
        categories = sorted(set().union(*(h[column].cat.categories for h in holders)))
        dtype = pd.CategoricalDtype(pd.Index(categories, dtype="string"))
        for holder in holders:
            holder[column] = holder[column].cat.set_categories(dtype.categories)


async def _recorded(
    client: PrometheusClient, window: Window, query: Query, present: set[str]
) -> bool:
    """Whether the store holds `query`'s recorded series over the whole window: the name
    has samples in the window (`present`, no extra request), and at the window's start and
    at its end they answer for every key the raw expression does (`coverage`, one query of
    two points). A store that cannot answer that counts as not holding them: the raw
    expression is read."""
    if query.recorded is None or query.recorded.record not in present:
        return False
    first = window.start + COVERAGE_LOOKBACK_SECONDS
    points = 2 if window.end > first else 1
    step = window.end - first if points == 2 else COVERAGE_LOOKBACK_SECONDS
    try:
        answer = await client.query_range(
            coverage(window, query), start=first, end=max(first, window.end), step=step
        )
    except PrometheusAuthError:
        raise
    except PrometheusError as exc:
        log.warning(
            "report: cannot tell whether %s covers the window: %s", query.recorded.record, exc
        )
        return False
    covered = [v for series in answer.series for v in series.values]
    return len(covered) == points and all(v == 1 for v in covered)


def _runnable(query: Query, present: set[str], dataset: Dataset, recorded: bool) -> bool:
    """Whether `query`'s metrics (or, `recorded`, its recorded series, present already)
    have samples; if not, why not goes in `dataset.problems`."""
    missing = [] if recorded else [m for m in query.required if m not in present]
    if not recorded and query.any_of is not None and not present.intersection(query.any_of()):
        missing.append(" or ".join(query.any_of()))
    if not present:
        dataset.problems[query.name] = (
            "Prometheus has no samples at all in the window: check --since/--until "
            "and that this is the Prometheus that scrapes the fleet"
        )
    elif missing:
        dataset.problems[query.name] = (
            f"metric {', '.join(missing)} has no samples in the window "
            "(is its collector off, or the component not deployed?)"
        )
    return not missing and bool(present)


def _waiting(waiting: list[str]) -> str:
    """What the progress bar says it waits for: the oldest request in flight, and how many
    more there are."""
    if not waiting:
        return ""
    more = f" (+{len(waiting) - 1} more)" if len(waiting) > 1 else ""
    return f"waiting for {waiting[0]}{more}"


def save_snapshot(dataset: Dataset, directory: Path) -> None:
    """Write every frame as Parquet plus a manifest (window, problems) to `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, frame in dataset.frames.items():
        frame.to_parquet(directory / f"{name}.parquet", index=False)
    manifest = {
        "window": asdict(dataset.window),
        "problems": dataset.problems,
        "missing": dataset.missing,
        "sources": dataset.sources,
        "frames": sorted(dataset.frames),
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


def load_snapshot(directory: Path) -> Dataset:
    """Read a snapshot written by `save_snapshot`; raises ValueError naming what is wrong."""
    manifest_path = directory / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
        fields = dict(manifest["window"])
        policies = fields.get("overheat_policy", ())
        fields["overheat_policy"] = tuple(ModelPolicy(**policy) for policy in policies)
        window = Window(**fields)
        names = [str(n) for n in manifest["frames"]]
        problems = {str(k): str(v) for k, v in manifest["problems"].items()}
        missing = {str(k): [str(p) for p in v] for k, v in manifest.get("missing", {}).items()}
        sources = {str(k): str(v) for k, v in manifest.get("sources", {}).items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{manifest_path}: not a fleetwatch report snapshot ({exc})") from exc
    frames = {}
    for name in names:
        path = directory / f"{name}.parquet"
        try:
            frames[name] = pd.read_parquet(path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read snapshot frame ({exc})") from exc
    share_categories(frames)
    return Dataset(
        window=window, frames=frames, problems=problems, missing=missing, sources=sources
    )
