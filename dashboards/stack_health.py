"""Stack health (uid fleetwatch-stack): the exporter's collectors and scrapes, and the
taint controller's actions and breaker.
"""

from __future__ import annotations

from grafanalib.core import Dashboard, Panel

from dashboards.panel_promql import Queries
from dashboards.panels import NODE, Layout, dashboard, stat, timeseries, variables
from fleetwatch.catalog.exporter import (
    COLLECTOR_DURATION_SECONDS,
    COLLECTOR_ERRORS_TOTAL,
    COLLECTOR_UP,
)
from fleetwatch.catalog.tainter import (
    TAINTER_BREAKER_OPEN,
    TAINTER_REPAIR_BACK_IN_SERVICE_SECONDS,
    TAINTER_REPAIRS_IN_FLIGHT,
    TAINTER_REPAIRS_NOT_HELD_TOTAL,
    TAINTER_REPAIRS_TOTAL,
    TAINTER_TAINT_OPERATIONS_TOTAL,
    TAINTER_TAINTED_NODES,
    TAINTER_WEBHOOK_REQUESTS_TOTAL,
)
from fleetwatch.catalog.xid import GPU_XID_EVENTS_LISTENING, GPU_XID_NVML_ERRORS_TOTAL


def _repair_panels(q: Queries, lay: Layout) -> list[Panel]:
    """Repair after the drain (docs/tainter.md): repairs in flight, by kind and result, those
    that did not hold, and the time from taken out to back in service per reason."""
    back = q.tainter(f"{TAINTER_REPAIR_BACK_IN_SERVICE_SECONDS.name}_bucket")
    return [
        lay.row("Repair"),
        stat(lay, "Repairs in flight", f"max({q.tainter(TAINTER_REPAIRS_IN_FLIGHT.name)})"),
        timeseries(
            lay,
            "Repairs",
            (
                "sum by (repair, result) (increase("
                f"{q.tainter(TAINTER_REPAIRS_TOTAL.name)}[$__rate_interval]))",
                "{{repair}} {{result}}",
            ),
        ),
        timeseries(
            lay,
            "Repairs that did not hold",
            (
                "sum by (reason, repair) (increase("
                f"{q.tainter(TAINTER_REPAIRS_NOT_HELD_TOTAL.name)}[1d]))",
                "{{reason}} {{repair}}",
            ),
        ),
        timeseries(
            lay,
            "Time back in service (p50, p90)",
            (
                f"histogram_quantile(0.5, sum by (reason, le) (increase({back}[1d])))",
                "p50 {{reason}}",
            ),
            (
                f"histogram_quantile(0.9, sum by (reason, le) (increase({back}[1d])))",
                "p90 {{reason}}",
            ),
            unit="s",
        ),
    ]


def build(q: Queries) -> Dashboard:
    """fleetwatch's own health: the exporter's collectors and scrapes, and the tainter."""
    lay = Layout()
    panels: list[Panel] = [
        lay.row("Exporter"),
        timeseries(
            lay,
            "Collectors up",
            (q.exporter(COLLECTOR_UP.name, NODE), "{{node}} {{collector}}"),
            unit="bool",
        ),
        timeseries(
            lay,
            "Collector duration",
            (q.exporter(COLLECTOR_DURATION_SECONDS.name, NODE), "{{node}} {{collector}}"),
            unit="s",
        ),
        timeseries(
            lay,
            "Collector errors",
            (
                f"rate({q.exporter(COLLECTOR_ERRORS_TOTAL.name, NODE)}[$__rate_interval])",
                "{{node}} {{collector}}",
            ),
        ),
        timeseries(
            lay,
            "Scrape duration",
            (q.exporter("scrape_duration_seconds", NODE), "{{node}} {{instance}}"),
            unit="s",
        ),
        timeseries(
            lay,
            "GPUs whose Xid events do not arrive (NVML)",
            (
                f"sum by (node) ({q.exporter(GPU_XID_EVENTS_LISTENING.name, NODE)} == bool 0)",
                "{{node}}",
            ),
        ),
        timeseries(
            lay,
            "Xid event calls failed (NVML)",
            (
                "sum by (node, call, error) (increase("
                f"{q.exporter(GPU_XID_NVML_ERRORS_TOTAL.name, NODE)}[$__rate_interval]))",
                "{{node}} {{call}} {{error}}",
            ),
        ),
        lay.row("Tainter"),
        timeseries(
            lay,
            "Taint operations",
            (
                "sum by (op, result) (rate("
                f"{q.tainter(TAINTER_TAINT_OPERATIONS_TOTAL.name)}[$__rate_interval]))",
                "{{op}} {{result}}",
            ),
        ),
        timeseries(
            lay,
            "Webhook requests",
            (
                "sum by (result) (rate("
                f"{q.tainter(TAINTER_WEBHOOK_REQUESTS_TOTAL.name)}[$__rate_interval]))",
                "{{result}}",
            ),
        ),
        stat(lay, "Tainted nodes", f"max({q.tainter(TAINTER_TAINTED_NODES.name)})"),
        stat(
            lay,
            "Circuit breaker open",
            f"max({q.tainter(TAINTER_BREAKER_OPEN.name)})",
            limits=[(1, "red")],
        ),
        *_repair_panels(q, lay),
    ]
    return dashboard(
        "fleetwatch-stack",
        "fleetwatch / Stack health",
        "The exporter's collectors and scrapes, and the taint controller.",
        panels,
        variables(q.job, gpu=False),
    )
