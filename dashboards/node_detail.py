"""Node detail (uid fleetwatch-node): per-GPU temperatures, clocks, power, the NVLink
matrix, the InfiniBand ports and the checkpoint mounts of the chosen nodes.
"""

from __future__ import annotations

from grafanalib.core import Dashboard, Panel

from dashboards.panel_promql import Queries
from dashboards.panels import GPU, NODE, Layout, dashboard, table, timeseries, variables
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
from fleetwatch.catalog.storage import (
    STORAGE_AVAILABLE_BYTES,
    STORAGE_HUNG,
    STORAGE_MOUNT_INFO,
    STORAGE_OPERATION_RTT_SECONDS_TOTAL,
    STORAGE_OPERATIONS_TOTAL,
    STORAGE_READ_BYTES_TOTAL,
    STORAGE_READ_ONLY,
    STORAGE_SIZE_BYTES,
    STORAGE_WRITTEN_BYTES_TOTAL,
)


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
        *storage_panels(q, lay),
    ]
    return dashboard(
        "fleetwatch-node",
        "fleetwatch / Node detail",
        "Per-GPU heat, clocks, power and the node's NVLink and InfiniBand links.",
        panels,
        variables(q.job, gpu=True),
    )


def storage_panels(q: Queries, lay: Layout) -> list[Panel]:
    """The checkpoint mounts of the chosen nodes: which, hung or read-only, throughput,
    space left and the NFS WRITE round trip."""
    written = q.exporter(STORAGE_WRITTEN_BYTES_TOTAL.name, NODE)
    read = q.exporter(STORAGE_READ_BYTES_TOTAL.name, NODE)
    write_ops = ('operation="WRITE"', NODE)
    return [
        lay.row("Checkpoint storage"),
        table(
            lay,
            "Checkpoint mounts: hung, read-only",
            (q.exporter(STORAGE_MOUNT_INFO.name, NODE), ""),
            (q.exporter(STORAGE_HUNG.name, NODE), ""),
            (q.exporter(STORAGE_READ_ONLY.name, NODE), ""),
            width=24,
            columns={"Value #A": "watched", "Value #B": "hung", "Value #C": "read-only"},
            description="Each watched mount with its filesystem and server; hung is 1 while "
            "a call on it has been blocked past the collector's deadline (CheckpointMountHung "
            "taints the node), read-only 1 after a remount (CheckpointMountReadOnly).",
        ),
        timeseries(
            lay,
            "Checkpoint mount throughput",
            (f"rate({written}[$__rate_interval])", "{{node}} {{mountpoint}} write"),
            (f"rate({read}[$__rate_interval])", "{{node}} {{mountpoint}} read"),
            unit="Bps",
            description="Bytes the client moved to and from each mount; saves are the "
            "write bursts.",
        ),
        timeseries(
            lay,
            "Checkpoint mount space available",
            (
                f"{q.exporter(STORAGE_AVAILABLE_BYTES.name, NODE)}\n/ "
                f"{q.exporter(STORAGE_SIZE_BYTES.name, NODE)}",
                "{{node}} {{mountpoint}}",
            ),
            unit="percentunit",
            max_value=1,
            description="Share of the mount a non-root writer may still fill "
            "(CheckpointStorageFillingUp warns on the trend to full).",
        ),
        timeseries(
            lay,
            "NFS WRITE round trip",
            (
                f"rate({q.exporter(STORAGE_OPERATION_RTT_SECONDS_TOTAL.name, *write_ops)}"
                "[$__rate_interval])\n/ "
                f"rate({q.exporter(STORAGE_OPERATIONS_TOTAL.name, *write_ops)}"
                "[$__rate_interval])",
                "{{node}} {{mountpoint}}",
            ),
            unit="s",
            description="Mean round trip of a WRITE call to the server: a slow server or "
            "network shows here before a save stalls.",
        ),
        timeseries(
            lay,
            "Mount hung",
            (q.exporter(STORAGE_HUNG.name, NODE), "{{node}} {{mountpoint}}"),
            unit="bool",
            max_value=1,
            description="1 while a call on the mount is blocked past the deadline.",
        ),
    ]
