"""Node detail (uid fleetwatch-node): per-GPU temperatures, clocks, power, the NVLink
matrix and the InfiniBand ports of the chosen nodes.
"""

from __future__ import annotations

from grafanalib.core import Dashboard, Panel

from dashboards.panels import GPU, NODE, Layout, dashboard, table, timeseries, variables
from dashboards.queries import Queries
from fleetwatch.catalog.gpu import (
    GPU_CLOCK_EVENT_ACTIVE,
    GPU_CLOCK_HERTZ,
    GPU_POWER_LIMIT_WATTS,
    GPU_POWER_WATTS,
    GPU_TEMPERATURE_CELSIUS,
    GPU_TENSOR_ACTIVE_RATIO,
    GPU_UTILIZATION_RATIO,
)
from fleetwatch.catalog.infiniband import (
    INFINIBAND_PORT_INFO,
    INFINIBAND_PORT_RATE_BYTES_PER_SECOND,
    INFINIBAND_PORT_UP,
)
from fleetwatch.catalog.nvlink import NVLINK_UP


def build(q: Queries) -> Dashboard:
    """Per-GPU heat, clocks and power, and the NVLink and InfiniBand links of the chosen nodes."""
    lay = Layout()
    gpu_sel = (NODE, GPU)
    panels: list[Panel] = [
        lay.row("Temperatures and clocks"),
        timeseries(
            lay,
            "GPU temperature",
            (
                q.exporter(GPU_TEMPERATURE_CELSIUS.name, 'sensor="gpu"', *gpu_sel),
                "{{node}} GPU {{gpu}}",
            ),
            unit="celsius",
            limits=[(q.gpu_limit, "red")],
            description=f"Core sensor; the line is the {q.gpu_limit:g} °C taint threshold.",
        ),
        timeseries(
            lay,
            "HBM temperature",
            (
                q.exporter(GPU_TEMPERATURE_CELSIUS.name, 'sensor="memory"', *gpu_sel),
                "{{node}} GPU {{gpu}}",
            ),
            unit="celsius",
            limits=[(q.memory_limit, "orange")],
        ),
        timeseries(
            lay,
            "SM clock",
            (
                q.exporter(GPU_CLOCK_HERTZ.name, 'clock="sm"', *gpu_sel),
                "{{node}} GPU {{gpu}}",
            ),
            unit="hertz",
        ),
        timeseries(
            lay,
            "Clock-event reasons active",
            (
                q.exporter(GPU_CLOCK_EVENT_ACTIVE.name, *gpu_sel),
                "{{node}} GPU {{gpu}} {{reason}}",
            ),
            unit="bool",
            description="1 while a reason (thermal, power) slows the clocks.",
        ),
        lay.row("Power and work"),
        timeseries(
            lay,
            "Power draw and limit",
            (q.exporter(GPU_POWER_WATTS.name, *gpu_sel), "{{node}} GPU {{gpu}}"),
            (
                q.exporter(GPU_POWER_LIMIT_WATTS.name, *gpu_sel),
                "{{node}} GPU {{gpu}} limit",
            ),
            unit="watt",
        ),
        timeseries(
            lay,
            "Tensor-core activity and utilization",
            (
                q.exporter(GPU_TENSOR_ACTIVE_RATIO.name, 'pipe="any"', *gpu_sel),
                "{{node}} GPU {{gpu}} tensor",
            ),
            (
                q.exporter(GPU_UTILIZATION_RATIO.name, *gpu_sel),
                "{{node}} GPU {{gpu}} utilization",
            ),
            unit="percentunit",
            max_value=1,
        ),
        lay.row("Interconnect"),
        table(
            lay,
            "NVLink error matrix (per s, by GPU and link)",
            (f"sum by (node, gpu, link) ({q.nvlink_rate}{{{NODE}, {GPU}}})", ""),
            description="Sum of all NVLink error types per link over the rate window.",
        ),
        table(
            lay,
            "NVLinks down",
            (f"{q.exporter(NVLINK_UP.name, *gpu_sel)} == 0", ""),
            description="Links whose state is not up (empty when all links are up).",
        ),
        table(
            lay,
            "InfiniBand ports and the GPUs they serve",
            (q.exporter(INFINIBAND_PORT_INFO.name, NODE), ""),
            (q.exporter(INFINIBAND_PORT_UP.name, NODE), ""),
            (q.exporter(INFINIBAND_PORT_RATE_BYTES_PER_SECOND.name, NODE), ""),
            width=24,
            description="Each HCA port with its NUMA node and the GPUs under the same "
            "PCIe switch, its state and trained rate.",
        ),
    ]
    return dashboard(
        "fleetwatch-node",
        "fleetwatch / Node detail",
        "Per-GPU heat, clocks, power and the node's NVLink and InfiniBand links.",
        panels,
        variables(q.job, gpu=True),
    )
