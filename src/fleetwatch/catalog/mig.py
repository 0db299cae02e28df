"""MIG instances (the `mig` collector): each GPU's MIG mode and, per MIG device, its
identity, memory and GPM activity.

Part of the metric catalog (`fleetwatch.catalog`): each family is declared here once and
imported by name wherever it is emitted or read."""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.spec import Families, Read
from fleetwatch.catalog.units import percent_to_ratio

FAMILIES: Final = Families(collectors=("mig",))
"""Every family of this module, in declaration order (the order docs/metrics.md lists them)."""

GPU_MIG_MODE: Final = FAMILIES.declare(
    "fleetwatch_gpu_mig_mode",
    "gauge",
    (
        "MIG mode of the GPU, current and pending (1 enabled, 0 disabled): a pending mode "
        "that differs from the current one takes effect at the next GPU reset."
    ),
    ("gpu", "uuid", "which"),
    unit="0/1",
    source=(
        "`nvmlDeviceGetMigMode` (current, pending), read every cycle so a GPU that switches "
        "mode while the exporter runs is followed; absent on GPUs without MIG"
    ),
    series="2G",
    label_values={
        "which": "(`current`, `pending`)",
    },
)


GPU_MIG_INFO: Final = FAMILIES.declare(
    "fleetwatch_gpu_mig_info",
    "gauge",
    (
        "MIG instance identity (value 1): the MIG device's UUID (what the device plugin and "
        "DRA allocate) joined to its parent GPU, with its GPU instance, compute instance and "
        "profile."
    ),
    ("gpu", "uuid", "mig_uuid", "gpu_instance", "compute_instance", "profile"),
    unit="info (1)",
    source=(
        "per MIG slot up to `nvmlDeviceGetMaxMigDeviceCount`: "
        "`nvmlDeviceGetMigDeviceHandleByIndex` (NotFound: empty slot), then on the MIG "
        "handle `nvmlDeviceGetUUID`, `nvmlDeviceGetGpuInstanceId`, "
        "`nvmlDeviceGetComputeInstanceId`, `nvmlDeviceGetName` (profile: the text after "
        "`MIG `); enumerated every cycle"
    ),
    series="MIG instances",
)


GPU_MIG_MEMORY_USED_BYTES: Final = FAMILIES.declare(
    "fleetwatch_gpu_mig_memory_used_bytes",
    "gauge",
    "Framebuffer memory in use on a MIG instance.",
    ("gpu", "uuid", "mig_uuid"),
    unit="bytes",
    source="`nvmlDeviceGetMemoryInfo` on the MIG device handle",
    series="MIG instances",
)


GPU_MIG_MEMORY_TOTAL_BYTES: Final = FAMILIES.declare(
    "fleetwatch_gpu_mig_memory_total_bytes",
    "gauge",
    "Framebuffer memory of a MIG instance.",
    ("gpu", "uuid", "mig_uuid"),
    unit="bytes",
    source="`nvmlDeviceGetMemoryInfo` on the MIG device handle",
    series="MIG instances",
)


GPU_MIG_TENSOR_ACTIVE_RATIO: Final = FAMILIES.declare(
    "fleetwatch_gpu_mig_tensor_active_ratio",
    "gauge",
    "Fraction of time a MIG instance's tensor cores were active since the last cycle.",
    ("gpu", "uuid", "mig_uuid"),
    unit="ratio",
    source=(
        "GPM metric 5 (`ANY_TENSOR_UTIL`) over two `nvmlGpmMigSampleGet` samples of the "
        "instance's GPU instance (Hopper+; absent on A100)"
    ),
    series="MIG instances",
    reads=(Read("tensor_any", convert=percent_to_ratio),),
)


GPU_MIG_SM_ACTIVE_RATIO: Final = FAMILIES.declare(
    "fleetwatch_gpu_mig_sm_active_ratio",
    "gauge",
    "Fraction of time a MIG instance's SMs were active since the last cycle.",
    ("gpu", "uuid", "mig_uuid"),
    unit="ratio",
    source="GPM metric 2 (`SM_UTIL`) over two `nvmlGpmMigSampleGet` samples (Hopper+)",
    series="MIG instances",
    reads=(Read("sm_active", convert=percent_to_ratio),),
)


GPU_MIG_NVML_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_gpu_mig_nvml_errors_total",
    "counter",
    (
        "NVML calls about MIG instances that failed, by GPU, call and error (a MIG handle "
        "that disappeared between enumeration and use counts here); the failed instance is "
        "absent while the others keep reporting."
    ),
    ("gpu", "uuid", "call", "error"),
    unit="calls",
    source=(
        "MIG calls of the `mig` collector that failed other than NotSupported (and other "
        "than NotFound for an empty slot)"
    ),
    series="G × MIG calls × errors seen",
)
