"""A fake NVML: the `pynvml` call surface the collectors use, driven by a simulated node.

`FakeNvml(node=SimulatedNode(...))` has the same function names, constants and result
shapes as the `pynvml` module (the records of nvml_records.py: opaque handles, field-value
results with `.nvmlReturn` and `.value.*`, a `c_nvmlGpmMetricsGet_t`-like request), raises
the real `pynvml.NVMLError` subclasses, and makes a call block like a wedged driver while a
scenario `hang` fault applies. Every value is read from the node at the simulated time of
the call, so the fake and the generated sysfs tree always agree, and a fixed clock gives
fixed output.

Hardware behaviour it reproduces, as real drivers show it: a lost GPU answers `GpuIsLost` to
every call; link indices past the real count answer `InvalidArgument`; GPUs without GPM
answer `NotSupported`; NVLink5 field values and NVLink-fabric info exist only where the
scenario says so; MIG (the scenario's `mig:`) has MIG device handles by slot (NotFound for an
empty slot or an instance that disappeared), their UUID, GPU and compute instance ids, name
with the profile, memory, and GPM samples per GPU instance (`nvmlGpmMigSampleGet`);
`nvmlEventSetWait_v2` raises `Timeout` when idle and has no history before the set was
created. The tests' controls (a failure injected into any call, profiling counters held by
another tool, an Xid delivered now) live with the tests, in a subclass. The node's kernel
log, which the Xid collector reads beside NVML events, is kernel_log.py.
"""

from __future__ import annotations

import functools
import re
import threading
import uuid
from typing import Any, Final

import pynvml

from fleetwatch.collectors.sources.nvml import CLOCK_EVENT_BITS, NVLINK5_FIELDS, VIOLATION_FIELDS
from fleetwatch.collectors.sources.pci import nvml_bus_id
from fleetwatch.sim.nvml_records import (
    FakeEventData,
    FakeEventSet,
    FakeFieldValue,
    FakeGpmMetricsGet,
    FakeGpmSample,
    FakeHandle,
    FakeMigHandle,
    FakeStruct,
    FakeValue,
)
from fleetwatch.sim.scenario import MIG_SLOTS, MigSpec
from fleetwatch.sim.sysfs_tree import gpu_pci_address
from fleetwatch.sim.world import (
    GPU_MAX_CELSIUS,
    MEMORY_MAX_CELSIUS,
    SHUTDOWN_CELSIUS,
    SLOWDOWN_CELSIUS,
    SimulatedNode,
)

_THRESHOLDS: Final = {
    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: SHUTDOWN_CELSIUS,
    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: SLOWDOWN_CELSIUS,
    pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: MEMORY_MAX_CELSIUS,
    pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: GPU_MAX_CELSIUS,
}
_VIOLATION_FIELDS: Final = {field_id: name for name, field_id in VIOLATION_FIELDS.items()}
_NVLINK_COUNTERS: Final = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")
_NVLINK5_FIELDS: Final = frozenset(NVLINK5_FIELDS.values())
_SUPPORTED_EVENTS: Final[int] = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)
_SM_CLOCK_MHZ: Final = 1980
_SM_CLOCK_THROTTLED_MHZ: Final = 1410
_MEMORY_CLOCK_MHZ: Final = 2619
_DEFAULT_MEMORY_MIB: Final = 81559
# A healthy NVLink-fabric health mask: every reported field reads "false" (2).
_FABRIC_HEALTHY_MASK: Final = (
    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
    << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
    | pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_FALSE
    << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY
    | pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE
    << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
)
_FABRIC_DEGRADED_MASK: Final = (
    _FABRIC_HEALTHY_MASK
    & ~(
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW
        << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
    )
    | pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
    << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
)
# What pynvml exposes that the fake passes through unchanged: constants and error classes.
_PASSTHROUGH: Final = re.compile(r"^(NVML_|NVMLError|nvmlClocksEventReason|nvmlEventType)")
_DEVICE_QUERY: Final = re.compile(r"^nvmlDeviceGet[A-Z]\w*$")


class FakeNvml:
    """The `pynvml` subset the GPU collectors call, answered by a `SimulatedNode`."""

    c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet

    def __init__(self, *, node: SimulatedNode) -> None:
        self.node = node
        self.scenario = node.scenario
        self.init_calls = 0
        self.live_gpm_samples = 0
        self._hang_calls = self.node.hang_calls()
        self._wake = threading.Condition()
        self._memory_total = int(self.scenario.extra.get("memory_total_mib", _DEFAULT_MEMORY_MIB))
        clique = self.scenario.extra.get("fabric_clique_id")
        self._fabric_clique = None if clique is None else int(clique)

    def __getattr__(self, name: str) -> Any:
        """Constants and error classes come from the real pynvml. A real per-device query
        the fake does not implement answers NotSupported, as a GPU without the feature does:
        a collector reading a new value runs on the simulator (the value absent) before the
        fake learns it. Any other name, a misspelt call included, is an AttributeError."""
        if _PASSTHROUGH.match(name):
            return getattr(pynvml, name)
        if _DEVICE_QUERY.match(name) and callable(getattr(pynvml, name, None)):
            return functools.partial(self._not_supported, name)
        raise AttributeError(f"FakeNvml does not implement {name}")

    def _not_supported(self, call: str, handle: FakeHandle, *_args: Any) -> Any:
        """A device query the fake does not implement: the GPU does not support it (a lost
        GPU still answers GpuIsLost, a hung call still hangs)."""
        self._gpu(call, handle)
        raise pynvml.NVMLError_NotSupported()

    # -- plumbing --------------------------------------------------------------------------
    def _enter(self, call: str, handle: FakeHandle | None) -> int | None:
        """What every device call does first: a scenario's hang, a lost GPU."""
        gpu = None if handle is None else handle.index
        if call in self._hang_calls:
            self.node.block_for_hang(call, gpu)
        if gpu is not None and self.node.gpu_lost(gpu):
            raise pynvml.NVMLError_GpuIsLost()
        return gpu

    def _gpu(self, call: str, handle: FakeHandle) -> int:
        gpu = self._enter(call, handle)
        assert gpu is not None
        return gpu

    # -- system ----------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._enter("nvmlInit", None)
        self.init_calls += 1

    def nvmlShutdown(self) -> None:
        self.init_calls -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.scenario.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount", None)
        return self.scenario.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        if not 0 <= index < self.scenario.gpus:
            raise pynvml.NVMLError_InvalidArgument()
        handle = FakeHandle(index)
        self._enter("nvmlDeviceGetHandleByIndex", handle)
        return handle

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetIndex", handle)

    # -- identity --------------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: FakeHandle | FakeMigHandle) -> str:
        if isinstance(handle, FakeMigHandle):
            self._mig("nvmlDeviceGetName", handle)
            return f"{self.scenario.gpu_model} MIG {self._mig_spec().profile}"
        self._gpu("nvmlDeviceGetName", handle)
        return self.scenario.gpu_model

    def nvmlDeviceGetUUID(self, handle: FakeHandle | FakeMigHandle) -> str:
        if isinstance(handle, FakeMigHandle):
            gpu = self._mig("nvmlDeviceGetUUID", handle)
            return f"MIG-{self._uuid(f'{gpu}/mig/{handle.slot}')}"
        gpu = self._gpu("nvmlDeviceGetUUID", handle)
        return f"GPU-{self._uuid(str(gpu))}"

    def _uuid(self, thing: str) -> uuid.UUID:
        """A stable UUID for a thing of this scenario (a GPU, a MIG device, the fabric)."""
        return uuid.uuid5(uuid.NAMESPACE_URL, f"fleetwatch-sim/{self.scenario.name}/{thing}")

    def nvmlDeviceGetSerial(self, handle: FakeHandle) -> str:
        gpu = self._gpu("nvmlDeviceGetSerial", handle)
        return str(1654922000000 + gpu)

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> FakeStruct:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        return FakeStruct({"busId": simulated_pci_bus_id(gpu).encode()})

    # -- thermals, power, clocks -----------------------------------------------------------
    def nvmlDeviceGetTemperatureV(self, handle: FakeHandle, sensor: int, version: int = 0) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperatureV", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return round(self.node.gpu_temperature(gpu))

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        return round(self.node.gpu_temperature(gpu))

    def nvmlDeviceGetTemperatureThreshold(self, handle: FakeHandle, threshold: int) -> int:
        self._gpu("nvmlDeviceGetTemperatureThreshold", handle)
        if threshold not in _THRESHOLDS:
            raise pynvml.NVMLError_NotSupported()
        return round(_THRESHOLDS[threshold])

    def nvmlDeviceGetMarginTemperature(self, handle: FakeHandle) -> int:
        """The distance to the slowdown limit, as a driver that reports it answers."""
        gpu = self._gpu("nvmlDeviceGetMarginTemperature", handle)
        return round(SLOWDOWN_CELSIUS) - round(self.node.gpu_temperature(gpu))

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        gpu = self._gpu("nvmlDeviceGetPowerUsage", handle)
        return round(self.node.power_watts(gpu) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle)
        return round(self.scenario.baseline.power_limit_watts * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle)
        return round(self.node.energy_joules(gpu) * 1000)

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        if clock == pynvml.NVML_CLOCK_MEM:
            return _MEMORY_CLOCK_MHZ
        slowed = self.node.throttle_reasons(gpu) - {"gpu_idle", "sync_boost"}
        return _SM_CLOCK_THROTTLED_MHZ if slowed else _SM_CLOCK_MHZ

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        gpu = self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle)
        bits = 0
        for reason in self.node.throttle_reasons(gpu):
            bits |= CLOCK_EVENT_BITS[reason]
        return bits

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> FakeStruct:
        """NVML "utilization": time any kernel ran; stays high while tensor cores idle."""
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        busy = self.node.tensor_active(gpu) > 0
        percent = round(self.scenario.baseline.utilization * 100) if busy else 0
        return FakeStruct({"gpu": percent, "memory": round(percent * 0.4)})

    # -- memory and health -------------------------------------------------------------------
    def nvmlDeviceGetMemoryInfo(
        self, handle: FakeHandle | FakeMigHandle, version: int | None = None
    ) -> FakeStruct:
        if isinstance(handle, FakeMigHandle):
            self._mig("nvmlDeviceGetMemoryInfo", handle)
            total = self._mig_spec().memory_mib * 1024 * 1024
        else:
            self._gpu("nvmlDeviceGetMemoryInfo", handle)
            total = self._memory_total * 1024 * 1024
        used = int(total * self.scenario.baseline.memory_used_ratio)
        return FakeStruct({"total": total, "used": used, "free": total - used})

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, error_type: int, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        return self.node.ecc_errors(gpu, "corrected" if corrected else "uncorrected")

    def nvmlDeviceGetRemappedRows(self, handle: FakeHandle) -> tuple[int, int, int, int]:
        gpu = self._gpu("nvmlDeviceGetRemappedRows", handle)
        state = self.node.row_remap(gpu)
        return (state["correctable"], state["uncorrectable"], state["pending"], state["failure"])

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeHandle) -> int:
        self._gpu("nvmlDeviceGetPcieReplayCounter", handle)
        return 0

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeHandle) -> int:
        self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        return 5

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeHandle) -> int:
        self._gpu("nvmlDeviceGetMaxPcieLinkGeneration", handle)
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeHandle) -> int:
        self._gpu("nvmlDeviceGetCurrPcieLinkWidth", handle)
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeHandle) -> int:
        self._gpu("nvmlDeviceGetMaxPcieLinkWidth", handle)
        return 16

    # -- NVLink fabric (NVL72) ---------------------------------------------------------------
    def nvmlDeviceGetGpuFabricInfoV(self, handle: FakeHandle, info: Any) -> int:
        """Fills the `c_nvmlGpuFabricInfo_v2_t` that `info` points to (`ctypes.pointer`).

        Only a scenario with `extra.fabric_clique_id` sits on an NVLink fabric; elsewhere
        the call answers NotSupported, like a GPU outside an NVLink-switch domain.
        """
        gpu = self._gpu("nvmlDeviceGetGpuFabricInfoV", handle)
        if self._fabric_clique is None:
            raise pynvml.NVMLError_NotSupported()
        fabric = info.contents
        if fabric.version != pynvml.nvmlGpuFabricInfo_v2:
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        cluster = self._uuid("fabric")
        fabric.clusterUuid[:] = list(cluster.bytes)
        fabric.status = pynvml.NVML_SUCCESS
        fabric.cliqueId = self._fabric_clique
        fabric.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        degraded = self.node.fabric_degraded(gpu)
        fabric.healthMask = _FABRIC_DEGRADED_MASK if degraded else _FABRIC_HEALTHY_MASK
        return int(pynvml.NVML_SUCCESS)

    # -- MIG -------------------------------------------------------------------------------
    def _mig_spec(self) -> MigSpec:
        """The scenario's MIG layout; NotSupported (a GPU without MIG) when it has none."""
        if self.scenario.mig is None:
            raise pynvml.NVMLError_NotSupported()
        return self.scenario.mig

    def _mig(self, call: str, handle: FakeMigHandle) -> int:
        """What every call on a MIG handle does first: the GPU's checks, then NotFound for
        an instance that is gone (MIG mode off, or destroyed by a fault)."""
        gpu = self._gpu(call, FakeHandle(handle.gpu))
        spec = self._mig_spec()
        live = handle.slot < spec.instances and self.node.mig_enabled(gpu)
        if not live or self.node.mig_gone(gpu, handle.slot):
            raise pynvml.NVMLError_NotFound()
        return gpu

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        """[current, pending]: a `mig_mode` fault models a switch already applied by a reset."""
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        self._mig_spec()
        mode = int(self.node.mig_enabled(gpu))
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeHandle) -> int:
        self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
        self._mig_spec()
        return MIG_SLOTS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeHandle, slot: int) -> FakeMigHandle:
        """The MIG device in `slot`; NotFound for an empty slot, as NVML answers."""
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        spec = self._mig_spec()
        if not 0 <= slot < MIG_SLOTS:
            raise pynvml.NVMLError_InvalidArgument()
        if not self.node.mig_enabled(gpu) or slot >= spec.instances:
            raise pynvml.NVMLError_NotFound()
        return FakeMigHandle(gpu, slot)

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeMigHandle) -> int:
        """GPU instance ids count from 1 in slot order; one compute instance (0) each."""
        self._mig("nvmlDeviceGetGpuInstanceId", handle)
        return handle.slot + 1

    def nvmlDeviceGetComputeInstanceId(self, handle: FakeMigHandle) -> int:
        self._mig("nvmlDeviceGetComputeInstanceId", handle)
        return 0

    # -- field values ----------------------------------------------------------------------
    def nvmlDeviceGetFieldValues(
        self, handle: FakeHandle, field_ids: list[int | tuple[int, int]]
    ) -> list[FakeFieldValue]:
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        return [self._field(gpu, fid) for fid in field_ids]

    def _field(self, gpu: int, requested: int | tuple[int, int]) -> FakeFieldValue:
        field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
        result = FakeFieldValue(fieldId=field_id, scopeId=scope, nvmlReturn=pynvml.NVML_SUCCESS)
        value: float | None = None
        if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
            value = round(self.node.memory_temperature(gpu))
        elif field_id in _VIOLATION_FIELDS:
            value = round(self.node.throttle_seconds(gpu, _VIOLATION_FIELDS[field_id]) * 1e9)
        elif field_id == 230:
            value = 1 if self.node.row_remap(gpu)["pending"] else 0
        elif field_id in _NVLINK5_FIELDS and self.scenario.nvlink5_counters:
            if scope >= self.scenario.nvlinks_per_gpu:
                result.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
                return result
            value = self._nvlink5(gpu, scope, field_id)
        if value is None:
            result.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            return result
        result.value = FakeValue(
            dVal=float(value), uiVal=int(value), ulVal=int(value), ullVal=int(value)
        )
        return result

    def _nvlink5(self, gpu: int, link: int, field_id: int) -> int:
        """NVLink5 counters: symbol errors are what the CRC faults look like on the wire."""
        crc_flit = self.node.nvlink_errors(gpu, link, "crc_flit")
        crc_data = self.node.nvlink_errors(gpu, link, "crc_data")
        if field_id == 221:
            return crc_flit + crc_data
        if field_id == 219:
            return crc_data
        return 0

    # -- NVLink ----------------------------------------------------------------------------
    def _link(self, call: str, handle: FakeHandle, link: int) -> int:
        gpu = self._gpu(call, handle)
        if not 0 <= link < self.scenario.nvlinks_per_gpu:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        gpu = self._link("nvmlDeviceGetNvLinkState", handle, link)
        return int(self.node.nvlink_up(gpu, link))

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: FakeHandle, link: int, counter: int) -> int:
        gpu = self._link("nvmlDeviceGetNvLinkErrorCounter", handle, link)
        if not 0 <= counter < len(_NVLINK_COUNTERS):
            raise pynvml.NVMLError_InvalidArgument()
        return self.node.nvlink_errors(gpu, link, _NVLINK_COUNTERS[counter])

    # -- GPM -------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: FakeHandle) -> FakeStruct:
        self._gpu("nvmlGpmQueryDeviceSupport", handle)
        return FakeStruct({"version": 1, "isSupportedDevice": int(self.scenario.gpm_supported)})

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:
        self.live_gpm_samples += 1
        return FakeGpmSample()

    def nvmlGpmSampleFree(self, sample: FakeGpmSample) -> None:
        if sample.freed:
            raise pynvml.NVMLError_InvalidArgument()
        sample.freed = True
        self.live_gpm_samples -= 1

    def nvmlGpmSampleGet(self, handle: FakeHandle, sample: FakeGpmSample) -> FakeGpmSample:
        gpu = self._gpu("nvmlGpmSampleGet", handle)
        if not self.scenario.gpm_supported:
            raise pynvml.NVMLError_NotSupported()
        sample.gpu, sample.at = gpu, self.node.now()
        return sample

    def nvmlGpmMigSampleGet(
        self, handle: FakeHandle, gpu_instance: int, sample: FakeGpmSample
    ) -> FakeGpmSample:
        """A GPM sample of one GPU instance (id from `nvmlDeviceGetGpuInstanceId`)."""
        gpu = self._gpu("nvmlGpmMigSampleGet", handle)
        if not self.scenario.gpm_supported:
            raise pynvml.NVMLError_NotSupported()
        self._mig("nvmlGpmMigSampleGet", FakeMigHandle(gpu, gpu_instance - 1))
        sample.gpu, sample.at, sample.gpu_instance = gpu, self.node.now(), gpu_instance
        return sample

    def nvmlGpmMetricsGet(self, request: FakeGpmMetricsGet) -> FakeGpmMetricsGet:
        self._enter("nvmlGpmMetricsGet", None)
        first, second = request.sample1, request.sample2
        if (
            request.version != pynvml.NVML_GPM_METRICS_GET_VERSION
            or first is None
            or second is None
            or first.gpu is None
            or first.gpu != second.gpu
            or first.gpu_instance != second.gpu_instance
            or second.at is None
        ):
            raise pynvml.NVMLError_InvalidArgument()
        values = self._gpm_values(first.gpu, second.at)
        for metric in request.metrics[: request.numMetrics]:
            value = values.get(metric.metricId)
            metric.nvmlReturn = (
                pynvml.NVML_SUCCESS if value is not None else (pynvml.NVML_ERROR_NOT_SUPPORTED)
            )
            metric.value = 0.0 if value is None else value
        return request

    def _gpm_values(self, gpu: int, t: float) -> dict[int, float]:
        """GPM metrics (percent, MiB/s) over the interval ending at `t`."""
        tensor = self.node.tensor_active(gpu, t) * 100
        sm = self.node.sm_active(gpu, t) * 100
        nvlink_mib = self.node.nvlink_throughput(gpu, t) / (1024 * 1024)
        return {
            pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: self.scenario.baseline.utilization * 100,
            pynvml.NVML_GPM_METRIC_SM_UTIL: round(sm, 2),
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: round(sm * 0.6, 2),
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: round(tensor, 2),
            pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: round(tensor * 0.95, 2),
            pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: 0.0,
            pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: 0.0,
            pynvml.NVML_GPM_METRIC_DMMA_TENSOR_UTIL: round(tensor * 0.05, 2),
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: round(min(100.0, tensor * 1.2), 2),
            pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: round(nvlink_mib * 0.98, 1),
            pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: round(nvlink_mib, 1),
        }

    # -- events ----------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._enter("nvmlEventSetCreate", None)
        return FakeEventSet(created_at=self.node.now())

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeHandle) -> int:
        self._gpu("nvmlDeviceGetSupportedEventTypes", handle)
        return _SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, mask: int, events: FakeEventSet) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        if mask & ~_SUPPORTED_EVENTS:
            raise pynvml.NVMLError_NotSupported()
        events.gpus.add(gpu)

    def nvmlEventSetWait_v2(self, events: FakeEventSet, timeout_ms: int) -> FakeEventData:
        """The next Xid for a registered GPU; `Timeout` after `timeout_ms` without one."""
        self._enter("nvmlEventSetWait_v2", None)
        with self._wake:
            event = self._next_event(events)
            if event is None:
                self._wake.wait(timeout_ms / 1000)
                event = self._next_event(events)
        if event is None:
            raise pynvml.NVMLError_Timeout()
        gpu, xid = event
        return FakeEventData(
            device=FakeHandle(gpu), eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid
        )

    def _next_event(self, events: FakeEventSet) -> tuple[int, int] | None:
        """The next scheduled Xid the set has not delivered (called holding `_wake`)."""
        scheduled = self.node.xid_events()
        while events.delivered < len(scheduled):
            at, gpu, xid = scheduled[events.delivered]
            events.delivered += 1
            # NVML keeps no history: Xids from before the set existed are never delivered.
            if at >= events.created_at and gpu in events.gpus:
                return gpu, xid
        return None

    def nvmlEventSetFree(self, events: FakeEventSet) -> None:
        events.freed = True


def simulated_pci_bus_id(gpu: int) -> str:
    """The PCI bus id NVML reports for a simulated GPU (`00000000:18:00.0`): the address
    it has in the simulated sysfs tree."""
    return nvml_bus_id(gpu_pci_address(gpu))
