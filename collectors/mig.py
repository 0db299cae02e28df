"""MIG collector: each GPU's MIG mode and, in MIG mode, every MIG instance.

Per instance: its identity (`fleetwatch_gpu_mig_info`: MIG UUID, parent GPU, GPU instance,
compute instance, profile) that joins a device-plugin or DRA allocation by MIG UUID to its
GPU, its memory, and on Hopper and newer its tensor-core and SM activity from GPM samples
of its GPU instance (`nvmlGpmMigSampleGet`), a pair per instance per cycle as the `gpm`
collector does for whole GPUs.

Instances are enumerated every cycle: a GPU that switches MIG mode while the exporter runs
(the mode takes effect at a GPU reset) shows its new instances, or none, the next cycle;
kept GPM samples of instances that are gone are freed. A MIG call that fails (a MIG handle
that disappeared between enumeration and use) leaves that instance out, is counted in
`fleetwatch_gpu_mig_nvml_errors_total` and logged once naming the GPU, slot, call and
error; the GPU's other instances are still exported.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from fleetwatch.catalog import collected_by
from fleetwatch.catalog.mig import (
    GPU_MIG_INFO,
    GPU_MIG_MEMORY_TOTAL_BYTES,
    GPU_MIG_MEMORY_USED_BYTES,
    GPU_MIG_MODE,
    GPU_MIG_NVML_ERRORS_TOTAL,
)
from fleetwatch.collectors.base import CollectorContext, CollectorSpec, NoSettings
from fleetwatch.collectors.families import FamilyBuilder, LabelCache, SeriesFamily, reads_of
from fleetwatch.collectors.gpu_common import GPU_ID, LostGpus, NvmlFailures, gpu_labels
from fleetwatch.collectors.sources.nvml import Gpu, NvmlSource
from fleetwatch.collectors.sources.nvml_calls import GpuLostError, NvmlError
from fleetwatch.collectors.sources.nvml_gpm import (
    GPM_METRICS,
    gpm_free,
    gpm_metrics,
    gpm_sample,
    gpm_supported,
)
from fleetwatch.collectors.sources.nvml_mig import MigInstance, read_mig

log = logging.getLogger(__name__)

SPECS: Final = collected_by("mig")
# (GPM metric id, family, where the catalog says it is read), per MIG instance (whose
# identity adds `mig_uuid` to the GPU's).
_GPM: Final = tuple(
    (GPM_METRICS[read.field], family, read)
    for family, read in reads_of(SPECS, available=GPM_METRICS, identity=len(GPU_ID) + 1)
)
_GPM_IDS: Final = tuple(metric for metric, _family, _read in _GPM)

# A kept GPM sample: (GPU index, GPU instance id).
_SampleKey = tuple[int, int]


class MigCollector:
    """MIG mode and instances of every GPU, through the shared NVML source."""

    def __init__(self, *, source: NvmlSource) -> None:
        self._source = source
        self._failures = NvmlFailures(collector="mig", spec=GPU_MIG_NVML_ERRORS_TOTAL)
        self._lost = LostGpus(collector="mig")
        self._labels = LabelCache(SPECS)
        self._gpm: dict[int, bool] = {}
        self._previous: dict[_SampleKey, Any] = {}

    def collect(self) -> list[SeriesFamily]:
        builder = FamilyBuilder(self._labels)
        sampled: set[_SampleKey] = set()
        for gpu in self._source.gpus():
            try:
                self._collect_gpu(builder, gpu, sampled)
            except GpuLostError:
                self._lost.lost(gpu.identity)
        for key in set(self._previous) - sampled:  # instances gone, GPUs lost or re-moded
            self._free(self._previous.pop(key))
        self._failures.add_to(builder)
        return builder.families()

    def _collect_gpu(self, builder: FamilyBuilder, gpu: Gpu, sampled: set[_SampleKey]) -> None:
        reading = read_mig(self._source, gpu)
        self._lost.seen(gpu.identity)
        ids = gpu_labels(gpu.identity)
        for failure in reading.failures:
            where = {} if failure.slot is None else {"slot": failure.slot}
            self._failures.record(gpu.identity, (failure.failure,), **where)
        if reading.current is None or reading.pending is None:
            return
        builder.add(GPU_MIG_MODE.name, (*ids, "current"), int(reading.current))
        builder.add(GPU_MIG_MODE.name, (*ids, "pending"), int(reading.pending))
        has_gpm = reading.instances and self._has_gpm(gpu)
        for instance in reading.instances:
            add_instance(builder, ids, instance)
            if has_gpm:
                self._sample(builder, gpu, instance, sampled)

    def _has_gpm(self, gpu: Gpu) -> bool:
        supported = self._gpm.get(gpu.index)
        if supported is None:
            supported = self._gpm[gpu.index] = gpm_supported(self._source, gpu)
        return supported

    def _sample(
        self, builder: FamilyBuilder, gpu: Gpu, instance: MigInstance, sampled: set[_SampleKey]
    ) -> None:
        """GPM activity of the instance's GPU instance since the last cycle (none the first)."""
        key = (gpu.index, instance.gpu_instance)
        try:
            current = gpm_sample(self._source, gpu, instance.gpu_instance)
        except NvmlError as exc:  # profiling counters held elsewhere: activity absent
            self._failures.record_error(gpu.identity, exc)
            return
        sampled.add(key)
        previous = self._previous.pop(key, None)
        self._previous[key] = current
        if previous is None:
            return
        try:
            values = gpm_metrics(self._source, previous, current, _GPM_IDS)
        except NvmlError as exc:
            self._failures.record_error(gpu.identity, exc)
            return
        finally:
            self._free(previous)
        ids = (*gpu_labels(gpu.identity), instance.uuid)
        for metric, family, read in _GPM:
            builder.add(family, (*ids, *read.labels), read.value(values[metric]))

    def _free(self, sample: Any) -> None:
        try:
            gpm_free(self._source, sample)
        except NvmlError as exc:  # a sample of a lost GPU may not free; it is gone
            log.debug("GPM sample not freed", extra={"reason": exc.error})

    def close(self) -> None:
        """Free every kept GPM sample."""
        for key in list(self._previous):
            self._free(self._previous.pop(key))


def add_instance(builder: FamilyBuilder, ids: tuple[str, str], instance: MigInstance) -> None:
    """The families of one MIG instance of the GPU labelled `ids`."""
    builder.add(
        GPU_MIG_INFO.name,
        (
            *ids,
            instance.uuid,
            str(instance.gpu_instance),
            str(instance.compute_instance),
            instance.profile,
        ),
        1,
    )
    mig = (*ids, instance.uuid)
    builder.add(GPU_MIG_MEMORY_USED_BYTES.name, mig, instance.memory_used_bytes)
    builder.add(GPU_MIG_MEMORY_TOTAL_BYTES.name, mig, instance.memory_total_bytes)


def _create(context: CollectorContext, _settings: NoSettings) -> MigCollector:
    return MigCollector(source=context.nvml_source)


SPEC = CollectorSpec(
    name="mig",
    settings=NoSettings,
    help="MIG mode and MIG instances: identity by MIG UUID, memory, GPM activity (NVML)",
    create=_create,
    metrics=SPECS,
)
