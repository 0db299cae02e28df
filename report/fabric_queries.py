"""The Fabric section's queries: InfiniBand ports, NVLink links, NVLink-switch domains.

Error counts are each counter's exact growth in the window; a port's down, slow (below the
fleet's fastest port) or saturated time is counted at `--step` resolution; a GPU's NVLink
domain (cluster UUID, clique) and the time its fabric was degraded or unregistered come
from NVML's fabric info, absent on GPUs without an NVLink switch.
"""

from __future__ import annotations

from fleetwatch.catalog.gpu import GPU_FABRIC_DEGRADED, GPU_FABRIC_INFO, GPU_FABRIC_STATE_ID
from fleetwatch.catalog.infiniband import (
    INFINIBAND_PORT_ERROR_SATURATED,
    INFINIBAND_PORT_ERRORS_TOTAL,
    INFINIBAND_PORT_RATE_BYTES_PER_SECOND,
    INFINIBAND_PORT_STATE_CHANGES_TOTAL,
    INFINIBAND_PORT_UP,
)
from fleetwatch.catalog.nvlink import NVLINK_ERRORS_TOTAL
from fleetwatch.report.query import DOMAIN, GPU, PORT, Query, Window
from fleetwatch.report.windowed_promql import (
    duration,
    growth,
    select,
    time_in_state,
    window_delta,
)

IB_ERRORS = INFINIBAND_PORT_ERRORS_TOTAL.name
IB_CHANGES = INFINIBAND_PORT_STATE_CHANGES_TOTAL.name
IB_UP = INFINIBAND_PORT_UP.name
IB_RATE = INFINIBAND_PORT_RATE_BYTES_PER_SECOND.name
IB_SATURATED = INFINIBAND_PORT_ERROR_SATURATED.name
NVLINK_ERRORS = NVLINK_ERRORS_TOTAL.name
FABRIC_INFO = GPU_FABRIC_INFO.name
FABRIC_DEGRADED = GPU_FABRIC_DEGRADED.name
FABRIC_STATE = GPU_FABRIC_STATE_ID.name


def _degraded(w: Window) -> str:
    """Time a port ran below the fleet's fastest port (scalar comparison: cheap per step)."""
    rate = select(w, IB_RATE)
    return time_in_state(w, f"{rate} < bool scalar(max({rate}))") + " > 0"


def _fabric_unhealthy(w: Window) -> str:
    """Seconds each GPU's NVLink fabric was degraded or not registered (state not 3)."""
    by = "max by (node,gpu,uuid)"
    unhealthy = (
        f"clamp_max({by} ({select(w, FABRIC_DEGRADED)}) + ({by} ({select(w, FABRIC_STATE)}) "
        "!= bool 3), 1)"
    )
    return f"{by} ({time_in_state(w, unhealthy)}) > 0"


FABRIC: tuple[Query, ...] = (
    Query(
        name="ib_errors",
        shape="summary",
        keys=(*PORT, "error"),
        required=(IB_ERRORS,),
        build=lambda w: f"sum by (node,device,port,error) ({growth(w, select(w, IB_ERRORS))}) > 0",
    ),
    Query(
        name="ib_state_changes",
        shape="summary",
        keys=PORT,
        required=(IB_CHANGES,),
        build=lambda w: f"sum by (node,device,port) ({window_delta(w, select(w, IB_CHANGES))}) > 0",
    ),
    Query(
        name="ib_down_seconds",
        shape="summary",
        keys=PORT,
        required=(IB_UP,),
        build=lambda w: time_in_state(w, f"{select(w, IB_UP)} == bool 0") + " > 0",
    ),
    Query(
        name="ib_degraded_seconds",
        shape="summary",
        keys=PORT,
        required=(IB_RATE,),
        build=_degraded,
        batched=False,
    ),
    Query(
        name="ib_saturated_seconds",
        shape="summary",
        keys=(*PORT, "error"),
        required=(IB_SATURATED,),
        build=lambda w: time_in_state(w, select(w, IB_SATURATED)) + " > 0",
    ),
    Query(
        name="nvlink_errors",
        shape="summary",
        keys=(*GPU, "link", "error"),
        required=(NVLINK_ERRORS,),
        build=lambda w: (
            f"sum by (node,gpu,uuid,link,error) ({growth(w, select(w, NVLINK_ERRORS))}) > 0"
        ),
    ),
    Query(
        name="domain_gpus",
        shape="summary",
        keys=(*GPU, *DOMAIN),
        required=(),
        optional=(FABRIC_INFO,),
        build=lambda w: (
            f"max by (node,gpu,uuid,cluster_uuid,clique_id) "
            f"(max_over_time({select(w, FABRIC_INFO)}[{duration(w.seconds)}]))"
        ),
    ),
    Query(
        name="fabric_unhealthy_seconds",
        shape="summary",
        keys=GPU,
        required=(),
        optional=(FABRIC_DEGRADED, FABRIC_STATE),
        build=_fabric_unhealthy,
    ),
)
