"""Per-GPU families of the `gpu` collector (NVML) and the `gpm` collector (GPU Performance
Monitoring, Hopper and later); MIG instances have their own module (`mig`).

Part of the metric catalog (`fleetwatch.catalog`): each family is declared here once and
imported by name wherever it is emitted or read."""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.spec import Families, Read
from fleetwatch.catalog.units import (
    megahertz_to_hertz,
    millijoules_to_joules,
    milliwatts_to_watts,
    percent_to_ratio,
)

FAMILIES: Final = Families(collectors=("gpu",))
"""Every family of this module, in declaration order (the order docs/metrics.md lists them)."""

GPU_INFO: Final = FAMILIES.declare(
    "fleetwatch_gpu_info",
    "gauge",
    "GPU identity (value 1): join on gpu/uuid with group_left for name, PCI bus, serial.",
    ("gpu", "uuid", "name", "pci_bus_id", "serial", "driver_version"),
    unit="info (1)",
    source=(
        "`nvmlDeviceGetName/UUID/Serial/PciInfo`, `nvmlSystemGetDriverVersion` (once at start)"
    ),
    series="G",
)


GPUS_VISIBLE: Final = FAMILIES.declare(
    "fleetwatch_gpus_visible",
    "gauge",
    "GPUs visible to NVML now (a lost GPU is not counted).",
    (),
    unit="GPUs",
    source=(
        "GPUs that answered NVML this cycle (lost GPUs not counted); absent without a "
        "driver unless an expected count is set"
    ),
    series="1",
)


GPUS_EXPECTED: Final = FAMILIES.declare(
    "fleetwatch_gpus_expected",
    "gauge",
    "GPUs this node should have (--collector.gpu.expected-count).",
    (),
    unit="GPUs",
    source="`--collector.gpu.expected-count` (absent when not set)",
    series="1",
)


GPU_TEMPERATURE_CELSIUS: Final = FAMILIES.declare(
    "fleetwatch_gpu_temperature_celsius",
    "gauge",
    "GPU die (sensor=gpu) and HBM (sensor=memory) temperature.",
    ("gpu", "uuid", "sensor"),
    unit="°C",
    source=(
        "`nvmlDeviceGetTemperatureV` (fallback `nvmlDeviceGetTemperature`); HBM: "
        "field 82 `NVML_FI_DEV_MEMORY_TEMP`"
    ),
    series="2G",
    reads=(
        Read("temperature_celsius", ("gpu",)),
        Read("memory_temperature_celsius", ("memory",)),
    ),
)


GPU_TEMPERATURE_THRESHOLD_CELSIUS: Final = FAMILIES.declare(
    "fleetwatch_gpu_temperature_threshold_celsius",
    "gauge",
    "Temperature thresholds the GPU enforces (slowdown, shutdown, gpu_max, memory_max).",
    ("gpu", "uuid", "threshold"),
    unit="°C",
    source="`nvmlDeviceGetTemperatureThreshold`",
    series="4G",
    label_values={
        "threshold": "(`slowdown`, `shutdown`, `gpu_max`, `memory_max`)",
    },
)


GPU_TEMPERATURE_MARGIN_CELSIUS: Final = FAMILIES.declare(
    "fleetwatch_gpu_temperature_margin_celsius",
    "gauge",
    (
        "How far the GPU is below its slowdown limit (nvidia-smi's T.Limit): what newer GPUs "
        "(Blackwell) are judged by, rather than an absolute reading."
    ),
    ("gpu", "uuid"),
    unit="°C",
    source=(
        "`nvmlDeviceGetMarginTemperature` (`nvmlMarginTemperature_v1`) where the driver "
        "reports it; otherwise the slowdown threshold "
        "(`nvmlDeviceGetTemperatureThreshold`, `NVML_TEMPERATURE_THRESHOLD_SLOWDOWN`) minus "
        "the GPU temperature; absent when neither is known. Negative: past the limit"
    ),
    series="G",
    reads=(Read("margin_celsius"),),
)


GPU_TENSOR_ACTIVE_RATIO: Final = FAMILIES.declare(
    "fleetwatch_gpu_tensor_active_ratio",
    "gauge",
    (
        "Fraction of time tensor cores were active (pipe=any, or one of hmma, imma, dfma, "
        "dmma) since the last cycle: the figure that says whether training is busy."
    ),
    ("gpu", "uuid", "pipe"),
    unit="ratio",
    source=(
        "GPM metrics 5, 7, 9, 6, 8 over the interval since the last cycle (Hopper+; "
        "absent on A100, use DCGM profiling there)"
    ),
    series="5G",
    collectors=("gpm",),
    reads=(
        Read("tensor_any", ("any",), percent_to_ratio),
        Read("tensor_hmma", ("hmma",), percent_to_ratio),
        Read("tensor_imma", ("imma",), percent_to_ratio),
        Read("tensor_dfma", ("dfma",), percent_to_ratio),
        Read("tensor_dmma", ("dmma",), percent_to_ratio),
    ),
)


GPU_SM_ACTIVE_RATIO: Final = FAMILIES.declare(
    "fleetwatch_gpu_sm_active_ratio",
    "gauge",
    "Fraction of SMs busy.",
    ("gpu", "uuid"),
    unit="ratio",
    source="GPM metric 2 `SM_UTIL`",
    series="G",
    collectors=("gpm",),
    reads=(Read("sm_active", convert=percent_to_ratio),),
)


GPU_SM_OCCUPANCY_RATIO: Final = FAMILIES.declare(
    "fleetwatch_gpu_sm_occupancy_ratio",
    "gauge",
    "Resident warps as a fraction of the SMs' maximum.",
    ("gpu", "uuid"),
    unit="ratio",
    source="GPM metric 3 `SM_OCCUPANCY`",
    series="G",
    collectors=("gpm",),
    reads=(Read("sm_occupancy", convert=percent_to_ratio),),
)


GPU_DRAM_ACTIVE_RATIO: Final = FAMILIES.declare(
    "fleetwatch_gpu_dram_active_ratio",
    "gauge",
    "DRAM bandwidth used as a fraction of the maximum.",
    ("gpu", "uuid"),
    unit="ratio",
    source="GPM metric 10 `DRAM_BW_UTIL`",
    series="G",
    collectors=("gpm",),
    reads=(Read("dram_active", convert=percent_to_ratio),),
)


GPU_UTILIZATION_RATIO: Final = FAMILIES.declare(
    "fleetwatch_gpu_utilization_ratio",
    "gauge",
    (
        "NVML 'GPU utilization': fraction of time at least one kernel ran. Misleading: a GPU "
        f"running one tiny kernel reads 1.0; use {GPU_TENSOR_ACTIVE_RATIO}."
    ),
    ("gpu", "uuid"),
    unit="ratio",
    source=(
        "`nvmlDeviceGetUtilizationRates().gpu`. **Misleading**: the fraction of time "
        "at least one kernel ran, so one tiny kernel reads 1.0 while the tensor cores "
        f"idle; use `{GPU_TENSOR_ACTIVE_RATIO}` to judge load"
    ),
    series="G",
    reads=(Read("utilization_percent", convert=percent_to_ratio),),
)


GPU_POWER_WATTS: Final = FAMILIES.declare(
    "fleetwatch_gpu_power_watts",
    "gauge",
    "Power draw.",
    ("gpu", "uuid"),
    unit="W",
    source="`nvmlDeviceGetPowerUsage` (mW)",
    series="G",
    reads=(Read("power_milliwatts", convert=milliwatts_to_watts),),
)


GPU_POWER_LIMIT_WATTS: Final = FAMILIES.declare(
    "fleetwatch_gpu_power_limit_watts",
    "gauge",
    "Enforced power limit.",
    ("gpu", "uuid"),
    unit="W",
    source="`nvmlDeviceGetEnforcedPowerLimit` (mW)",
    series="G",
    reads=(Read("power_limit_milliwatts", convert=milliwatts_to_watts),),
)


GPU_ENERGY_JOULES_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_gpu_energy_joules_total",
    "counter",
    "Energy consumed since the driver loaded.",
    ("gpu", "uuid"),
    unit="J",
    source="`nvmlDeviceGetTotalEnergyConsumption` (mJ), once every "
    "`--collector.gpu.energy-interval` (30 s; the last value between)",
    series="G",
    reads=(Read("energy_millijoules", convert=millijoules_to_joules),),
)


GPU_CLOCK_HERTZ: Final = FAMILIES.declare(
    "fleetwatch_gpu_clock_hertz",
    "gauge",
    "Current SM and memory clocks.",
    ("gpu", "uuid", "clock"),
    unit="Hz",
    source="`nvmlDeviceGetClockInfo` (MHz)",
    series="2G",
    reads=(
        Read("sm_clock_mhz", ("sm",), megahertz_to_hertz),
        Read("memory_clock_mhz", ("memory",), megahertz_to_hertz),
    ),
)


GPU_CLOCK_EVENT_ACTIVE: Final = FAMILIES.declare(
    "fleetwatch_gpu_clock_event_active",
    "gauge",
    "1 while the clock-event (throttle) reason holds the clocks down, else 0.",
    ("gpu", "uuid", "reason"),
    unit="0/1",
    source="`nvmlDeviceGetCurrentClocksEventReasons` bits, one-hot",
    series="7G",
    label_values={
        "reason": (
            "(`gpu_idle`, `sw_power_cap`, `hw_slowdown`, `sync_boost`, "
            "`sw_thermal_slowdown`, `hw_thermal_slowdown`, `hw_power_brake`)"
        ),
    },
)


GPU_CLOCK_EVENT_SECONDS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_gpu_clock_event_seconds_total",
    "counter",
    "Cumulative time clocks were held down by the reason (violation time).",
    ("gpu", "uuid", "reason"),
    unit="s",
    source="violation-time fields 74, 269, 270, 271 (ns)",
    series="4G",
    label_values={
        "reason": (
            "(`sw_power_cap`, `sw_thermal_slowdown`, `hw_thermal_slowdown`, `hw_power_brake`)"
        ),
    },
)


GPU_MEMORY_USED_BYTES: Final = FAMILIES.declare(
    "fleetwatch_gpu_memory_used_bytes",
    "gauge",
    "Frame buffer memory in use.",
    ("gpu", "uuid"),
    unit="bytes",
    source="`nvmlDeviceGetMemoryInfo().used`",
    series="G",
    reads=(Read("memory_used_bytes"),),
)


GPU_MEMORY_TOTAL_BYTES: Final = FAMILIES.declare(
    "fleetwatch_gpu_memory_total_bytes",
    "gauge",
    "Frame buffer memory size.",
    ("gpu", "uuid"),
    unit="bytes",
    source="`nvmlDeviceGetMemoryInfo().total`",
    series="G",
    reads=(Read("memory_total_bytes"),),
)


GPU_ECC_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_gpu_ecc_errors_total",
    "counter",
    "ECC errors over the GPU's life (aggregate counters) by severity.",
    ("gpu", "uuid", "severity"),
    unit="errors",
    source="`nvmlDeviceGetTotalEccErrors(..., NVML_AGGREGATE_ECC)`",
    series="2G",
    reads=(
        Read("ecc_corrected", ("corrected",)),
        Read("ecc_uncorrected", ("uncorrected",)),
    ),
)


GPU_REMAPPED_ROWS: Final = FAMILIES.declare(
    "fleetwatch_gpu_remapped_rows",
    "gauge",
    "HBM rows remapped, by the cause of the remap.",
    ("gpu", "uuid", "cause"),
    unit="rows",
    source="`nvmlDeviceGetRemappedRows`",
    series="2G",
    reads=(
        Read("remapped_rows_correctable", ("correctable",)),
        Read("remapped_rows_uncorrectable", ("uncorrectable",)),
    ),
)


GPU_ROW_REMAP_PENDING: Final = FAMILIES.declare(
    "fleetwatch_gpu_row_remap_pending",
    "gauge",
    "1 when a row remap waits for a GPU reset.",
    ("gpu", "uuid"),
    unit="0/1",
    source="`nvmlDeviceGetRemappedRows` (pending)",
    series="G",
    reads=(Read("remap_pending"),),
)


GPU_ROW_REMAP_FAILED: Final = FAMILIES.declare(
    "fleetwatch_gpu_row_remap_failed",
    "gauge",
    "1 when a row remap failed.",
    ("gpu", "uuid"),
    unit="0/1",
    source="`nvmlDeviceGetRemappedRows` (failure)",
    series="G",
    reads=(Read("remap_failed"),),
)


GPU_RECOVERY_ACTION: Final = FAMILIES.declare(
    "fleetwatch_gpu_recovery_action",
    "gauge",
    (
        "1 for the recovery action the driver asks for (none, gpu_reset, node_reboot, "
        "drain_p2p, drain_and_reset), 0 for the others."
    ),
    ("gpu", "uuid", "action"),
    unit="0/1",
    source="field 230 `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, one-hot",
    series="5G",
    label_values={
        "action": "(`none`, `gpu_reset`, `node_reboot`, `drain_p2p`, `drain_and_reset`)",
    },
)


GPU_PCIE_REPLAYS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_gpu_pcie_replays_total",
    "counter",
    "PCIe replay events.",
    ("gpu", "uuid"),
    unit="replays",
    source="`nvmlDeviceGetPcieReplayCounter`",
    series="G",
    reads=(Read("pcie_replays"),),
)


GPU_PCIE_LINK_GENERATION: Final = FAMILIES.declare(
    "fleetwatch_gpu_pcie_link_generation",
    "gauge",
    "PCIe link generation, current and maximum.",
    ("gpu", "uuid", "which"),
    unit="generation",
    source="`nvmlDeviceGetCurrPcieLinkGeneration`, `nvmlDeviceGetMaxPcieLinkGeneration`",
    series="2G",
    reads=(
        Read("pcie_generation_current", ("current",)),
        Read("pcie_generation_max", ("max",)),
    ),
)


GPU_PCIE_LINK_WIDTH: Final = FAMILIES.declare(
    "fleetwatch_gpu_pcie_link_width",
    "gauge",
    "PCIe link width in lanes, current and maximum.",
    ("gpu", "uuid", "which"),
    unit="lanes",
    source="`nvmlDeviceGetCurrPcieLinkWidth`, `nvmlDeviceGetMaxPcieLinkWidth`",
    series="2G",
    reads=(
        Read("pcie_width_current", ("current",)),
        Read("pcie_width_max", ("max",)),
    ),
)


GPU_FABRIC_INFO: Final = FAMILIES.declare(
    "fleetwatch_gpu_fabric_info",
    "gauge",
    (
        "NVLink-fabric identity (value 1): the NVLink domain (cluster_uuid) and partition "
        "(clique_id) of a GPU on an NVLink-switch system (GB200/GB300 NVL72)."
    ),
    ("gpu", "uuid", "cluster_uuid", "clique_id"),
    unit="info (1)",
    source=(
        "`nvmlDeviceGetGpuFabricInfoV` (`nvmlGpuFabricInfo_v2`: `clusterUuid`, "
        "`cliqueId`); only where an NVSwitch fabric joins the GPUs (HGX/DGX H100, "
        "H200, B200 with NVSwitch; GB200/GB300 NVL72): absent where the call answers "
        "NotSupported or the state is `NOT_SUPPORTED` (then never asked again)"
    ),
    series="G",
)


GPU_FABRIC_STATE_ID: Final = FAMILIES.declare(
    "fleetwatch_gpu_fabric_state_id",
    "gauge",
    "NVLink-fabric registration state: 1 not started, 2 in progress, 3 completed.",
    ("gpu", "uuid"),
    unit="state",
    source=(
        "`nvmlDeviceGetGpuFabricInfoV` `state`: 1 not started, 2 in progress, 3 "
        "completed (absent as above)"
    ),
    series="G",
)


GPU_FABRIC_DEGRADED: Final = FAMILIES.declare(
    "fleetwatch_gpu_fabric_degraded",
    "gauge",
    (
        "1 when the fabric registration failed or the fabric health mask reports degraded "
        "bandwidth or an unhealthy route, else 0."
    ),
    ("gpu", "uuid"),
    unit="0/1",
    source=(
        "`nvmlDeviceGetGpuFabricInfoV`: 1 when the state is completed with an error "
        "`status`, or the `healthMask` reports "
        "`NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE` or `..._ROUTE_UNHEALTHY_TRUE` "
        "(absent as above)"
    ),
    series="G",
)


GPU_NVML_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_gpu_nvml_errors_total",
    "counter",
    (
        "NVML calls that failed (timeout, unknown error) by GPU, call and error; the values "
        "those calls would have given are absent while the rest keeps reporting."
    ),
    ("gpu", "uuid", "call", "error"),
    unit="calls",
    source=(
        "NVML calls of the `gpu` collector that failed other than NotSupported "
        "(Timeout, Unknown, ...)"
    ),
    series="G × 26 calls × errors seen",
)
