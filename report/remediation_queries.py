"""The Remediation section's queries: the tainting alerts that fired, and the tainter.

Which nodes an alert asked to taint and when (Prometheus' `ALERTS` series of alerts that
carry a `fleetwatch_taint` label), and the tainter's own metrics: its taint operations,
the nodes it holds tainted, and whether its breaker was open. Fleet-wide, not batched:
a handful of series.
"""

from __future__ import annotations

from fleetwatch.catalog.tainter import (
    TAINTER_BREAKER_OPEN,
    TAINTER_TAINT_OPERATIONS_TOTAL,
    TAINTER_TAINTED_NODES,
)
from fleetwatch.report.query import Query
from fleetwatch.report.windowed_promql import select, window_delta

TAINT_OPS = TAINTER_TAINT_OPERATIONS_TOTAL.name
TAINTED_NODES = TAINTER_TAINTED_NODES.name
BREAKER = TAINTER_BREAKER_OPEN.name

REMEDIATION: tuple[Query, ...] = (
    Query(
        name="taint_alerts",
        shape="timeline",
        keys=("node", "alertname", "fleetwatch_taint"),
        required=(),
        optional=("ALERTS",),
        batched=False,
        build=lambda w: (
            "max by (node,alertname,fleetwatch_taint) ("
            + select(w, "ALERTS", 'alertstate="firing",fleetwatch_taint!=""')
            + ")"
        ),
    ),
    Query(
        name="taint_operations",
        shape="summary",
        keys=("op", "result"),
        required=(TAINT_OPS,),
        scoped=False,
        batched=False,
        build=lambda w: (
            "sum by (op,result) (" + window_delta(w, select(w, TAINT_OPS, scoped=False)) + ")"
        ),
    ),
    Query(
        name="tainted_nodes",
        shape="timeline",
        keys=(),
        required=(TAINTED_NODES,),
        scoped=False,
        batched=False,
        build=lambda w: f"max({select(w, TAINTED_NODES, scoped=False)})",
    ),
    Query(
        name="breaker_open",
        shape="timeline",
        keys=(),
        required=(BREAKER,),
        scoped=False,
        batched=False,
        build=lambda w: f"max({select(w, BREAKER, scoped=False)})",
    ),
)
