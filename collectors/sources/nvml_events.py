"""Xid events through the NVML source: NVML's critical-error events, one GPU and Xid each.

An event set, each GPU that has the events registered on it, the events it holds taken
without waiting, and its release. The driver queues each event for the set until it is
taken (the kernel module appends it to the open file's list, unbounded), so the Xid
collector takes them at each run instead of sleeping inside NVML: a blocked call would hold
its thread until its timeout at every stop, and on NVIDIA's mock NVML (a Go library) a
waiting call keeps Go's runtime polling the whole time. NVML keeps no history from before
the set was registered: an Xid raised while no exporter ran is not reported (the kernel log
has it).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import pynvml

from fleetwatch.collectors.sources.nvml import Gpu, NvmlSource
from fleetwatch.collectors.sources.nvml_calls import ABSENT, classified

XID_EVENT_MASK: Final = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)
# Events taken in one look at most; the rest stay queued for the next (a driver that never
# answered "none left" must not hold the listener).
EVENTS_A_LOOK: Final = 1000


@dataclass(frozen=True, kw_only=True)
class XidEvent:
    """An NVML critical-error event: the Xid raised by one GPU."""

    gpu: int
    uuid: str
    xid: int


def _handle_key(handle: Any) -> Any:
    """What identifies a device handle: the address a pynvml handle points to."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):  # the fake NVML's handles are plain values
        return handle


def create_event_set(source: NvmlSource) -> Any:
    """A new, empty NVML event set; `NvmlError` when NVML cannot create one."""
    with classified("nvmlEventSetCreate"):
        return source.lib.nvmlEventSetCreate()


def register_xids(source: NvmlSource, event_set: Any, gpu: Gpu) -> bool:
    """Register `gpu`'s Xid (and ECC) events on the set: False when the GPU has none (not
    supported); `NvmlError` (or `GpuLostError`) when a call failed, the GPU not registered."""
    with classified("nvmlDeviceGetSupportedEventTypes", gpu=gpu.index):
        try:
            mask = int(source.lib.nvmlDeviceGetSupportedEventTypes(gpu.handle)) & XID_EVENT_MASK
        except ABSENT:
            return False
    if not mask:
        return False
    with classified("nvmlDeviceRegisterEvents", gpu=gpu.index):
        try:
            source.lib.nvmlDeviceRegisterEvents(gpu.handle, mask, event_set)
        except ABSENT:
            return False
    return True


def ready_xids(
    source: NvmlSource, event_set: Any, *, limit: int = EVENTS_A_LOOK
) -> Iterator[XidEvent]:
    """The Xid events queued for the set, taken without waiting (NVML's wait with a zero
    timeout answers the next queued event, or `Timeout` when none is left); other events
    of the set (ECC) are taken and passed over. At most `limit` are taken. `NvmlError` when
    a wait fails: the events yielded before it are taken."""
    for _ in range(limit):
        with classified("nvmlEventSetWait_v2"):
            try:
                data = source.lib.nvmlEventSetWait_v2(event_set, 0)
            except pynvml.NVMLError_Timeout:
                return
        if not int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
            continue
        gpu = _gpu_of(source, data.device)
        if gpu is not None:
            yield XidEvent(gpu=gpu.index, uuid=gpu.identity.uuid, xid=int(data.eventData))


def _gpu_of(source: NvmlSource, handle: Any) -> Gpu | None:
    """The GPU of an event's handle, without an NVML call (a lost GPU answers none)."""
    key = _handle_key(handle)
    return next((g for g in source.gpus() if _handle_key(g.handle) == key), None)


def free_events(source: NvmlSource, event_set: Any) -> None:
    """Release an event set from `create_event_set`; `NvmlError` when NVML refuses."""
    with classified("nvmlEventSetFree"):
        source.lib.nvmlEventSetFree(event_set)
