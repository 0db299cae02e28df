"""GPU collector: identity, thermals, power, clocks and clock events, memory health, PCIe.

Every GPU is read through the shared `NvmlSource` (one batched field-value call per GPU
per cycle). A value a GPU does not support is absent; a GPU that fell off the bus is
dropped (and no longer counted in `fleetwatch_gpus_visible`) while the others keep reporting;
a call that times out leaves its values absent and counts in
`fleetwatch_gpu_nvml_errors_total`. A hung call blocks `collect()`, which the engine
reports as a hung collector while every other collector keeps serving.

The energy counter is read once every `--collector.gpu.energy-interval` (30 s), not every
cycle: on an H200 `nvmlDeviceGetTotalEnergyConsumption` costs the driver 3.6 ms of CPU a
GPU, more than every other reading of the GPU together (bench/bench_nvml_calls.py on the
driver, docs/performance.md), for a counter whose rate the power reading gives each cycle.
Between reads the last value is exported (a counter that lags, never one that goes back);
a read that fails is made again the next cycle.

`fleetwatch_gpus_expected` is emitted only when `--collector.gpu.expected-count` is
set: an expected count guessed from what is visible at start would hide a GPU that was
already missing when the exporter started.

The collector lists no family: it emits what the catalog declares for `gpu`
(`collected_by`), and fills each plain value (temperatures, power, clocks, memory, ECC,
PCIe) from the `GpuReading` field the declaration names (`Read`), converted as it says. A
new NVML value is a field of `GpuReading` read in `sources/nvml.py` and one declaration in
catalog/gpu.py; this module changes only for a family that needs code (one-hot states,
per-reason maps, the fabric).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from fleetwatch.catalog import collected_by
from fleetwatch.catalog.gpu import (
    GPU_CLOCK_EVENT_ACTIVE,
    GPU_CLOCK_EVENT_SECONDS_TOTAL,
    GPU_FABRIC_DEGRADED,
    GPU_FABRIC_INFO,
    GPU_FABRIC_STATE_ID,
    GPU_INFO,
    GPU_NVML_ERRORS_TOTAL,
    GPU_RECOVERY_ACTION,
    GPU_TEMPERATURE_THRESHOLD_CELSIUS,
    GPUS_EXPECTED,
    GPUS_VISIBLE,
)
from fleetwatch.catalog.spec import Read
from fleetwatch.catalog.units import nanoseconds_to_seconds
from fleetwatch.collectors.base import CollectorContext, CollectorSpec
from fleetwatch.collectors.families import FamilyBuilder, LabelCache, SeriesFamily, reads_of
from fleetwatch.collectors.gpu_common import GPU_ID, LostGpus, NvmlFailures, gpu_labels
from fleetwatch.collectors.sources.nvml import (
    CLOCK_EVENT_BITS,
    FabricReading,
    GpuIdentity,
    GpuReading,
    NvmlSource,
)
from fleetwatch.collectors.sources.nvml_calls import GpuLostError
from fleetwatch.flags import bounded_number, duration_setting, setting

RECOVERY_ACTIONS: Final = ("none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset")

SPECS: Final = collected_by("gpu")
# The plain per-GPU values, as the catalog declares them: (family, where it is read).
_VALUES: Final = reads_of(
    SPECS, available={f.name for f in dataclasses.fields(GpuReading)}, identity=len(GPU_ID)
)


class GpuCollector:
    """Reads every GPU through the shared NVML source and maps readings to the GPU families."""

    def __init__(
        self,
        *,
        source: NvmlSource,
        expected_count: int | None,
        energy_interval: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._expected = expected_count
        self._energy_interval = energy_interval
        self._clock = clock
        # Each GPU's last energy reading: (when it was read, millijoules).
        self._energy: dict[GpuIdentity, tuple[float, float]] = {}
        self._failures = NvmlFailures(collector="gpu", spec=GPU_NVML_ERRORS_TOTAL)
        self._lost = LostGpus(collector="gpu")
        self._labels = LabelCache(SPECS)
        self._rows: dict[GpuIdentity, ValueRows] = {}

    def collect(self) -> list[SeriesFamily]:
        builder = FamilyBuilder(self._labels)
        gpus = self._source.gpus()
        # A listed GPU's rows are kept from the cycle that first saw it; a GPU gone, dropped.
        self._rows = {
            gpu.identity: self._rows.get(gpu.identity) or value_rows(self._labels, gpu.identity)
            for gpu in gpus
        }
        self._energy = {
            gpu.identity: self._energy[gpu.identity] for gpu in gpus if gpu.identity in self._energy
        }
        now = self._clock()
        visible = 0
        for gpu in gpus:
            kept = self._energy.get(gpu.identity)
            due = kept is None or now - kept[0] >= self._energy_interval
            try:
                reading = self._source.read_gpu(gpu, energy=due)
            except GpuLostError:
                self._lost.lost(gpu.identity)
                continue
            self._lost.seen(gpu.identity)
            if not due and kept is not None:
                reading = dataclasses.replace(reading, energy_millijoules=kept[1])
            elif reading.energy_millijoules is not None:
                self._energy[gpu.identity] = (now, reading.energy_millijoules)
            visible += 1
            self._failures.record(gpu.identity, reading.failures)
            add_gpu(builder, gpu.identity, reading, self._rows[gpu.identity])
        if gpus or self._expected is not None:
            builder.add(GPUS_VISIBLE.name, (), visible)
        if self._expected is not None:
            builder.add(GPUS_EXPECTED.name, (), self._expected)
        self._failures.add_to(builder)
        return builder.families()

    def close(self) -> None:
        """Nothing to release: the NVML source is shared and lives as long as the process."""


ValueRows = tuple[tuple[str, dict[str, str], str, Read], ...]
"""A GPU's rows of `_VALUES`: (family, label dict, reading field, read), in `_VALUES`' order."""


def value_rows(labels: LabelCache, identity: GpuIdentity) -> ValueRows:
    """The GPU's label dict of each `_VALUES` row, made once while it is listed: a cycle puts
    each value under its dict instead of forming its label tuple and looking it up (about
    300 values a DGX H100 cycle)."""
    ids = gpu_labels(identity)
    return tuple(
        (name, labels.labels(name, (*ids, *read.labels)), read.field, read)
        for name, read in _VALUES
    )


def add_gpu(
    builder: FamilyBuilder, identity: GpuIdentity, reading: GpuReading, rows: ValueRows
) -> None:
    """Every family of one GPU from one reading (`rows`: its `value_rows`)."""
    ids = gpu_labels(identity)
    builder.add(
        GPU_INFO.name,
        (*ids, identity.name, identity.pci_bus_id, identity.serial, identity.driver_version),
        1,
    )
    put = builder.put
    for name, labels, field, read in rows:
        put(name, labels, read.value(getattr(reading, field)))
    for threshold, celsius in reading.thresholds_celsius.items():
        builder.add(GPU_TEMPERATURE_THRESHOLD_CELSIUS.name, (*ids, threshold), celsius)
    if reading.clock_event_reasons is not None:
        for reason, bit in CLOCK_EVENT_BITS.items():
            builder.add(
                GPU_CLOCK_EVENT_ACTIVE.name,
                (*ids, reason),
                int(bool(reading.clock_event_reasons & bit)),
            )
    for reason, nanoseconds in reading.violation_nanoseconds.items():
        builder.add(
            GPU_CLOCK_EVENT_SECONDS_TOTAL.name, (*ids, reason), nanoseconds_to_seconds(nanoseconds)
        )
    action = reading.recovery_action
    if action is not None and 0 <= action < len(RECOVERY_ACTIONS):
        for code, name in enumerate(RECOVERY_ACTIONS):
            builder.add(GPU_RECOVERY_ACTION.name, (*ids, name), int(code == action))
    if reading.fabric is not None:
        add_fabric(builder, ids, reading.fabric)


def add_fabric(builder: FamilyBuilder, ids: tuple[str, str], fabric: FabricReading) -> None:
    """The NVLink-fabric families of one GPU that has a fabric."""
    builder.add(GPU_FABRIC_INFO.name, (*ids, fabric.cluster_uuid, str(fabric.clique_id)), 1)
    builder.add(GPU_FABRIC_STATE_ID.name, ids, fabric.state)
    builder.add(GPU_FABRIC_DEGRADED.name, ids, int(fabric.degraded))


@dataclass(frozen=True, kw_only=True)
class GpuSettings:
    """`--collector.gpu.*` flags."""

    expected_count: int | None = setting(
        None,
        parse=bounded_number(0, 1024, integer=True, unit="GPUs"),
        metavar="N",
        help=f"GPUs this node should have; exported as {GPUS_EXPECTED} so an "
        f"alert can compare it with {GPUS_VISIBLE} (default: not exported)",
    )
    energy_interval: float = duration_setting(
        30.0,
        minimum=1.0,
        maximum=3600.0,
        help="read each GPU's energy counter at most this often (the collection interval or "
        "less: every cycle); the driver spends milliseconds of CPU a GPU on it, and power is "
        "read every cycle",
    )


def _create(context: CollectorContext, settings: GpuSettings) -> GpuCollector:
    return GpuCollector(
        source=context.nvml_source,
        expected_count=settings.expected_count,
        energy_interval=settings.energy_interval,
    )


SPEC = CollectorSpec(
    name="gpu",
    help="GPU identity, temperatures, power, clocks, clock events, memory health, PCIe (NVML)",
    settings=GpuSettings,
    create=_create,
    metrics=SPECS,
)
