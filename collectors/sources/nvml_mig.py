"""MIG through the NVML source: each GPU's MIG mode and, in MIG mode, its MIG instances.

Typed readings in NVML's units, as `nvml` gives for whole GPUs: what identifies a MIG
device (its UUID, GPU instance, compute instance, profile) and its memory. The mode and the
instances are read afresh on every call, so a GPU that switches MIG mode while the exporter
runs is followed without a restart; a slot whose handle fails after enumeration is left out
with its failure, the other instances are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import pynvml

from fleetwatch.collectors.sources.nvml import Gpu, NvmlSource, text
from fleetwatch.collectors.sources.nvml_calls import CallFailure, Calls

# The calls that identify a MIG device, in the order they are made on its handle.
_MIG_IDENTITY: Final = (
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetName",
)


@dataclass(frozen=True, kw_only=True)
class MigInstance:
    """One MIG device of a GPU in MIG mode: what identifies it and its memory (bytes)."""

    slot: int
    """Its index for `nvmlDeviceGetMigDeviceHandleByIndex`."""
    uuid: str
    gpu_instance: int
    compute_instance: int
    profile: str
    """The profile as NVML names the device (`1g.10gb`), "" when the name carries none."""
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None


@dataclass(frozen=True, kw_only=True)
class MigFailure:
    """A MIG call that failed, with the slot it was about (a handle that disappeared)."""

    slot: int | None
    """The MIG slot, or None for a call about the whole GPU (its mode, its slot count)."""
    failure: CallFailure


@dataclass(frozen=True, kw_only=True)
class MigReading:
    """A GPU's MIG state this cycle: its mode and, in MIG mode, every MIG instance.

    `current`/`pending` are None on a GPU without MIG (`NotSupported`); `failures` name the
    slots whose instance could not be read (the others are in `instances`).
    """

    current: bool | None = None
    pending: bool | None = None
    instances: tuple[MigInstance, ...] = ()
    failures: tuple[MigFailure, ...] = ()


def mig_profile(name: str) -> str:
    """The MIG profile in a MIG device's name: `NVIDIA H100 80GB HBM3 MIG 1g.10gb` →
    `1g.10gb`; "" when the name has no `MIG ` part."""
    _, marker, profile = name.rpartition("MIG ")
    return profile.strip() if marker else ""


def read_mig(source: NvmlSource, gpu: Gpu) -> MigReading:
    """The GPU's MIG mode and, in MIG mode, its instances, enumerated afresh each call.

    Read every cycle, so a GPU that switches MIG mode while the exporter runs (after a
    GPU reset) shows its new instances, or none, without a restart. An empty slot
    answers NotFound; an instance whose handle fails after enumeration (destroyed
    meanwhile) is left out and its failure kept with its slot, the others are read.
    Raises `GpuLostError`.
    """
    calls = Calls(source.lib, gpu.index)
    mode = calls.get("nvmlDeviceGetMigMode", gpu.handle)
    failures = [MigFailure(slot=None, failure=f) for f in calls.failures]
    if mode is None:
        return MigReading(failures=tuple(failures))
    current, pending = (int(m) == pynvml.NVML_DEVICE_MIG_ENABLE for m in mode)
    if not current:
        return MigReading(current=current, pending=pending, failures=tuple(failures))
    instances: list[MigInstance] = []
    count = calls.get("nvmlDeviceGetMaxMigDeviceCount", gpu.handle)
    failures.extend(MigFailure(slot=None, failure=f) for f in calls.failures[len(failures) :])
    for slot in range(int(count or 0)):
        slot_calls = Calls(source.lib, gpu.index)
        instance = _mig_instance(source, slot_calls, gpu, slot)
        if instance is not None:
            instances.append(instance)
        failures.extend(MigFailure(slot=slot, failure=f) for f in slot_calls.failures)
    return MigReading(
        current=current, pending=pending, instances=tuple(instances), failures=tuple(failures)
    )


def _mig_instance(source: NvmlSource, calls: Calls, gpu: Gpu, slot: int) -> MigInstance | None:
    """The MIG instance in `slot`; None for an empty slot (NotFound) or when a call
    about it failed (kept in `calls`: NotFound once the handle was found counts, the
    instance disappeared). Memory that fails is absent; the instance still counts."""
    try:
        handle = source.lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
    except pynvml.NVMLError_NotFound:
        return None
    except pynvml.NVMLError as exc:
        calls.sort("nvmlDeviceGetMigDeviceHandleByIndex", exc)
        return None
    identity: list[Any] = []
    for call in _MIG_IDENTITY:
        value = calls.get(call, handle)
        if value is None:  # the first failure says it; the next calls would repeat it
            return None
        identity.append(value)
    mig_uuid, gpu_instance, compute_instance, name = identity
    memory = calls.get("nvmlDeviceGetMemoryInfo", handle)
    return MigInstance(
        slot=slot,
        uuid=text(mig_uuid),
        gpu_instance=int(gpu_instance),
        compute_instance=int(compute_instance),
        profile=mig_profile(text(name)),
        memory_used_bytes=None if memory is None else float(memory.used),
        memory_total_bytes=None if memory is None else float(memory.total),
    )
