"""Names of the metric families that more than one part of fleetwatch reads: the metric
contract, written once.

The collectors (`fleetwatch.collectors.gpu`, `pci`, `nvlink`, `infiniband`, `xid`,
`podresources`) declare their families with these names and the report
(`fleetwatch.report.queries`) queries them, so neither keeps its own copy. This is a
neutral module: the report imports no collector.
"""

from typing import Final

INFO: Final = "fleetwatch_gpu_info"
COUNT: Final = "fleetwatch_gpus_visible"
EXPECTED: Final = "fleetwatch_gpus_expected"
PCI_PRESENT: Final = "fleetwatch_gpus_pci_present"
PCI_INFO: Final = "fleetwatch_gpu_pci_info"
TEMPERATURE: Final = "fleetwatch_gpu_temperature_celsius"
THRESHOLD: Final = "fleetwatch_gpu_temperature_threshold_celsius"
UTILIZATION: Final = "fleetwatch_gpu_utilization_ratio"
POWER: Final = "fleetwatch_gpu_power_watts"
CLOCK: Final = "fleetwatch_gpu_clock_hertz"
CLOCK_EVENT_ACTIVE: Final = "fleetwatch_gpu_clock_event_active"
CLOCK_EVENT_SECONDS: Final = "fleetwatch_gpu_clock_event_seconds_total"
ECC_ERRORS: Final = "fleetwatch_gpu_ecc_errors_total"
REMAPPED_ROWS: Final = "fleetwatch_gpu_remapped_rows"
ROW_REMAP_FAILED: Final = "fleetwatch_gpu_row_remap_failed"
RECOVERY: Final = "fleetwatch_gpu_recovery_action"
FABRIC_INFO: Final = "fleetwatch_gpu_fabric_info"
FABRIC_STATE: Final = "fleetwatch_gpu_fabric_state_id"
FABRIC_DEGRADED: Final = "fleetwatch_gpu_fabric_degraded"

# Pod attribution (collectors/podresources.py).
ALLOCATION_INFO: Final = "fleetwatch_gpu_allocation_info"
# Xid events (collectors/xid.py).
XID_ERRORS: Final = "fleetwatch_gpu_xid_errors_total"
# NVLink (collectors/nvlink.py).
NVLINK_ERRORS: Final = "fleetwatch_nvlink_errors_total"
# InfiniBand (collectors/infiniband_layout.py).
IB_PORT_UP: Final = "fleetwatch_infiniband_port_up"
IB_PORT_RATE: Final = "fleetwatch_infiniband_port_rate_bytes_per_second"
IB_PORT_ERRORS: Final = "fleetwatch_infiniband_port_errors_total"
IB_PORT_ERROR_SATURATED: Final = "fleetwatch_infiniband_port_error_saturated"
IB_PORT_STATE_CHANGES: Final = "fleetwatch_infiniband_port_state_changes_total"
