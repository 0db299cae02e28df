"""Xid events through the NVML source: NVML's critical-error events, one GPU and Xid each.

An event set registered on every GPU that has the events, a wait with a timeout (so the
listener thread stops promptly), and its release. NVML keeps no history: an Xid raised
while no one waited is not reported (the kernel log has it).
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import Any, Final

import pynvml

from fleetwatch.collectors.sources.nvml import Gpu, NvmlSource
from fleetwatch.collectors.sources.nvml_calls import classified, error_name

log = logging.getLogger(__name__)

XID_EVENT_MASK: Final = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)


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


def open_xid_events(source: NvmlSource) -> Any | None:
    """An event set registered for Xid (and ECC) events on every GPU that has them.

    None without GPUs; `NvmlError` when NVML cannot create the set.
    """
    gpus = source.gpus()
    if not gpus:
        return None
    with classified("nvmlEventSetCreate"):
        event_set = source.lib.nvmlEventSetCreate()
    for gpu in gpus:
        try:
            mask = int(source.lib.nvmlDeviceGetSupportedEventTypes(gpu.handle)) & XID_EVENT_MASK
            if mask:
                source.lib.nvmlDeviceRegisterEvents(gpu.handle, mask, event_set)
        except pynvml.NVMLError as exc:
            log.warning(
                "Xid events unavailable for a GPU",
                extra={"gpu": gpu.index, "reason": error_name(exc)},
            )
    return event_set


def wait_xid(source: NvmlSource, event_set: Any, timeout_ms: int) -> XidEvent | None:
    """The next Xid event, or None when none came within the timeout; `NvmlError` when
    the wait itself fails."""
    with classified("nvmlEventSetWait_v2"):
        try:
            data = source.lib.nvmlEventSetWait_v2(event_set, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return None
    if not int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
        return None
    gpu = _gpu_of(source, data.device)
    if gpu is None:
        return None
    return XidEvent(gpu=gpu.index, uuid=gpu.identity.uuid, xid=int(data.eventData))


def _gpu_of(source: NvmlSource, handle: Any) -> Gpu | None:
    """The GPU of an event's handle, without an NVML call (a lost GPU answers none)."""
    key = _handle_key(handle)
    return next((g for g in source.gpus() if _handle_key(g.handle) == key), None)


def free_events(source: NvmlSource, event_set: Any) -> None:
    """Release an event set from `open_xid_events`; `NvmlError` when NVML refuses."""
    with classified("nvmlEventSetFree"):
        source.lib.nvmlEventSetFree(event_set)
