"""InfiniBand ports (the `infiniband` collector): state, rate, PMA counters, driver
hw_counters, and the udev events the collector watches.

Part of the metric catalog (`fleetwatch.catalog`): each family is declared here once and
imported by name wherever it is emitted or read."""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.spec import MetricSpec

INFINIBAND_PORT_INFO: Final = MetricSpec(
    "fleetwatch_infiniband_port_info",
    "gauge",
    "InfiniBand port attributes and PCI topology (value 1).",
    (
        "device",
        "port",
        "link_layer",
        "board_id",
        "firmware_version",
        "hca_type",
        "node_guid",
        "pci_address",
        "numa_node",
        "gpus",
    ),
    unit="info (1)",
    source=(
        "`link_layer`, device `board_id`/`fw_ver`/`hca_type`/`node_guid`; PCI tree "
        "(`numa_node`, GPUs under the same PCIe switch, NVML-order indices)"
    ),
    series="P",
)


INFINIBAND_PORT_UP: Final = MetricSpec(
    "fleetwatch_infiniband_port_up",
    "gauge",
    "1 when the port state is ACTIVE and the physical state LinkUp.",
    ("device", "port"),
    unit="0/1",
    source="`state` = 4 ACTIVE and `phys_state` = 5 LinkUp",
    series="P",
)


INFINIBAND_PORT_STATE_ID: Final = MetricSpec(
    "fleetwatch_infiniband_port_state_id",
    "gauge",
    "Port state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.",
    ("device", "port"),
    unit="state id",
    source="`state` (1 DOWN … 5 ACTIVE_DEFER)",
    series="P",
)


INFINIBAND_PORT_PHYSICAL_STATE_ID: Final = MetricSpec(
    "fleetwatch_infiniband_port_physical_state_id",
    "gauge",
    (
        "Physical port state: 1 Sleep, 2 Polling, 3 Disabled, 4 Training, 5 LinkUp, 6 "
        "LinkErrorRecovery, 7 Phy Test."
    ),
    ("device", "port"),
    unit="state id",
    source="`phys_state` (1 Sleep … 7 Phy Test)",
    series="P",
)


INFINIBAND_PORT_RATE_BYTES_PER_SECOND: Final = MetricSpec(
    "fleetwatch_infiniband_port_rate_bytes_per_second",
    "gauge",
    "Trained link rate of an active port in bytes per second.",
    ("device", "port"),
    unit="bytes/s",
    source=(
        "`rate` first number × 125,000,000, only while the port is up (`ibstat` when "
        "sysfs has no `rate`)"
    ),
    series="P",
)


INFINIBAND_PORT_EXPECTED_RATE_BYTES_PER_SECOND: Final = MetricSpec(
    "fleetwatch_infiniband_port_expected_rate_bytes_per_second",
    "gauge",
    ("Configured expected link rate in bytes per second (--collector.infiniband.expected-rate)."),
    ("device", "port"),
    unit="bytes/s",
    source=(
        "`--collector.infiniband.expected-rate` (scenario `expected_rate_gbps` under "
        "`--simulate`); absent unless configured"
    ),
    series="P",
)


INFINIBAND_PORT_DATA_BYTES_TOTAL: Final = MetricSpec(
    "fleetwatch_infiniband_port_data_bytes_total",
    "counter",
    "Data octets transferred (sysfs 4-octet words x 4).",
    ("device", "port", "direction"),
    unit="bytes",
    source="`counters/port_{xmit,rcv}_data` × 4",
    series="2P",
)


INFINIBAND_PORT_PACKETS_TOTAL: Final = MetricSpec(
    "fleetwatch_infiniband_port_packets_total",
    "counter",
    "Packets transferred.",
    ("device", "port", "direction"),
    unit="packets",
    source="`counters/port_{xmit,rcv}_packets`",
    series="2P",
)


INFINIBAND_PORT_UNICAST_PACKETS_TOTAL: Final = MetricSpec(
    "fleetwatch_infiniband_port_unicast_packets_total",
    "counter",
    "Unicast packets transferred.",
    ("device", "port", "direction"),
    unit="packets",
    source="`counters/unicast_{xmit,rcv}_packets`",
    series="2P",
)


INFINIBAND_PORT_MULTICAST_PACKETS_TOTAL: Final = MetricSpec(
    "fleetwatch_infiniband_port_multicast_packets_total",
    "counter",
    "Multicast packets transferred.",
    ("device", "port", "direction"),
    unit="packets",
    source="`counters/multicast_{xmit,rcv}_packets`",
    series="2P",
)


INFINIBAND_PORT_ERRORS_TOTAL: Final = MetricSpec(
    "fleetwatch_infiniband_port_errors_total",
    "counter",
    "PMA port error counters (64-bit extended values where perfquery can read them).",
    ("device", "port", "error"),
    unit="errors",
    source=(
        "the 12 PMA error files in `counters/`; `perfquery -x` 64-bit values replace "
        "a saturated one when CapMask2 bit 1 is set (refreshed at most every "
        "`--collector.infiniband.perfquery-interval`, 30 s, per port)"
    ),
    series="12P",
)


INFINIBAND_PORT_XMIT_WAIT_TOTAL: Final = MetricSpec(
    "fleetwatch_infiniband_port_xmit_wait_total",
    "counter",
    "Ticks the port had data to send but no flow-control credits (congestion).",
    ("device", "port"),
    unit="ticks",
    source="`counters/port_xmit_wait` (or `perfquery -x` when saturated, as above)",
    series="P",
)


INFINIBAND_PORT_ERROR_SATURATED: Final = MetricSpec(
    "fleetwatch_infiniband_port_error_saturated",
    "gauge",
    (
        "1 while the exported counter is pinned at its all-ones maximum, so its rate reads 0 "
        "however bad the link is."
    ),
    ("device", "port", "error"),
    unit="0/1",
    source=(
        "exported PMA counter at its all-ones maximum (the PMA widths: 16 bits for "
        "most error counters; 8 for `link_downed`, `link_error_recovery`, "
        "`xmit_constraint` and `rcv_constraint`; 4 for `local_link_integrity` and "
        "`excessive_buffer_overrun`; 32 for `xmit_wait`); **lean profile** "
        "(`--no-collector.infiniband.saturation-zeros`): exported only while 1"
    ),
    series="13P (lean: pinned counters only)",
)


INFINIBAND_PORT_STATE_CHANGES_TOTAL: Final = MetricSpec(
    "fleetwatch_infiniband_port_state_changes_total",
    "counter",
    (
        "Port state transitions seen between collections, plus those implied by link_downed "
        "(flaps shorter than an interval)."
    ),
    ("device", "port"),
    unit="transitions",
    source="`state` changes between collections, or 2 per `link_downed` increase when more",
    series="P",
)


INFINIBAND_PORT_HW_STAT_TOTAL: Final = MetricSpec(
    "fleetwatch_infiniband_port_hw_stat_total",
    "counter",
    'Driver hw_counters by raw name (port "" for device-level counters).',
    ("device", "port", "stat"),
    unit="driver units",
    source=(
        '`hw_counters/*` (port level; `port=""` for device level), raw names, '
        "`lifespan` excluded; read at most every "
        "`--collector.infiniband.hw-stats.interval` (30 s; the driver refreshes them "
        "from the device, on mlx5 with firmware commands, whenever a read finds its "
        "`lifespan` cache older than 10 ms), the port counters every collection; "
        "**lean profile** (`--no-collector.infiniband.hw-stats`): not exported"
    ),
    series="H·P + D (lean: 0)",
)


DEVICE_EVENTS_TOTAL: Final = MetricSpec(
    "fleetwatch_device_events_total",
    "counter",
    "udev events seen for the watched subsystems.",
    ("subsystem", "action"),
    unit="events",
    source="udev events for `infiniband`, `net`, `pci` (pyudev) since start",
    series="E",
)


INFINIBAND_SYSFS_READ_ERRORS_TOTAL: Final = MetricSpec(
    "fleetwatch_infiniband_sysfs_read_errors_total",
    "counter",
    (
        "InfiniBand sysfs values skipped for a reason a person should see (garbage, an I/O "
        "error, not a regular file); each logged once."
    ),
    (),
    unit="values",
    source=(
        "InfiniBand sysfs values skipped for a reason a person should see (garbage, "
        "an I/O error, a FIFO or other non-regular file in place of a counter file); "
        "absent until the first one; each file and reason is also logged once"
    ),
    series="1",
)


FAMILIES: Final = (
    INFINIBAND_PORT_INFO,
    INFINIBAND_PORT_UP,
    INFINIBAND_PORT_STATE_ID,
    INFINIBAND_PORT_PHYSICAL_STATE_ID,
    INFINIBAND_PORT_RATE_BYTES_PER_SECOND,
    INFINIBAND_PORT_EXPECTED_RATE_BYTES_PER_SECOND,
    INFINIBAND_PORT_DATA_BYTES_TOTAL,
    INFINIBAND_PORT_PACKETS_TOTAL,
    INFINIBAND_PORT_UNICAST_PACKETS_TOTAL,
    INFINIBAND_PORT_MULTICAST_PACKETS_TOTAL,
    INFINIBAND_PORT_ERRORS_TOTAL,
    INFINIBAND_PORT_XMIT_WAIT_TOTAL,
    INFINIBAND_PORT_ERROR_SATURATED,
    INFINIBAND_PORT_STATE_CHANGES_TOTAL,
    INFINIBAND_PORT_HW_STAT_TOTAL,
    DEVICE_EVENTS_TOTAL,
    INFINIBAND_SYSFS_READ_ERRORS_TOTAL,
)
"""Every family of this module, in the order docs/metrics.md lists them."""
