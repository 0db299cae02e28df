"""The Remediation section's queries: the tainting alerts that fired, and the tainter.

Which nodes an alert asked to taint and when (Prometheus' `ALERTS` series of alerts that
carry a `fleetwatch_taint` label), and the tainter's own metrics: its taint operations,
the nodes it holds tainted, whether its breaker was open, and its repairs (`--repair.*`):
repairs by kind and result, repairs in flight, repairs that did not hold, and time from taken
out to back in service per reason (the histogram's sum and count grown in the window).
Fleet-wide, not batched: a handful of series. The repair counters exist only once a repair
was asked (`optional`).
"""

from __future__ import annotations

from fleetwatch.catalog.tainter import (
    TAINTER_BREAKER_OPEN,
    TAINTER_REPAIR_BACK_IN_SERVICE_SECONDS,
    TAINTER_REPAIRS_IN_FLIGHT,
    TAINTER_REPAIRS_NOT_HELD_TOTAL,
    TAINTER_REPAIRS_TOTAL,
    TAINTER_TAINT_OPERATIONS_TOTAL,
    TAINTER_TAINTED_NODES,
)
from fleetwatch.report.query import Query
from fleetwatch.report.windowed_promql import select, window_delta

TAINT_OPS = TAINTER_TAINT_OPERATIONS_TOTAL.name
TAINTED_NODES = TAINTER_TAINTED_NODES.name
BREAKER = TAINTER_BREAKER_OPEN.name
REPAIRS = TAINTER_REPAIRS_TOTAL.name
IN_FLIGHT = TAINTER_REPAIRS_IN_FLIGHT.name
NOT_HELD = TAINTER_REPAIRS_NOT_HELD_TOTAL.name
BACK_SUM = f"{TAINTER_REPAIR_BACK_IN_SERVICE_SECONDS.name}_sum"
BACK_COUNT = f"{TAINTER_REPAIR_BACK_IN_SERVICE_SECONDS.name}_count"


def _grown(name: str, metric: str, keys: tuple[str, ...]) -> Query:
    """A tainter counter's growth in the window, summed by `keys` (over its replicas)."""
    return Query(
        name=name,
        shape="summary",
        keys=keys,
        required=(),
        optional=(metric,),
        scoped=False,
        batched=False,
        build=lambda w: (
            f"sum by ({','.join(keys)}) (" + window_delta(w, select(w, metric, scoped=False)) + ")"
        ),
    )


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
    _grown("repairs", REPAIRS, ("repair", "result")),
    _grown("repairs_not_held", NOT_HELD, ("reason", "repair")),
    _grown("repair_back_seconds", BACK_SUM, ("reason",)),
    _grown("repair_back_count", BACK_COUNT, ("reason",)),
    Query(
        name="repairs_in_flight",
        shape="timeline",
        keys=(),
        required=(),
        optional=(IN_FLIGHT,),
        scoped=False,
        batched=False,
        build=lambda w: f"max({select(w, IN_FLIGHT, scoped=False)})",
    ),
)
