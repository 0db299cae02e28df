"""Node detail (uid fleetwatch-node): per-GPU temperatures, clocks, power, the NVLink
matrix and the InfiniBand ports of the chosen nodes.
"""

from __future__ import annotations

from grafanalib.core import Dashboard, Panel

from dashboards.panels import GPU, NODE, Layout, dashboard, table, timeseries, variables
from dashboards.queries import Queries


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
                q.exporter("fleetwatch_gpu_temperature_celsius", 'sensor="gpu"', *gpu_sel),
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
                q.exporter("fleetwatch_gpu_temperature_celsius", 'sensor="memory"', *gpu_sel),
                "{{node}} GPU {{gpu}}",
            ),
            unit="celsius",
            limits=[(q.memory_limit, "orange")],
        ),
        timeseries(
            lay,
            "SM clock",
            (
                q.exporter("fleetwatch_gpu_clock_hertz", 'clock="sm"', *gpu_sel),
                "{{node}} GPU {{gpu}}",
            ),
            unit="hertz",
        ),
        timeseries(
            lay,
            "Clock-event reasons active",
            (
                q.exporter("fleetwatch_gpu_clock_event_active", *gpu_sel),
                "{{node}} GPU {{gpu}} {{reason}}",
            ),
            unit="bool",
            description="1 while a reason (thermal, power) slows the clocks.",
        ),
        lay.row("Power and work"),
        timeseries(
            lay,
            "Power draw and limit",
            (q.exporter("fleetwatch_gpu_power_watts", *gpu_sel), "{{node}} GPU {{gpu}}"),
            (
                q.exporter("fleetwatch_gpu_power_limit_watts", *gpu_sel),
                "{{node}} GPU {{gpu}} limit",
            ),
            unit="watt",
        ),
        timeseries(
            lay,
            "Tensor-core activity and utilization",
            (
                q.exporter("fleetwatch_gpu_tensor_active_ratio", 'pipe="any"', *gpu_sel),
                "{{node}} GPU {{gpu}} tensor",
            ),
            (
                q.exporter("fleetwatch_gpu_utilization_ratio", *gpu_sel),
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
            (f"{q.exporter('fleetwatch_nvlink_up', *gpu_sel)} == 0", ""),
            description="Links whose state is not up (empty when all links are up).",
        ),
        table(
            lay,
            "InfiniBand ports and the GPUs they serve",
            (q.exporter("fleetwatch_infiniband_port_info", NODE), ""),
            (q.exporter("fleetwatch_infiniband_port_up", NODE), ""),
            (q.exporter("fleetwatch_infiniband_port_rate_bytes_per_second", NODE), ""),
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
