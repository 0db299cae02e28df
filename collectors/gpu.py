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

from fleetwatch.collectors.base import CollectorContext, CollectorSpec
from fleetwatch.collectors.gpu_common import (
    GPU_ID,
    LostGpus,
    NvmlFailures,
    gpu_labels,
    megahertz_to_hertz,
    millijoules_to_joules,
    milliwatts_to_watts,
    nanoseconds_to_seconds,
    nvml_errors_spec,
    percent_to_ratio,
)
from fleetwatch.collectors.metrics import FamilyBuilder, LabelCache, MetricSpec, SeriesFamily
from fleetwatch.collectors.sources.nvml import (
    CLOCK_EVENT_BITS,
    FabricReading,
    GpuIdentity,
    GpuReading,
    NvmlSource,
)
from fleetwatch.collectors.sources.nvml_calls import GpuLostError

from fleetwatch.flags import bounded_number, setting
from fleetwatch.metric_names import (
    CLOCK_EVENT_ACTIVE,
    CLOCK_EVENT_SECONDS,
    COUNT,
    EXPECTED,
    FABRIC_DEGRADED,
    FABRIC_INFO,
    FABRIC_STATE,
    INFO,
    RECOVERY,
    THRESHOLD,
)

RECOVERY_ACTIONS: Final = ("none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset")

ERRORS = nvml_errors_spec("gpu")

SPECS: Final = (
    MetricSpec(
        INFO,
        "gauge",
        "GPU identity (value 1): join on gpu/uuid with group_left for name, PCI bus, serial.",
        (*GPU_ID, "name", "pci_bus_id", "serial", "driver_version"),
    ),
    MetricSpec(COUNT, "gauge", "GPUs visible to NVML now (a lost GPU is not counted)."),
    MetricSpec(EXPECTED, "gauge", "GPUs this node should have (--collector.gpu.expected-count)."),
    MetricSpec(
        "fleetwatch_gpu_temperature_celsius",
        "gauge",
        "GPU die (sensor=gpu) and HBM (sensor=memory) temperature.",
        (*GPU_ID, "sensor"),
    ),
    MetricSpec(
        THRESHOLD,
        "gauge",
        "Temperature thresholds the GPU enforces (slowdown, shutdown, gpu_max, memory_max).",
        (*GPU_ID, "threshold"),
    ),
    MetricSpec(
        "fleetwatch_gpu_utilization_ratio",
        "gauge",
        "NVML 'GPU utilization': fraction of time at least one kernel ran. Misleading: a GPU "
        "running one tiny kernel reads 1.0; use fleetwatch_gpu_tensor_active_ratio.",
        GPU_ID,
    ),
    MetricSpec("fleetwatch_gpu_power_watts", "gauge", "Power draw.", GPU_ID),
    MetricSpec("fleetwatch_gpu_power_limit_watts", "gauge", "Enforced power limit.", GPU_ID),
    MetricSpec(
        "fleetwatch_gpu_energy_joules_total",
        "counter",
        "Energy consumed since the driver loaded.",
        GPU_ID,
    ),
    MetricSpec(
        "fleetwatch_gpu_clock_hertz", "gauge", "Current SM and memory clocks.", (*GPU_ID, "clock")
    ),
    MetricSpec(
        CLOCK_EVENT_ACTIVE,
        "gauge",
        "1 while the clock-event (throttle) reason holds the clocks down, else 0.",
        (*GPU_ID, "reason"),
    ),
    MetricSpec(
        CLOCK_EVENT_SECONDS,
        "counter",
        "Cumulative time clocks were held down by the reason (violation time).",
        (*GPU_ID, "reason"),
    ),
    MetricSpec("fleetwatch_gpu_memory_used_bytes", "gauge", "Frame buffer memory in use.", GPU_ID),
    MetricSpec("fleetwatch_gpu_memory_total_bytes", "gauge", "Frame buffer memory size.", GPU_ID),
    MetricSpec(
        "fleetwatch_gpu_ecc_errors_total",
        "counter",
        "ECC errors over the GPU's life (aggregate counters) by severity.",
        (*GPU_ID, "severity"),
    ),
    MetricSpec(
        "fleetwatch_gpu_remapped_rows",
        "gauge",
        "HBM rows remapped, by the cause of the remap.",
        (*GPU_ID, "cause"),
    ),
    MetricSpec(
        "fleetwatch_gpu_row_remap_pending",
        "gauge",
        "1 when a row remap waits for a GPU reset.",
        GPU_ID,
    ),
    MetricSpec("fleetwatch_gpu_row_remap_failed", "gauge", "1 when a row remap failed.", GPU_ID),
    MetricSpec(
        RECOVERY,
        "gauge",
        "1 for the recovery action the driver asks for (none, gpu_reset, node_reboot, "
        "drain_p2p, drain_and_reset), 0 for the others.",
        (*GPU_ID, "action"),
    ),
    MetricSpec("fleetwatch_gpu_pcie_replays_total", "counter", "PCIe replay events.", GPU_ID),
    MetricSpec(
        "fleetwatch_gpu_pcie_link_generation",
        "gauge",
        "PCIe link generation, current and maximum.",
        (*GPU_ID, "which"),
    ),
    MetricSpec(
        "fleetwatch_gpu_pcie_link_width",
        "gauge",
        "PCIe link width in lanes, current and maximum.",
        (*GPU_ID, "which"),
    ),
    MetricSpec(
        FABRIC_INFO,
        "gauge",
        "NVLink-fabric identity (value 1): the NVLink domain (cluster_uuid) and partition "
        "(clique_id) of a GPU on an NVLink-switch system (GB200/GB300 NVL72).",
        (*GPU_ID, "cluster_uuid", "clique_id"),
    ),
    MetricSpec(
        FABRIC_STATE,
        "gauge",
        "NVLink-fabric registration state: 1 not started, 2 in progress, 3 completed.",
        GPU_ID,
    ),
    MetricSpec(
        FABRIC_DEGRADED,
        "gauge",
        "1 when the fabric registration failed or the fabric health mask reports degraded "
        "bandwidth or an unhealthy route, else 0.",
        GPU_ID,
    ),
    ERRORS,
)

# Plain per-GPU values: (metric, extra label values, reading → base-unit value).
_Getter = Callable[[GpuReading], float | None]
_VALUES: Final[tuple[tuple[str, tuple[str, ...], _Getter], ...]] = (
    ("fleetwatch_gpu_temperature_celsius", ("gpu",), lambda r: r.temperature_celsius),
    ("fleetwatch_gpu_temperature_celsius", ("memory",), lambda r: r.memory_temperature_celsius),
    ("fleetwatch_gpu_utilization_ratio", (), lambda r: percent_to_ratio(r.utilization_percent)),
    ("fleetwatch_gpu_power_watts", (), lambda r: milliwatts_to_watts(r.power_milliwatts)),
    (
        "fleetwatch_gpu_power_limit_watts",
        (),
        lambda r: milliwatts_to_watts(r.power_limit_milliwatts),
    ),
    (
        "fleetwatch_gpu_energy_joules_total",
        (),
        lambda r: millijoules_to_joules(r.energy_millijoules),
    ),
    ("fleetwatch_gpu_clock_hertz", ("sm",), lambda r: megahertz_to_hertz(r.sm_clock_mhz)),
    ("fleetwatch_gpu_clock_hertz", ("memory",), lambda r: megahertz_to_hertz(r.memory_clock_mhz)),
    ("fleetwatch_gpu_memory_used_bytes", (), lambda r: r.memory_used_bytes),
    ("fleetwatch_gpu_memory_total_bytes", (), lambda r: r.memory_total_bytes),
    ("fleetwatch_gpu_ecc_errors_total", ("corrected",), lambda r: r.ecc_corrected),
    ("fleetwatch_gpu_ecc_errors_total", ("uncorrected",), lambda r: r.ecc_uncorrected),
    ("fleetwatch_gpu_remapped_rows", ("correctable",), lambda r: r.remapped_rows_correctable),
    ("fleetwatch_gpu_remapped_rows", ("uncorrectable",), lambda r: r.remapped_rows_uncorrectable),
    ("fleetwatch_gpu_row_remap_pending", (), lambda r: r.remap_pending),
    ("fleetwatch_gpu_row_remap_failed", (), lambda r: r.remap_failed),
    ("fleetwatch_gpu_pcie_replays_total", (), lambda r: r.pcie_replays),
    ("fleetwatch_gpu_pcie_link_generation", ("current",), lambda r: r.pcie_generation_current),
    ("fleetwatch_gpu_pcie_link_generation", ("max",), lambda r: r.pcie_generation_max),
    ("fleetwatch_gpu_pcie_link_width", ("current",), lambda r: r.pcie_width_current),
    ("fleetwatch_gpu_pcie_link_width", ("max",), lambda r: r.pcie_width_max),
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
            builder.add(COUNT, (), visible)
        if self._expected is not None:
            builder.add(EXPECTED, (), self._expected)
        self._failures.add_to(builder)
        return builder.families()

    def close(self) -> None:
        """Nothing to release: the NVML source is shared and lives as long as the process."""


def add_gpu(builder: FamilyBuilder, identity: GpuIdentity, reading: GpuReading) -> None:
    """Every family of one GPU from one reading."""
    ids = gpu_labels(identity)
    builder.add(
        INFO,
        (*ids, identity.name, identity.pci_bus_id, identity.serial, identity.driver_version),
        1,
    )
    for name, extra, getter in _VALUES:
        builder.add(name, (*ids, *extra), getter(reading))
    for threshold, celsius in reading.thresholds_celsius.items():
        builder.add(THRESHOLD, (*ids, threshold), celsius)
    if reading.clock_event_reasons is not None:
        for reason, bit in CLOCK_EVENT_BITS.items():
            builder.add(
                CLOCK_EVENT_ACTIVE, (*ids, reason), int(bool(reading.clock_event_reasons & bit))
            )
    for reason, nanoseconds in reading.violation_nanoseconds.items():
        builder.add(CLOCK_EVENT_SECONDS, (*ids, reason), nanoseconds_to_seconds(nanoseconds))
    action = reading.recovery_action
    if action is not None and 0 <= action < len(RECOVERY_ACTIONS):
        for code, name in enumerate(RECOVERY_ACTIONS):
            builder.add(RECOVERY, (*ids, name), int(code == action))
    if reading.fabric is not None:
        add_fabric(builder, ids, reading.fabric)


def add_fabric(builder: FamilyBuilder, ids: tuple[str, str], fabric: FabricReading) -> None:
    """The NVLink-fabric families of one GPU that has a fabric."""
    builder.add(FABRIC_INFO, (*ids, fabric.cluster_uuid, str(fabric.clique_id)), 1)
    builder.add(FABRIC_STATE, ids, fabric.state)
    builder.add(FABRIC_DEGRADED, ids, int(fabric.degraded))


@dataclass(frozen=True, kw_only=True)
class GpuSettings:
    """`--collector.gpu.*` flags."""

    expected_count: int | None = setting(
        None,
        parse=bounded_number(0, 1024, integer=True, unit="GPUs"),
        metavar="N",
        help="GPUs this node should have; exported as fleetwatch_gpus_expected so an "
        "alert can compare it with fleetwatch_gpus_visible (default: not exported)",
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
