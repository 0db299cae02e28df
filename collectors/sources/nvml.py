"""NVML source: typed readings of every GPU in native units, one call's failure at a time.

`NvmlSource(lib=...)` wraps the `pynvml` module (or the fake NVML under simulation: the
same call surface) and returns frozen readings in NVML's own units (`power_milliwatts`,
`energy_millijoules`, `clock_mhz`, percentages, nanoseconds). It never imports
`prometheus_client`; collectors convert units and name metrics.

Errors are sorted per call, because NVML's are per call (`nvml_calls`): a value that is
not supported is absent (None), never 0; a lost GPU raises `GpuLostError`; another failure
leaves the value absent and is kept in the reading's `failures`, so the collector reports
it while other GPUs keep reporting; a call the caller cannot do without (GPM sampling,
Xid events) raises `NvmlError`. Nothing pynvml raises leaves this layer.

`nvmlInit()` runs once per process (the exporter shares one source between collectors).
On a host without the NVIDIA driver the source logs "no NVIDIA driver" once and reports
no GPUs; nothing raises.

This module enumerates the GPUs and reads each one (thermals, power, clocks, memory health,
PCIe, the NVLink fabric) and its NVLinks. What builds on the same source has a module of
its own: MIG instances (`nvml_mig`), GPM sampling (`nvml_gpm`), Xid events (`nvml_events`).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import pynvml

from fleetwatch.collectors.sources.nvml_calls import (
    ABSENT,
    CallFailure,
    Calls,
    FieldBatch,
    FieldId,
    classified,
    error_name,
    nvlink_error_counter,
)

log = logging.getLogger(__name__)

# Errors from nvmlInit that mean "there is no NVIDIA driver on this host".
_NO_DRIVER: Final = (
    pynvml.NVMLError_LibraryNotFound,
    pynvml.NVMLError_DriverNotLoaded,
)

NVLINK_MAX_LINKS: Final = 36
THRESHOLDS: Final = {
    "shutdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    "slowdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    "memory_max": pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
    "gpu_max": pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
}
CLOCK_EVENT_BITS: Final = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
}
# Cumulative clock-event (violation) time in ns, read as field values.
VIOLATION_FIELDS: Final = {
    "sw_power_cap": pynvml.NVML_FI_DEV_PERF_POLICY_POWER,
    "sw_thermal_slowdown": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    "hw_thermal_slowdown": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    "hw_power_brake": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
}
FIELD_MEMORY_TEMP: Final = pynvml.NVML_FI_DEV_MEMORY_TEMP
FIELD_RECOVERY_ACTION: Final = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
NVLINK_ERROR_COUNTERS: Final = {
    "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
    "ecc_data": pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA,
}
# NVLink5 (Blackwell) per-link counters, read as field values scoped to a link.
# The per-link counters NVML also answers as link-scoped field values (scopeId = link),
# named the same in nvml.h (`NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY` is the counter
# `NVML_NVLINK_ERROR_DL_REPLAY` counts): read in the GPU's one batched call. The field
# `..._DL_CRC` (163) is not here: one CRC counter where the per-link call tells flit and
# data CRC errors apart, so which one it is needs real hardware to confirm.
NVLINK_ERROR_FIELDS: Final = {
    "replay": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
}
# A link's state as a link-scoped field, in the same batch. nvml.h gives its values
# (`NVML_NVLINK_STATE_*`): ACTIVE and INACTIVE are what `nvmlDeviceGetNvLinkState` answers
# as enabled and disabled; a link asleep or active with traffic disabled (NVLink power
# states) is asked with the per-link call, as is a link the field does not answer.
NVLINK_STATE_FIELD: Final = pynvml.NVML_FI_DEV_NVLINK_GET_STATE
NVLINK_FIELD_STATES: Final = {
    pynvml.NVML_NVLINK_STATE_ACTIVE: True,
    pynvml.NVML_NVLINK_STATE_INACTIVE: False,
}
NVLINK5_FIELDS: Final = {
    "symbol": pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS,
    "effective": pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS,
    "recovery_failed": pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS,
    "malformed_packet": pynvml.NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS,
    "buffer_overrun": pynvml.NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS,
}
# NVLink-fabric health-mask fields (shift, width, value) that mean the fabric cannot give
# the GPU its full bandwidth: degraded bandwidth, or an unhealthy route.
FABRIC_HEALTH_DEGRADED: Final = (
    (
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW,
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW,
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE,
    ),
    (
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY,
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_UNHEALTHY,
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE,
    ),
)


@dataclass(frozen=True, kw_only=True)
class GpuIdentity:
    """What a GPU is: stable for the life of the process (the `_info` series)."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    serial: str
    driver_version: str


@dataclass(frozen=True, kw_only=True)
class GpuReading:
    """One GPU at one instant, NVML units; None means the GPU did not report it."""

    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    thresholds_celsius: Mapping[str, float | None] = field(default_factory=dict)
    margin_celsius: float | None = None
    power_milliwatts: float | None = None
    power_limit_milliwatts: float | None = None
    energy_millijoules: float | None = None
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    clock_event_reasons: int | None = None
    violation_nanoseconds: Mapping[str, float | None] = field(default_factory=dict)
    utilization_percent: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    ecc_corrected: float | None = None
    ecc_uncorrected: float | None = None
    remapped_rows_correctable: float | None = None
    remapped_rows_uncorrectable: float | None = None
    remap_pending: float | None = None
    remap_failed: float | None = None
    recovery_action: int | None = None
    pcie_replays: float | None = None
    pcie_generation_current: float | None = None
    pcie_generation_max: float | None = None
    pcie_width_current: float | None = None
    pcie_width_max: float | None = None
    fabric: FabricReading | None = None
    failures: tuple[CallFailure, ...] = ()


@dataclass(frozen=True, kw_only=True)
class _StaticReadings:
    """A GPU's readings that do not change while the driver is loaded (NVML units)."""

    thresholds_celsius: Mapping[str, float | None]
    pcie_generation_max: float | None
    pcie_width_max: float | None


@dataclass(frozen=True, kw_only=True)
class FabricReading:
    """A GPU's NVLink-fabric registration (GB200/GB300 NVL72), as `nvmlGpuFabricInfo_v2`.

    `status` is the registration's own NVML return code and means something only once
    `state` is `NVML_GPU_FABRIC_STATE_COMPLETED`; `health_mask` packs 2-bit fields
    (`NVML_GPU_FABRIC_HEALTH_MASK_*`).
    """

    cluster_uuid: str
    clique_id: int
    state: int
    status: int
    health_mask: int

    @property
    def degraded(self) -> bool:
        """Registration completed with an error, or a health-mask field says "degraded"."""
        completed = self.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        if completed and self.status != pynvml.NVML_SUCCESS:
            return True
        return any(
            (self.health_mask >> shift) & width == value
            for shift, width, value in FABRIC_HEALTH_DEGRADED
        )


@dataclass(frozen=True, kw_only=True)
class NvLinkReading:
    """One NVLink of one GPU: state and cumulative error counters (None: not reported)."""

    link: int
    up: bool | None
    errors: Mapping[str, float | None]


@dataclass(frozen=True, kw_only=True)
class GpuLinksReading:
    """Every existing NVLink of one GPU."""

    links: tuple[NvLinkReading, ...]
    failures: tuple[CallFailure, ...] = ()


@dataclass(frozen=True)
class Gpu:
    """A GPU as the source tracks it: identity plus the opaque NVML handle."""

    identity: GpuIdentity
    handle: Any = field(compare=False, repr=False)

    @property
    def index(self) -> int:
        return self.identity.index


def text(value: Any) -> str:
    """pynvml returns `str` from most getters but `bytes` from structure fields."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def margin_celsius(
    reported: float | None, *, slowdown: float | None, temperature: float | None
) -> float | None:
    """The GPU's distance to its slowdown limit: the driver's own margin where it reports
    one (`nvmlDeviceGetMarginTemperature`, what nvidia-smi shows as T.Limit), else the
    slowdown threshold minus the temperature; None when neither is known."""
    if reported is not None:
        return reported
    if slowdown is None or temperature is None:
        return None
    return slowdown - temperature


class NvmlSource:
    """The process's one view of NVML: init once, GPUs enumerated once, readings per call.

    Thread-safe: collectors call it from their own worker threads at the same time
    (NVML itself is thread-safe; the source only guards its own initialisation).
    """

    def __init__(self, *, lib: Any) -> None:
        self.lib = lib
        self._lock = threading.Lock()
        self._started = False  # every GPU NVML counts is identified
        self._initialised = False
        self._said_no_driver = False
        self._skipped: set[int] = set()  # GPU indices that could not be identified yet
        self._gpus: tuple[Gpu, ...] = ()
        self._links: dict[int, tuple[int, ...]] = {}
        self._unanswered: set[tuple[str, int]] = set()  # (group of link fields, GPU)
        self._batches: dict[tuple[str, int], FieldBatch] = {}  # by (purpose, GPU)
        self._fabric: dict[int, bool] = {}
        self._static: dict[int, _StaticReadings] = {}
        self._temperature_v = hasattr(lib, "nvmlDeviceGetTemperatureV")

    def gpus(self) -> tuple[Gpu, ...]:
        """Every GPU NVML identified; empty without a driver (logged once, not raised).

        A start that failed (no driver yet, as while a node boots, or an NVML error, raised
        as `NvmlError`) and a GPU that could not be identified are tried again at the next
        call, so a driver loaded after the exporter, or a GPU that answers again, shows within
        one cycle instead of never."""
        with self._lock:
            if not self._started:
                self._gpus = self._start()
            return self._gpus

    def shutdown(self) -> None:
        """Release NVML (once, after every collector closed); a no-op if never started."""
        with self._lock:
            if not self._initialised:
                return
            self._initialised = False
        try:
            self.lib.nvmlShutdown()
        except pynvml.NVMLError as exc:  # exiting anyway: report and carry on
            log.warning("nvmlShutdown failed", extra={"reason": error_name(exc)})

    def _start(self) -> tuple[Gpu, ...]:
        """The GPUs identified so far, NVML started first if it is not; `_started` once
        every GPU NVML counts is identified."""
        if not self._initialised:
            with classified("nvmlInit"):
                try:
                    self.lib.nvmlInit()
                except _NO_DRIVER as exc:
                    if not self._said_no_driver:
                        self._said_no_driver = True
                        log.warning(
                            "no NVIDIA driver: GPU collectors report no GPUs",
                            extra={"reason": str(exc) or error_name(exc)},
                        )
                    return ()
            self._initialised = True
        with classified("nvmlSystemGetDriverVersion"):
            driver = text(self.lib.nvmlSystemGetDriverVersion())
        with classified("nvmlDeviceGetCount"):
            count = int(self.lib.nvmlDeviceGetCount())
        found = {gpu.index: gpu for gpu in self._gpus}
        for index in range(count):
            if index in found:
                continue
            try:
                found[index] = self._identify(index, driver)
            except pynvml.NVMLError as exc:
                if index not in self._skipped:  # logged once; tried again each call
                    self._skipped.add(index)
                    log.warning(
                        "GPU skipped: cannot identify it",
                        extra={"gpu": index, "reason": error_name(exc)},
                    )
        self._skipped -= found.keys()
        self._started = len(found) >= count
        if self._started:
            log.info("NVML started", extra={"gpus": len(found), "driver_version": driver})
        return tuple(found[index] for index in sorted(found))

    def _identify(self, index: int, driver: str) -> Gpu:
        handle = self.lib.nvmlDeviceGetHandleByIndex(index)
        try:
            serial = text(self.lib.nvmlDeviceGetSerial(handle))
        except ABSENT:
            serial = ""
        identity = GpuIdentity(
            index=index,
            uuid=text(self.lib.nvmlDeviceGetUUID(handle)),
            name=text(self.lib.nvmlDeviceGetName(handle)),
            pci_bus_id=text(self.lib.nvmlDeviceGetPciInfo(handle).busId),
            serial=serial,
            driver_version=driver,
        )
        return Gpu(identity=identity, handle=handle)

    # -- thermals, power, clocks, memory health, PCIe ------------------------------------
    def _temperature(self, calls: Calls, handle: Any) -> float | None:
        if self._temperature_v:
            try:
                return float(
                    self.lib.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU)
                )
            except pynvml.NVMLError_FunctionNotFound:
                self._temperature_v = False  # an older driver: use the deprecated call
            except pynvml.NVMLError as exc:
                calls.sort("nvmlDeviceGetTemperatureV", exc)
                return None
        return calls.number("nvmlDeviceGetTemperature", handle, pynvml.NVML_TEMPERATURE_GPU)

    def read_gpu(self, gpu: Gpu, *, energy: bool = True) -> GpuReading:
        """Everything but NVLink and GPM for one GPU (the energy counter only with `energy`);
        raises GpuLostError when it is gone."""
        calls = Calls(self.lib, gpu.index)
        h = gpu.handle
        fields = self._batch(
            "gpu", gpu, (FIELD_MEMORY_TEMP, *VIOLATION_FIELDS.values(), FIELD_RECOVERY_ACTION)
        ).read(calls, h)
        reasons = calls.get("nvmlDeviceGetCurrentClocksEventReasons", h)
        utilization = calls.get("nvmlDeviceGetUtilizationRates", h)
        memory = calls.get("nvmlDeviceGetMemoryInfo", h)
        remap = calls.get("nvmlDeviceGetRemappedRows", h)
        recovery = fields.get(FIELD_RECOVERY_ACTION)
        temperature = self._temperature(calls, h)
        static = self._read_static(calls, gpu)
        thresholds = static.thresholds_celsius
        return GpuReading(
            temperature_celsius=temperature,
            memory_temperature_celsius=fields.get(FIELD_MEMORY_TEMP),
            thresholds_celsius=thresholds,
            margin_celsius=margin_celsius(
                calls.number("nvmlDeviceGetMarginTemperature", h),
                slowdown=thresholds["slowdown"],
                temperature=temperature,
            ),
            power_milliwatts=calls.number("nvmlDeviceGetPowerUsage", h),
            power_limit_milliwatts=calls.number("nvmlDeviceGetEnforcedPowerLimit", h),
            energy_millijoules=(
                calls.number("nvmlDeviceGetTotalEnergyConsumption", h) if energy else None
            ),
            sm_clock_mhz=calls.number("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM),
            memory_clock_mhz=calls.number("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM),
            clock_event_reasons=None if reasons is None else int(reasons),
            violation_nanoseconds={
                name: fields.get(field_id) for name, field_id in VIOLATION_FIELDS.items()
            },
            utilization_percent=None if utilization is None else float(utilization.gpu),
            memory_used_bytes=None if memory is None else float(memory.used),
            memory_total_bytes=None if memory is None else float(memory.total),
            ecc_corrected=calls.number(
                "nvmlDeviceGetTotalEccErrors",
                h,
                pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                pynvml.NVML_AGGREGATE_ECC,
            ),
            ecc_uncorrected=calls.number(
                "nvmlDeviceGetTotalEccErrors",
                h,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_AGGREGATE_ECC,
            ),
            remapped_rows_correctable=None if remap is None else float(remap[0]),
            remapped_rows_uncorrectable=None if remap is None else float(remap[1]),
            remap_pending=None if remap is None else float(bool(remap[2])),
            remap_failed=None if remap is None else float(bool(remap[3])),
            recovery_action=None if recovery is None else int(recovery),
            pcie_replays=calls.number("nvmlDeviceGetPcieReplayCounter", h),
            pcie_generation_current=calls.number("nvmlDeviceGetCurrPcieLinkGeneration", h),
            pcie_generation_max=static.pcie_generation_max,
            pcie_width_current=calls.number("nvmlDeviceGetCurrPcieLinkWidth", h),
            pcie_width_max=static.pcie_width_max,
            fabric=self._read_fabric(calls, gpu),
            failures=tuple(calls.failures),
        )

    def _read_static(self, calls: Calls, gpu: Gpu) -> _StaticReadings:
        """What a GPU's board fixes while the driver is loaded (temperature thresholds,
        maximum PCIe generation and width), read once: 6 of its 25 calls a cycle.

        Kept only when every call answered (a value or "not supported"); a failed call is
        retried next cycle, and a lost GPU raises as any call does.
        """
        found = self._static.get(gpu.index)
        if found is not None:
            return found
        failed = len(calls.failures)
        h = gpu.handle
        found = _StaticReadings(
            thresholds_celsius={
                name: calls.number("nvmlDeviceGetTemperatureThreshold", h, code)
                for name, code in THRESHOLDS.items()
            },
            pcie_generation_max=calls.number("nvmlDeviceGetMaxPcieLinkGeneration", h),
            pcie_width_max=calls.number("nvmlDeviceGetMaxPcieLinkWidth", h),
        )
        if len(calls.failures) == failed:
            self._static[gpu.index] = found
        return found

    def _read_fabric(self, calls: Calls, gpu: Gpu) -> FabricReading | None:
        """The GPU's NVLink-fabric info; None (and never asked again) without a fabric.

        GPUs outside an NVLink-switch domain answer NotSupported, or succeed with state
        `NOT_SUPPORTED`: either way the fabric series are absent, not 0.
        """
        if not self._fabric.get(gpu.index, True):
            return None
        info = pynvml.c_nvmlGpuFabricInfoV_t()
        failed = len(calls.failures)
        if calls.get("nvmlDeviceGetGpuFabricInfoV", gpu.handle, ctypes.pointer(info)) is None:
            if len(calls.failures) == failed:
                self._fabric[gpu.index] = False  # not supported here: stop asking
            return None
        if info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
            self._fabric[gpu.index] = False
            return None
        return FabricReading(
            cluster_uuid=uuid_text(bytes(info.clusterUuid)),
            clique_id=int(info.cliqueId),
            state=int(info.state),
            status=int(info.status),
            health_mask=int(info.healthMask),
        )

    def _batch(self, purpose: str, gpu: Gpu, ids: Sequence[FieldId]) -> FieldBatch:
        """The GPU's batch of `ids` for one purpose, made again when the ids change."""
        batch = self._batches.get((purpose, gpu.index))
        if batch is None or batch.ids != tuple(ids):
            batch = self._batches[(purpose, gpu.index)] = FieldBatch(self.lib, ids)
        return batch

    # -- NVLink --------------------------------------------------------------------------
    def nvlinks(self, gpu: Gpu) -> tuple[int, ...]:
        """Indices of the links this GPU really has, probed once by state.

        NVML claims up to 36 links; B200/GB200 have 18 and answer InvalidArgument past
        them, which means "no such link", not an error; a GPU without NVLink answers
        NotSupported. A GPU that answered InvalidArgument for every link, link 0 too, gave
        no answer a GPU gives: it is asked again at the next cycle, not taken as linkless.
        """
        links = self._links.get(gpu.index)
        if links is None:
            found: list[int] = []
            unsupported = False
            for link in range(NVLINK_MAX_LINKS):
                with classified("nvmlDeviceGetNvLinkState", gpu=gpu.index):
                    try:
                        self.lib.nvmlDeviceGetNvLinkState(gpu.handle, link)
                    except pynvml.NVMLError_NotSupported:
                        unsupported = True
                        continue
                    except pynvml.NVMLError_InvalidArgument:
                        continue
                found.append(link)
            links = tuple(found)
            if links or unsupported:
                self._links[gpu.index] = links
        return links

    def read_nvlinks(self, gpu: Gpu, *, nvlink5: bool) -> GpuLinksReading:
        """State and per-link error counters (legacy totals read 0 on Hopper: not used).

        One batched field-value call per GPU carries the state (`NVLINK_STATE_FIELD`) and
        the replay and recovery counters of every link (`NVLINK_ERROR_FIELDS`) and, with
        `nvlink5`, the NVLink5 counters; a value the batch does not answer (or a state other
        than active or inactive) is read with the per-link call, and a GPU whose batch
        answers none of a group's fields is not asked for that group again. The CRC and ECC
        counters are per-link calls.
        """
        calls = Calls(self.lib, gpu.index)
        h = gpu.handle
        links = self.nvlinks(gpu)
        groups = {
            group: fields
            for group, fields, wanted in (
                ("state", {"state": NVLINK_STATE_FIELD}, True),
                ("errors", NVLINK_ERROR_FIELDS, True),
                ("nvlink5", NVLINK5_FIELDS, nvlink5),
            )
            if wanted and links and (group, gpu.index) not in self._unanswered
        }
        ids = [
            (field_id, link) for link in links for g in groups.values() for field_id in g.values()
        ]
        batch = self._batch("nvlink", gpu, ids).read(calls, h) if ids else {}
        for group, fields in groups.items():
            if batch and all(
                batch[(field_id, link)] is None for link in links for field_id in fields.values()
            ):
                self._unanswered.add((group, gpu.index))  # not answered here: stop asking
        # Per link: the state and the counters the batch did not answer (the functions
        # are looked up once, the counter's as NVML's C function under pynvml; each failure
        # is sorted as `Calls` sorts it).
        state_of = self.lib.nvmlDeviceGetNvLinkState
        counter_of = nvlink_error_counter(self.lib)
        counters = tuple(NVLINK_ERROR_COUNTERS.items())
        readings = []
        for link in links:
            state = batch.get((NVLINK_STATE_FIELD, link))
            up = None if state is None else NVLINK_FIELD_STATES.get(state)  # 1.0 finds 1; NaN none
            if up is None:
                try:
                    up = bool(state_of(h, link))
                except pynvml.NVMLError as exc:
                    calls.sort("nvmlDeviceGetNvLinkState", exc)
            errors: dict[str, float | None] = {}
            for name, code in counters:
                field_id = NVLINK_ERROR_FIELDS.get(name)
                if field_id is not None and (value := batch.get((field_id, link))) is not None:
                    errors[name] = value
                    continue
                try:
                    errors[name] = float(counter_of(h, link, code))
                except pynvml.NVMLError as exc:
                    calls.sort("nvmlDeviceGetNvLinkErrorCounter", exc)
                    errors[name] = None
            if "nvlink5" in groups and batch:
                for name, field_id in NVLINK5_FIELDS.items():
                    errors[name] = batch.get((field_id, link))
            readings.append(NvLinkReading(link=link, up=up, errors=errors))
        return GpuLinksReading(links=tuple(readings), failures=tuple(calls.failures))


def uuid_text(raw: bytes) -> str:
    """16 bytes as a UUID's canonical text (`str(uuid.UUID(bytes=raw))`), without loading
    the `uuid` module (about 0.2 MiB) for one formatting."""
    if len(raw) != 16:
        raise ValueError(f"a UUID is 16 bytes, got {len(raw)}")
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
