"""GPM activity collector: tensor-core, SM and DRAM activity, NVLink throughput (Hopper+).

NVML's GPU Performance Monitoring computes metrics from two samples taken some time
apart. The collector keeps the previous sample of each GPU between cycles, computes the
metrics from (previous, current) and keeps the current one, so each cycle reports the
activity since the last cycle; the previous one's buffer takes the next cycle's sample (two
buffers a GPU, alternating, not one allocated and one freed every cycle). A GPU's buffers
are freed when it is lost or no longer listed, and at close. The first cycle only takes
the first sample: its families appear from the second cycle on.

A GPU without GPM (A100 and older) has none of these families; that is logged once with
the way to get tensor activity there (DCGM profiling). While another tool (Nsight, DCGM
profiling) holds the profiling counters, sampling fails: the collector raises, so the
engine reports it down with the reason, and it starts over with a fresh pair when the
counters are free again.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from fleetwatch.catalog import collected_by
from fleetwatch.collectors.base import CollectorContext, CollectorSpec, NoSettings
from fleetwatch.collectors.families import FamilyBuilder, LabelCache, SeriesFamily, reads_of
from fleetwatch.collectors.gpu_common import GPU_ID, LostGpus, gpu_labels
from fleetwatch.collectors.sources.nvml import Gpu, NvmlSource
from fleetwatch.collectors.sources.nvml_calls import GpuLostError, NvmlError
from fleetwatch.collectors.sources.nvml_gpm import (
    GPM_METRICS,
    GpmRequest,
    gpm_free,
    gpm_sample,
    gpm_supported,
)

log = logging.getLogger(__name__)

SPECS: Final = collected_by("gpm")
# (GPM metric id, family, where the catalog says it is read), per GPU.
_METRICS: Final = tuple(
    (GPM_METRICS[read.field], family, read)
    for family, read in reads_of(SPECS, available=GPM_METRICS, identity=len(GPU_ID))
)
_METRIC_IDS: Final = tuple(entry[0] for entry in _METRICS)


class GpmCollector:
    """Activity from pairs of GPM samples, one pair per GPU per cycle."""

    def __init__(self, *, source: NvmlSource) -> None:
        self._source = source
        self._previous: dict[int, Any] = {}
        self._spare: dict[int, Any] = {}  # a buffer per GPU for its next sample
        self._request: GpmRequest | None = None
        self._supported: dict[int, bool] = {}
        self._lost = LostGpus(collector="gpm")
        self._labels = LabelCache(SPECS)

    def _has_gpm(self, gpu: Gpu) -> bool:
        supported = self._supported.get(gpu.index)
        if supported is None:
            supported = self._supported[gpu.index] = gpm_supported(self._source, gpu)
            if not supported:
                log.info(
                    "GPU has no GPM (A100 or older, or an old driver): no tensor-core activity "
                    "from NVML; use DCGM profiling (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE) there",
                    extra={"gpu": gpu.index, "model": gpu.identity.name},
                )
        return supported

    def collect(self) -> list[SeriesFamily]:
        builder = FamilyBuilder(self._labels)
        gpus = self._source.gpus()
        listed = {gpu.index for gpu in gpus}
        for gone in [index for index in self._previous.keys() | self._spare if index not in listed]:
            self._forget(gone)
        for gpu in gpus:
            try:
                if self._has_gpm(gpu):
                    self._collect_gpu(builder, gpu)
            except GpuLostError:
                self._forget(gpu.index)
                self._lost.lost(gpu.identity)
            except NvmlError as exc:
                self.close()
                raise RuntimeError(
                    f"GPM sampling failed on GPU {gpu.index} ({exc.call}: {exc.error}): another "
                    "tool (Nsight, DCGM profiling) may hold the profiling counters"
                ) from exc
        return builder.families()

    def _collect_gpu(self, builder: FamilyBuilder, gpu: Gpu) -> None:
        current = gpm_sample(self._source, gpu, into=self._spare.pop(gpu.index, None))
        self._lost.seen(gpu.identity)
        previous = self._previous.pop(gpu.index, None)
        self._previous[gpu.index] = current
        if previous is None:
            return
        self._spare[gpu.index] = previous  # the next cycle's sample goes there
        if self._request is None:
            self._request = GpmRequest(self._source, _METRIC_IDS)
        values = self._request.metrics(previous, current)
        ids = gpu_labels(gpu.identity)
        for metric_id, family, read in _METRICS:
            builder.add(family, (*ids, *read.labels), read.value(values.get(metric_id)))

    def _forget(self, gpu: int) -> None:
        """Free the GPU's kept sample and spare buffer."""
        for kept in (self._previous, self._spare):
            sample = kept.pop(gpu, None)
            if sample is None:
                continue
            try:
                gpm_free(self._source, sample)
            except NvmlError as exc:  # a lost GPU's sample may not free; it is gone
                log.debug("GPM sample not freed", extra={"gpu": gpu, "reason": exc.error})

    def close(self) -> None:
        """Free every kept sample (also after a failure, so the next run starts a new pair)."""
        for gpu in list(self._previous.keys() | self._spare):
            self._forget(gpu)


def _create(context: CollectorContext, _settings: NoSettings) -> GpmCollector:
    return GpmCollector(source=context.nvml_source)


SPEC = CollectorSpec(
    name="gpm",
    settings=NoSettings,
    help="tensor-core, SM and DRAM activity and NVLink throughput from NVML GPM (Hopper+)",
    create=_create,
    metrics=SPECS,
)
