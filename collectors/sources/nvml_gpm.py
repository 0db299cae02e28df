"""GPM (GPU Performance Monitoring, Hopper and newer) through the NVML source.

NVML computes GPM metrics from two samples taken some time apart: a collector takes a
sample per GPU (or per GPU instance in MIG mode) each cycle and asks for the metrics over the
previous and the current one. A sample's buffer may be taken again (`gpm_sample(into=...)`),
so a collector can keep two a GPU and alternate them, as NVIDIA's own GPM samples do, rather
than allocate and free one every cycle. Values are in NVML's units (percent;
MiB/s for NVLink throughput), keyed by `GPM_METRICS`, whose keys the catalog's declarations
name (`Read("tensor_any", ...)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import pynvml

from fleetwatch.collectors.sources.nvml import Gpu, NvmlSource
from fleetwatch.collectors.sources.nvml_calls import ABSENT, classified

# GPM metrics the activity collector asks for, by what they measure (percent; MiB/s for
# NVLink throughput).
GPM_METRICS: Final = {
    "tensor_any": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "tensor_hmma": pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
    "tensor_imma": pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL,
    "tensor_dfma": pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL,
    "tensor_dmma": pynvml.NVML_GPM_METRIC_DMMA_TENSOR_UTIL,
    "sm_active": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "dram_active": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
    "nvlink_rx": pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
    "nvlink_tx": pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
}


def gpm_supported(source: NvmlSource, gpu: Gpu) -> bool:
    """True when the GPU has GPM; NotSupported/FunctionNotFound (older drivers) → False."""
    with classified("nvmlGpmQueryDeviceSupport", gpu=gpu.index):
        try:
            return bool(source.lib.nvmlGpmQueryDeviceSupport(gpu.handle).isSupportedDevice)
        except ABSENT:
            return False


def gpm_sample(
    source: NvmlSource, gpu: Gpu, gpu_instance: int | None = None, *, into: Any = None
) -> Any:
    """A GPM sample of the GPU, or of one of its GPU instances in MIG mode
    (`nvmlGpmMigSampleGet`), taken into `into` (a sample no longer needed) or into a new
    one; free it with `gpm_free`.

    Raises `GpuLostError`, or `NvmlError` when sampling fails (another tool holds the
    profiling counters: `InUse`); the sample, new or given, is freed then.
    """
    sample = into
    if sample is None:
        with classified("nvmlGpmSampleAlloc", gpu=gpu.index):
            sample = source.lib.nvmlGpmSampleAlloc()
    try:
        if gpu_instance is None:
            with classified("nvmlGpmSampleGet", gpu=gpu.index):
                source.lib.nvmlGpmSampleGet(gpu.handle, sample)
        else:
            with classified("nvmlGpmMigSampleGet", gpu=gpu.index):
                source.lib.nvmlGpmMigSampleGet(gpu.handle, gpu_instance, sample)
    except BaseException:
        source.lib.nvmlGpmSampleFree(sample)
        raise
    return sample


def gpm_free(source: NvmlSource, sample: Any) -> None:
    """Free a GPM sample; `NvmlError` when NVML refuses (a lost GPU's sample may)."""
    with classified("nvmlGpmSampleFree"):
        source.lib.nvmlGpmSampleFree(sample)


def gpm_metrics(
    source: NvmlSource, first: Any, second: Any, metric_ids: Sequence[int]
) -> dict[int, float | None]:
    """GPM metrics over two samples, in NVML units (percent, MiB/s); None per failed id.

    `NvmlError` when the whole request fails.
    """
    return GpmRequest(source, metric_ids).metrics(first, second)


class GpmRequest:
    """One `nvmlGpmMetricsGet` request for a fixed list of metric ids, made once and asked
    again with each pair of samples: pynvml's structure writes each field through a Python
    `__setattr__`, 2 + 1 a metric every time a request is built. One thread at a time."""

    def __init__(self, source: NvmlSource, metric_ids: Sequence[int]) -> None:
        self._source = source
        self._ids = tuple(metric_ids)
        request = source.lib.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self._ids)
        for position, metric_id in enumerate(self._ids):
            request.metrics[position].metricId = metric_id
        self._request = request

    def metrics(self, first: Any, second: Any) -> dict[int, float | None]:
        """The metrics over (`first`, `second`), as `gpm_metrics` answers them."""
        request = self._request
        request.sample1 = first
        request.sample2 = second
        with classified("nvmlGpmMetricsGet"):
            result = self._source.lib.nvmlGpmMetricsGet(request)
        values: dict[int, float | None] = {}
        answered = result.metrics
        for position, metric_id in enumerate(self._ids):
            metric = answered[position]
            ok = metric.nvmlReturn == pynvml.NVML_SUCCESS
            values[metric_id] = float(metric.value) if ok else None
        return values
