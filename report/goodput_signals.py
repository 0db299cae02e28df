"""The Goodput section's inputs, turned from the store's sparse answers into the model's
records: spans from transitions, node signals by cause, each node's own record.

The node signals are what fleetwatch's alerts said (`ALERTS`, the rules' judgement of the
raw series: a GPU lost, a row-remap failure, NVLink and the fabric, InfiniBand, thermal,
the checkpoint mounts, a taint asked by fleetwatch), the Xid counters by NVIDIA's catalog
(critical Xids, so a store without the alerts still attributes GPU faults), and the nodes
whose exporter fell silent (node lost).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import pandas as pd

from fleetwatch.catalog.nvidia_xids import XidCatalog
from fleetwatch.report.goodput_model import (
    CHECKPOINT_STORAGE,
    FLEETWATCH,
    GPU_LOST,
    INFINIBAND,
    NODE_LOST,
    NVLINK,
    ROW_REMAP,
    THERMAL,
    Signal,
    Span,
    xid_cause,
)
from fleetwatch.report.goodput_pricing import NodeRecord
from fleetwatch.report.goodput_queries import STARTED

ALERT_CAUSES: Final[dict[str, str]] = {
    "GPUFallenOffBus": GPU_LOST,
    "GPURowRemapFailed": ROW_REMAP,
    "NVLinkDown": NVLINK,
    "GPUFabricDegraded": NVLINK,
    "GPUFabricNotRegistered": NVLINK,
    "InfiniBandPortDown": INFINIBAND,
    "InfiniBandLinkFlapping": INFINIBAND,
    "GPUOverheating": THERMAL,
    "GPUThermalSlowdown": THERMAL,
    "GPUMemoryOverheating": THERMAL,
    "CheckpointMountHung": CHECKPOINT_STORAGE,
    "CheckpointMountReadOnly": CHECKPOINT_STORAGE,
    "NFSServerNotResponding": CHECKPOINT_STORAGE,
    "FleetwatchExporterDown": NODE_LOST,
}
"""The cause each alert gives; `GPUXidCritical` gives its Xid's (`xid_cause`), and any
other alert that asks for a taint (`fleetwatch_taint`) is fleetwatch taking the node out."""
XID_ALERT: Final = "GPUXidCritical"


def spans(
    frame: pd.DataFrame | None, keys: tuple[str, ...], *, start: float, end: float
) -> dict[tuple[str, ...], list[Span]]:
    """Spans per key from a transitions frame (`STARTED`/`STOPPED` rows,
    `fleetwatch.report.goodput_queries.transitions`): a span opens at a start and closes at
    the next stop; a stop with no start before it began with the window (`start`), a start
    never stopped lasts to its end (`end`)."""
    out: dict[tuple[str, ...], list[Span]] = {}
    if frame is None or frame.empty:
        return out
    ordered = frame.sort_values([*keys, "timestamp"], kind="stable")
    for key, group in ordered.groupby(list(keys), observed=True, sort=False):
        label = tuple(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        opened: float | None = None
        first = True
        for when, value in zip(group["timestamp"], group["value"], strict=True):
            if value == STARTED:
                opened = float(when) if opened is None else opened
            else:
                since = opened if opened is not None else (start if first else None)
                if since is not None:
                    out.setdefault(label, []).append(Span(start=since, end=float(when)))
                opened = None
            first = False
        if opened is not None:
            out.setdefault(label, []).append(Span(start=opened, end=end))
    return out


def gaps(present: Iterable[Span], *, start: float, end: float) -> list[Span]:
    """The stretches of [start, end) not covered by `present` (sorted, not overlapping)."""
    out = []
    at = start
    for span in sorted(present, key=lambda s: s.start):
        if span.start > at:
            out.append(Span(start=at, end=span.start))
        at = max(at, span.end)
    if at < end:
        out.append(Span(start=at, end=end))
    return out


@dataclass(frozen=True, kw_only=True)
class NodeSignals:
    """Every node signal in the window, and each node's own record for its lemon score."""

    signals: tuple[Signal, ...]
    records: dict[str, NodeRecord]


def node_signals(
    *,
    alerts: pd.DataFrame | None,
    xids: pd.DataFrame | None,
    present: pd.DataFrame | None,
    catalog: XidCatalog,
    start: float,
    end: float,
) -> NodeSignals:
    """Signals from the alerts' firing spans, the Xid events and the nodes' silences, and
    per node its Xids, taints and hours out of service (silent, or tainted)."""
    signals: list[Signal] = []
    xid_counts: dict[str, int] = {}
    taints: dict[str, int] = {}
    out_seconds: dict[str, float] = {}
    fired = spans(alerts, ("alertname", "node", "xid", "fleetwatch_taint"), start=start, end=end)
    for (name, node, xid, taint), runs in fired.items():
        if not node:
            continue
        cause = ALERT_CAUSES.get(name)
        if name == XID_ALERT and xid.isdigit():
            cause = xid_cause(int(xid), catalog)
        if cause is None and taint:
            cause = FLEETWATCH
        if taint:
            taints[node] = taints.get(node, 0) + len(runs)
            out_seconds[node] = out_seconds.get(node, 0.0) + sum(r.seconds for r in runs)
        if cause is None:
            continue
        detail = f"{name} (Xid {xid})" if xid else name
        signals += [
            Signal(node=node, time=r.start, until=r.end, cause=cause, detail=detail) for r in runs
        ]
    if xids is not None:
        for row in xids.itertuples(index=False):
            node = str(row.node)
            xid_counts[node] = xid_counts.get(node, 0) + int(row.value)
            code = str(row.xid)
            cause = xid_cause(int(code), catalog) if code.isdigit() else None
            if cause is not None:
                detail = f"Xid {code} on GPU {row.gpu}"
                signals.append(
                    Signal(node=node, time=float(row.timestamp), cause=cause, detail=detail)
                )
    for (node,), runs in spans(present, ("node",), start=start, end=end).items():
        for silent in gaps(runs, start=min(r.start for r in runs), end=end):
            detail = "its exporter went silent"
            signals.append(
                Signal(
                    node=node, time=silent.start, until=silent.end, cause=NODE_LOST, detail=detail
                )
            )
            out_seconds[node] = out_seconds.get(node, 0.0) + silent.seconds
    nodes = set(xid_counts) | set(taints) | set(out_seconds)
    records = {
        node: NodeRecord(
            xids=xid_counts.get(node, 0),
            taints=taints.get(node, 0),
            hours_out=out_seconds.get(node, 0.0) / 3600,
        )
        for node in nodes
    }
    return NodeSignals(signals=tuple(signals), records=records)


def node_seconds(present: pd.DataFrame | None, *, start: float, end: float) -> float:
    """Node-seconds the fleet's nodes were present (their exporter reporting) in the window."""
    return sum(seconds_by_node(present, start=start, end=end).values())


def seconds_by_node(present: pd.DataFrame | None, *, start: float, end: float) -> dict[str, float]:
    """Seconds each node was present (its exporter reporting) in the window."""
    return {
        key[0]: sum(s.seconds for s in runs)
        for key, runs in spans(present, ("node",), start=start, end=end).items()
    }
