"""Stack health (uid fleetwatch-stack): the exporter's collectors and scrapes, and the
taint controller's actions and breaker.
"""

from __future__ import annotations

from grafanalib.core import Dashboard, Panel

from dashboards.panels import NODE, Layout, dashboard, stat, timeseries, variables
from dashboards.queries import Queries


def build(q: Queries) -> Dashboard:
    """fleetwatch's own health: the exporter's collectors and scrapes, and the tainter."""
    lay = Layout()
    panels: list[Panel] = [
        lay.row("Exporter"),
        timeseries(
            lay,
            "Collectors up",
            (q.exporter("fleetwatch_collector_up", NODE), "{{node}} {{collector}}"),
            unit="bool",
        ),
        timeseries(
            lay,
            "Collector duration",
            (q.exporter("fleetwatch_collector_duration_seconds", NODE), "{{node}} {{collector}}"),
            unit="s",
        ),
        timeseries(
            lay,
            "Collector errors",
            (
                f"rate({q.exporter('fleetwatch_collector_errors_total', NODE)}[$__rate_interval])",
                "{{node}} {{collector}}",
            ),
        ),
        timeseries(
            lay,
            "Scrape duration",
            (q.exporter("scrape_duration_seconds", NODE), "{{node}} {{instance}}"),
            unit="s",
        ),
        lay.row("Tainter"),
        timeseries(
            lay,
            "Taint operations",
            (
                "sum by (op, result) (rate("
                f"{q.tainter('fleetwatch_tainter_taint_operations_total')}[$__rate_interval]))",
                "{{op}} {{result}}",
            ),
        ),
        timeseries(
            lay,
            "Webhook requests",
            (
                "sum by (result) (rate("
                f"{q.tainter('fleetwatch_tainter_webhook_requests_total')}[$__rate_interval]))",
                "{{result}}",
            ),
        ),
        stat(lay, "Tainted nodes", f"max({q.tainter('fleetwatch_tainter_tainted_nodes')})"),
        stat(
            lay,
            "Circuit breaker open",
            f"max({q.tainter('fleetwatch_tainter_breaker_open')})",
            limits=[(1, "red")],
        ),
    ]
    return dashboard(
        "fleetwatch-stack",
        "fleetwatch / Stack health",
        "The exporter's collectors and scrapes, and the taint controller.",
        panels,
        variables(q.job, gpu=False),
    )
