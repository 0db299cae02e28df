"""The Reliability section's queries: Xids, ECC, row remapping, GPUs lost or missing.

Counts are each counter's growth in the window (an Xid counter that first appeared inside
it counts whole); a GPU is lost when it has samples in the window but none in the last
`LOST_AFTER_SECONDS`, and a node misses GPUs when NVML lists fewer than it expects.
"""

from __future__ import annotations

from fleetwatch.catalog.gpu import (
    GPU_ECC_ERRORS_TOTAL,
    GPU_REMAPPED_ROWS,
    GPU_ROW_REMAP_FAILED,
    GPUS_EXPECTED,
    GPUS_VISIBLE,
)
from fleetwatch.catalog.xid import GPU_XID_ERRORS_TOTAL
from fleetwatch.report.query import GPU, Query, Window
from fleetwatch.report.thermal_queries import TEMP, gpu_temperature
from fleetwatch.report.windowed_promql import (
    duration,
    growth,
    over_window,
    select,
    window_delta,
)

XID = GPU_XID_ERRORS_TOTAL.name
ECC = GPU_ECC_ERRORS_TOTAL.name
REMAPPED = GPU_REMAPPED_ROWS.name
REMAP_FAILED = GPU_ROW_REMAP_FAILED.name
GPU_COUNT = GPUS_VISIBLE.name
GPU_EXPECTED = GPUS_EXPECTED.name
LOST_AFTER_SECONDS = 600.0


def _lost(w: Window) -> str:
    """GPUs with samples in the window but none in the last LOST_AFTER_SECONDS."""
    temp = gpu_temperature(w)
    return (
        f"max by (node,gpu,uuid) (count_over_time({temp}[{duration(w.seconds)}]) "
        f"unless on(node,gpu,uuid) count_over_time({temp}[{duration(LOST_AFTER_SECONDS)}]))"
    )


RELIABILITY: tuple[Query, ...] = (
    Query(
        name="xid_events",
        shape="summary",
        keys=(*GPU, "xid"),
        required=(),
        optional=(XID,),
        build=lambda w: f"max by (node,gpu,uuid,xid) ({window_delta(w, select(w, XID))}) > 0",
    ),
    Query(
        name="ecc_errors",
        shape="summary",
        keys=(*GPU, "severity"),
        required=(ECC,),
        build=lambda w: f"sum by (node,gpu,uuid,severity) ({growth(w, select(w, ECC))}) > 0",
    ),
    Query(
        name="remapped_rows",
        shape="summary",
        keys=(*GPU, "cause"),
        required=(REMAPPED,),
        build=lambda w: (
            f"max by (node,gpu,uuid,cause) ({over_window('max_over_time', REMAPPED)(w)}"
            f" - {over_window('min_over_time', REMAPPED)(w)}) > 0"
        ),
    ),
    Query(
        name="remap_failed",
        shape="summary",
        keys=GPU,
        required=(REMAP_FAILED,),
        build=lambda w: (
            f"max by (node,gpu,uuid) ({over_window('max_over_time', REMAP_FAILED)(w)}) > 0"
        ),
    ),
    Query(
        name="gpu_lost_samples",
        shape="summary",
        keys=GPU,
        required=(TEMP,),
        build=_lost,
    ),
    Query(
        name="gpu_samples_max",
        shape="summary",
        keys=(),
        required=(TEMP,),
        build=lambda w: f"max(count_over_time({gpu_temperature(w)}[{duration(w.seconds)}]))",
    ),
    Query(
        name="gpu_count_min",
        shape="summary",
        keys=("node",),
        required=(GPU_COUNT,),
        build=lambda w: f"min by (node) ({over_window('min_over_time', GPU_COUNT)(w)})",
    ),
    Query(
        name="gpu_expected",
        shape="summary",
        keys=("node",),
        required=(GPU_EXPECTED,),
        build=lambda w: f"max by (node) ({over_window('max_over_time', GPU_EXPECTED)(w)})",
    ),
)
