"""Names of the GPU families the report and rules read: the metric contract, written once.

The collectors (`fleetwatch.collectors.gpu`, `fleetwatch.collectors.pci`) declare their
families with these names and the report (`fleetwatch.report.dataset`) and rules query
them, so none keeps its own copy. This is a neutral module: the report imports no collector.
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
