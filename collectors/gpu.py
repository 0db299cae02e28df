"""GPU collector: identity, thermals, power, clocks and clock events, memory health, PCIe.

Every GPU is read through the shared `NvmlSource` (one batched field-value call per GPU
per cycle). A value a GPU does not support is absent; a GPU that fell off the bus is
dropped (and no longer counted in `fleetwatch_gpus_visible`) while the others keep reporting;
a call that times out leaves its values absent and counts in
`fleetwatch_gpu_nvml_errors_total`. A hung call blocks `collect()`, which the engine
reports as a hung collector while every other collector keeps serving.

`fleetwatch_gpus_expected` is emitted only when `--collector.gpu.expected-count` is
set: an expected count guessed from what is visible at start would hide a GPU that was
already missing when the exporter started.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from fleetwatch.catalog.gpu import (
    GPU_CLOCK_EVENT_ACTIVE,
    GPU_CLOCK_EVENT_SECONDS_TOTAL,
    GPU_CLOCK_HERTZ,
    GPU_ECC_ERRORS_TOTAL,
    GPU_ENERGY_JOULES_TOTAL,
    GPU_FABRIC_DEGRADED,
    GPU_FABRIC_INFO,
    GPU_FABRIC_STATE_ID,
    GPU_INFO,
    GPU_MEMORY_TOTAL_BYTES,
    GPU_MEMORY_USED_BYTES,
    GPU_NVML_ERRORS_TOTAL,
    GPU_PCIE_LINK_GENERATION,
    GPU_PCIE_LINK_WIDTH,
    GPU_PCIE_REPLAYS_TOTAL,
    GPU_POWER_LIMIT_WATTS,
    GPU_POWER_WATTS,
    GPU_RECOVERY_ACTION,
    GPU_REMAPPED_ROWS,
    GPU_ROW_REMAP_FAILED,
    GPU_ROW_REMAP_PENDING,
    GPU_TEMPERATURE_CELSIUS,
    GPU_TEMPERATURE_MARGIN_CELSIUS,
    GPU_TEMPERATURE_THRESHOLD_CELSIUS,
    GPU_UTILIZATION_RATIO,
    GPUS_EXPECTED,
    GPUS_VISIBLE,
)
from fleetwatch.collectors.base import CollectorContext, CollectorSpec
from fleetwatch.collectors.families import FamilyBuilder, LabelCache, SeriesFamily
from fleetwatch.collectors.gpu_common import (
    LostGpus,
    NvmlFailures,
    gpu_labels,
    megahertz_to_hertz,
    millijoules_to_joules,
    milliwatts_to_watts,
    nanoseconds_to_seconds,
    percent_to_ratio,
)
from fleetwatch.collectors.sources.nvml import (
    CLOCK_EVENT_BITS,
    FabricReading,
    GpuIdentity,
    GpuReading,
    NvmlSource,
)
from fleetwatch.collectors.sources.nvml_calls import GpuLostError
from fleetwatch.flags import bounded_number, setting

RECOVERY_ACTIONS: Final = ("none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset")

ERRORS = GPU_NVML_ERRORS_TOTAL

SPECS: Final = (
    GPU_INFO,
    GPUS_VISIBLE,
    GPUS_EXPECTED,
    GPU_TEMPERATURE_CELSIUS,
    GPU_TEMPERATURE_THRESHOLD_CELSIUS,
    GPU_TEMPERATURE_MARGIN_CELSIUS,
    GPU_UTILIZATION_RATIO,
    GPU_POWER_WATTS,
    GPU_POWER_LIMIT_WATTS,
    GPU_ENERGY_JOULES_TOTAL,
    GPU_CLOCK_HERTZ,
    GPU_CLOCK_EVENT_ACTIVE,
    GPU_CLOCK_EVENT_SECONDS_TOTAL,
    GPU_MEMORY_USED_BYTES,
    GPU_MEMORY_TOTAL_BYTES,
    GPU_ECC_ERRORS_TOTAL,
    GPU_REMAPPED_ROWS,
    GPU_ROW_REMAP_PENDING,
    GPU_ROW_REMAP_FAILED,
    GPU_RECOVERY_ACTION,
    GPU_PCIE_REPLAYS_TOTAL,
    GPU_PCIE_LINK_GENERATION,
    GPU_PCIE_LINK_WIDTH,
    GPU_FABRIC_INFO,
    GPU_FABRIC_STATE_ID,
    GPU_FABRIC_DEGRADED,
    ERRORS,
)

# Plain per-GPU values: (metric, extra label values, reading → base-unit value).
_Getter = Callable[[GpuReading], float | None]
_VALUES: Final[tuple[tuple[str, tuple[str, ...], _Getter], ...]] = (
    (GPU_TEMPERATURE_CELSIUS.name, ("gpu",), lambda r: r.temperature_celsius),
    (GPU_TEMPERATURE_CELSIUS.name, ("memory",), lambda r: r.memory_temperature_celsius),
    (GPU_TEMPERATURE_MARGIN_CELSIUS.name, (), lambda r: r.margin_celsius),
    (GPU_UTILIZATION_RATIO.name, (), lambda r: percent_to_ratio(r.utilization_percent)),
    (GPU_POWER_WATTS.name, (), lambda r: milliwatts_to_watts(r.power_milliwatts)),
    (
        GPU_POWER_LIMIT_WATTS.name,
        (),
        lambda r: milliwatts_to_watts(r.power_limit_milliwatts),
    ),
    (
        GPU_ENERGY_JOULES_TOTAL.name,
        (),
        lambda r: millijoules_to_joules(r.energy_millijoules),
    ),
    (GPU_CLOCK_HERTZ.name, ("sm",), lambda r: megahertz_to_hertz(r.sm_clock_mhz)),
    (GPU_CLOCK_HERTZ.name, ("memory",), lambda r: megahertz_to_hertz(r.memory_clock_mhz)),
    (GPU_MEMORY_USED_BYTES.name, (), lambda r: r.memory_used_bytes),
    (GPU_MEMORY_TOTAL_BYTES.name, (), lambda r: r.memory_total_bytes),
    (GPU_ECC_ERRORS_TOTAL.name, ("corrected",), lambda r: r.ecc_corrected),
    (GPU_ECC_ERRORS_TOTAL.name, ("uncorrected",), lambda r: r.ecc_uncorrected),
    (GPU_REMAPPED_ROWS.name, ("correctable",), lambda r: r.remapped_rows_correctable),
    (GPU_REMAPPED_ROWS.name, ("uncorrectable",), lambda r: r.remapped_rows_uncorrectable),
    (GPU_ROW_REMAP_PENDING.name, (), lambda r: r.remap_pending),
    (GPU_ROW_REMAP_FAILED.name, (), lambda r: r.remap_failed),
    (GPU_PCIE_REPLAYS_TOTAL.name, (), lambda r: r.pcie_replays),
    (GPU_PCIE_LINK_GENERATION.name, ("current",), lambda r: r.pcie_generation_current),
    (GPU_PCIE_LINK_GENERATION.name, ("max",), lambda r: r.pcie_generation_max),
    (GPU_PCIE_LINK_WIDTH.name, ("current",), lambda r: r.pcie_width_current),
    (GPU_PCIE_LINK_WIDTH.name, ("max",), lambda r: r.pcie_width_max),
)


class GpuCollector:
    """Reads every GPU through the shared NVML source and maps readings to the GPU families."""

    def __init__(self, *, source: NvmlSource, expected_count: int | None) -> None:
        self._source = source
        self._expected = expected_count
        self._failures = NvmlFailures(collector="gpu", spec=ERRORS)
        self._lost = LostGpus(collector="gpu")
        self._labels = LabelCache(SPECS)

    def collect(self) -> list[SeriesFamily]:
        builder = FamilyBuilder(self._labels)
        gpus = self._source.gpus()
        visible = 0
        for gpu in gpus:
            try:
                reading = self._source.read_gpu(gpu)
            except GpuLostError:
                self._lost.lost(gpu.identity)
                continue
            self._lost.seen(gpu.identity)
            visible += 1
            self._failures.record(gpu.identity, reading.failures)
            add_gpu(builder, gpu.identity, reading)
        if gpus or self._expected is not None:
            builder.add(GPUS_VISIBLE.name, (), visible)
        if self._expected is not None:
            builder.add(GPUS_EXPECTED.name, (), self._expected)
        self._failures.add_to(builder)
        return builder.families()

    def close(self) -> None:
        """Nothing to release: the NVML source is shared and lives as long as the process."""


def add_gpu(builder: FamilyBuilder, identity: GpuIdentity, reading: GpuReading) -> None:
    """Every family of one GPU from one reading."""
    ids = gpu_labels(identity)
    builder.add(
        GPU_INFO.name,
        (*ids, identity.name, identity.pci_bus_id, identity.serial, identity.driver_version),
        1,
    )
    for name, extra, getter in _VALUES:
        builder.add(name, (*ids, *extra), getter(reading))
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


def _create(context: CollectorContext, settings: GpuSettings) -> GpuCollector:
    return GpuCollector(source=context.nvml_source, expected_count=settings.expected_count)


SPEC = CollectorSpec(
    name="gpu",
    help="GPU identity, temperatures, power, clocks, clock events, memory health, PCIe (NVML)",
    settings=GpuSettings,
    create=_create,
    metrics=SPECS,
)
