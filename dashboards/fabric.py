"""Fabric (uid fleetwatch-fabric): InfiniBand error rates, flaps, degraded and saturated
links, throughput, NVLink errors, and NVLink domains (NVL72): GPUs, nodes, degraded and
unregistered GPUs and the training jobs of each domain, from the global domain rules.
"""

from __future__ import annotations

from grafanalib.core import Dashboard, Panel

from dashboards.panel_promql import Queries
from dashboards.panels import NODE, Layout, dashboard, table, timeseries, variables
from fleetwatch.catalog.infiniband import (
    INFINIBAND_PORT_ERROR_SATURATED,
    INFINIBAND_PORT_ERRORS_TOTAL,
    INFINIBAND_PORT_EXPECTED_RATE_BYTES_PER_SECOND,
    INFINIBAND_PORT_RATE_BYTES_PER_SECOND,
    INFINIBAND_PORT_STATE_CHANGES_TOTAL,
    INFINIBAND_PORT_UP,
)
from fleetwatch.rules.definitions import (
    DOMAIN_DEGRADED,
    DOMAIN_GPUS,
    DOMAIN_JOB_GPUS,
    DOMAIN_NODES,
    DOMAIN_UNREGISTERED,
)


def build(q: Queries) -> Dashboard:
    """InfiniBand and NVLink health across the chosen nodes."""
    lay = Layout()
    state_changes = q.exporter(INFINIBAND_PORT_STATE_CHANGES_TOTAL.name, NODE)
    link_downed = q.exporter(INFINIBAND_PORT_ERRORS_TOTAL.name, 'error="link_downed"', NODE)
    panels: list[Panel] = [
        lay.row("InfiniBand"),
        timeseries(
            lay,
            "InfiniBand error rate by port and type",
            (f"{q.ib_rate}{{{NODE}}}", "{{node}} {{device}}/{{port}} {{error}}"),
            width=24,
            description="Errors per second over the rate window.",
        ),
        timeseries(
            lay,
            "Link flaps (link_downed and state changes, last hour)",
            (f"increase({link_downed}[1h])", "{{node}} {{device}}/{{port}} link_downed"),
            (
                f"increase({state_changes}[1h])",
                "{{node}} {{device}}/{{port}} state changes",
            ),
        ),
        timeseries(
            lay,
            "Trained rate vs expected",
            (
                q.exporter(INFINIBAND_PORT_RATE_BYTES_PER_SECOND.name, NODE),
                "{{node}} {{device}}/{{port}}",
            ),
            (
                q.exporter(INFINIBAND_PORT_EXPECTED_RATE_BYTES_PER_SECOND.name, NODE),
                "{{node}} {{device}}/{{port}} expected",
            ),
            unit="Bps",
            description="A link below its expected rate is degraded.",
        ),
        table(
            lay,
            "Ports down",
            (f"{q.exporter(INFINIBAND_PORT_UP.name, NODE)} == 0", ""),
            description="Ports not ACTIVE/LinkUp (empty when all are up).",
        ),
        table(
            lay,
            "Saturated counters",
            (f"{q.exporter(INFINIBAND_PORT_ERROR_SATURATED.name, NODE)} == 1", ""),
            description="PMA counters pinned at their maximum: their rate reads 0.",
        ),
        timeseries(
            lay,
            "InfiniBand throughput",
            (f"{q.ib_data_rate}{{{NODE}}}", "{{node}} {{device}}/{{port}} {{direction}}"),
            unit="Bps",
            width=24,
        ),
        lay.row("NVLink"),
        timeseries(
            lay,
            "NVLink error rate by link and type",
            (f"{q.nvlink_rate}{{{NODE}}} > 0", "{{node}} GPU {{gpu}} link {{link}} {{error}}"),
            width=24,
            description="Links with errors in the rate window (per s).",
        ),
        lay.row("NVLink domains (NVL72)"),
        table(
            lay,
            "NVLink domains",
            (DOMAIN_GPUS, ""),
            (DOMAIN_NODES, ""),
            (DOMAIN_DEGRADED, ""),
            (DOMAIN_UNREGISTERED, ""),
            width=24,
            columns={
                "Value #A": "GPUs",
                "Value #B": "nodes",
                "Value #C": "degraded GPUs",
                "Value #D": "unregistered GPUs",
            },
            sort_by="degraded GPUs",
            description=(
                "Each NVLink domain (fabric cluster UUID and clique ID): its GPUs and nodes, "
                "and the GPUs whose fabric is degraded or not registered. All nodes, from "
                "the global domain rules (empty without NVLink-fabric GPUs)."
            ),
        ),
        table(
            lay,
            "Training jobs in degraded domains",
            (
                f"{DOMAIN_JOB_GPUS}\nand on (cluster_uuid, clique_id)\n"
                f"({DOMAIN_DEGRADED} + {DOMAIN_UNREGISTERED} > 0)",
                "",
            ),
            width=24,
            columns={"Value": "GPUs in the domain"},
            description=(
                "Jobs holding GPUs in a domain with a degraded or unregistered GPU: a "
                "multi-node NVLink job stalls as a whole when one tray's fabric fails."
            ),
        ),
    ]
    return dashboard(
        "fleetwatch-fabric",
        "fleetwatch / Fabric",
        "InfiniBand and NVLink health: errors, flaps, degraded and saturated links, NVLink "
        "domains.",
        panels,
        variables(q.job, gpu=False),
    )
