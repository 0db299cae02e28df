"""Every query the report runs, by section, and where the fleet's node list is read.

`QUERIES` gathers the areas' queries in the order of the report's sections (thermal,
activity and training jobs, fabric, reliability, remediation, checkpoint storage, goodput); names
are unique across them. `fleetwatch.report.dataset` runs them in node batches.
"""

from __future__ import annotations

from fleetwatch.report.fabric_queries import FABRIC, IB_UP
from fleetwatch.report.goodput_queries import GOODPUT
from fleetwatch.report.query import AREAS, Query, Window
from fleetwatch.report.reliability_queries import GPU_COUNT, RELIABILITY
from fleetwatch.report.remediation_queries import REMEDIATION
from fleetwatch.report.storage_queries import STORAGE
from fleetwatch.report.thermal_queries import THERMAL
from fleetwatch.report.thresholds import shipped_config
from fleetwatch.report.training_queries import TRAINING
from fleetwatch.report.windowed_promql import DCGM_NODE_LABEL, select

BY_AREA: dict[str, tuple[Query, ...]] = {
    "thermal": THERMAL,
    "training": TRAINING,
    "fabric": FABRIC,
    "reliability": RELIABILITY,
    "remediation": REMEDIATION,
    "checkpoints": STORAGE,
    "goodput": GOODPUT,
}
"""Each area's queries (`fleetwatch.report.query.AREAS`, in that order)."""
QUERIES: tuple[Query, ...] = tuple(q for area in AREAS for q in BY_AREA[area])

NODE_LISTS = (GPU_COUNT, IB_UP)
"""Metrics the node list is read from: few series a node (one; one a port), so listing
10,000 nodes stays under a store's series limit for one lookup (VictoriaMetrics refuses
more than 300,000 by default, and the whole fleetwatch family is 130 a node)."""


def node_list_lookups(window: Window, present: set[str]) -> list[tuple[str, str]]:
    """The (label, series selector) pairs the fleet's node list is read from: the
    `NODE_LISTS` metrics with samples in the window (label `node`), and dcgm-exporter's
    series naming the node by `Hostname` where only dcgm-exporter runs on it."""
    lookups = [("node", select(window, name)) for name in NODE_LISTS if name in present]
    dcgm = shipped_config().dcgm_tensor_active_metric
    if dcgm in present:
        lookups.append((DCGM_NODE_LABEL, select(window, dcgm, 'node=""', scoped=False)))
    return lookups
