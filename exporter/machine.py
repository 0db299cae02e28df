"""What the exporter runs on: the collectors' hardware and the settings built for it.

`fleetwatch.exporter.hardware` builds it from the real node and
`fleetwatch.sim.exporter_hardware` from a scenario; both import this type from here, so the
simulator never imports the module that loads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleetwatch.collectors.base import CollectorContext
from fleetwatch.exporter.settings import ExportSettings

Refresh = Callable[[], None]
"""Rewrites the simulated sysfs tree as simulated time moves."""


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """What the collectors read, and the settings they are built with on this hardware.

    `refresh` is None on real hardware; under simulation the exporter calls it every
    second so the generated sysfs tree (and procfs mount files) follow simulated time.
    """

    context: CollectorContext
    settings: ExportSettings
    refresh: Refresh | None = None
