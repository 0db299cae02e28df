"""Hotplug events for the fabric collector, from udev through pyudev.

A `pyudev.Monitor` on the kernel's udev netlink socket, filtered to the `infiniband`,
`net` and `pci` subsystems, buffers events between collections; `DeviceEvents.drain()`
takes them without blocking, so a collection sees every add/remove/change since the last
one and re-discovers at once. Where udev cannot be reached (a container without the
host's netlink, no libudev), `open_device_events` logs that once and returns a source
that never has events: the collector then relies on periodic re-discovery alone.

Tests feed synthetic events through the same `EventMonitor` interface pyudev's Monitor
offers (`poll(timeout)` returning objects with `subsystem` and `action`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

log = logging.getLogger(__name__)

WATCHED_SUBSYSTEMS: Final = ("infiniband", "net", "pci")
_DRAIN_LIMIT: Final = 10_000


class UdevDevice(Protocol):
    """What a pyudev `Device` from a monitor offers that we use."""

    @property
    def subsystem(self) -> str | None: ...

    @property
    def action(self) -> str | None: ...


class EventMonitor(Protocol):
    """pyudev's `Monitor.poll`: the next event, or None when none arrives in `timeout`."""

    def poll(self, timeout: float | None = None) -> UdevDevice | None: ...


@dataclass(frozen=True)
class HotplugEvent:
    """One udev event, reduced to what the collector counts."""

    subsystem: str
    action: str


class DeviceEvents:
    """Non-blocking access to buffered hotplug events; `monitor=None` means unavailable."""

    def __init__(self, *, monitor: EventMonitor | None) -> None:
        self._monitor = monitor
        self.lost = False

    def drain(self) -> list[HotplugEvent]:
        """Every event buffered since the last drain.

        If the socket failed (its buffer overflowed: events were dropped), `lost` is set
        so the caller re-discovers anyway.
        """
        self.lost = False
        events: list[HotplugEvent] = []
        if self._monitor is None:
            return events
        for _ in range(_DRAIN_LIMIT):
            try:
                device = self._monitor.poll(timeout=0)
            except OSError as exc:
                log.warning("udev monitor read failed; events may be lost",
                            extra={"reason": str(exc)})  # fmt: skip
                self.lost = True
                break
            if device is None:
                break
            events.append(
                HotplugEvent(
                    subsystem=device.subsystem or "unknown", action=device.action or "unknown"
                )
            )
        return events

    def close(self) -> None:
        """Drop the monitor: pyudev closes its netlink socket with the last reference."""
        self._monitor = None


def open_device_events(subsystems: Sequence[str] = WATCHED_SUBSYSTEMS) -> DeviceEvents:
    """A udev monitor for `subsystems`, or an event-less source (logged once) without udev."""
    try:
        import pyudev

        monitor = pyudev.Monitor.from_netlink(pyudev.Context())
        for subsystem in subsystems:
            monitor.filter_by(subsystem=subsystem)
        monitor.start()
    except (ImportError, OSError, ValueError) as exc:
        log.warning(
            "udev events unavailable; InfiniBand devices are re-discovered periodically only",
            extra={"reason": f"{type(exc).__name__}: {exc}"},
        )
        return DeviceEvents(monitor=None)
    return DeviceEvents(monitor=monitor)
