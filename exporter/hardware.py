"""The exporter's hardware set-up: the real node, or a simulated one standing in for it.

Collectors never branch on simulation. This module builds what they read, the
`CollectorContext`, from the real node (`pynvml`, `--path.sysfs`, `/dev/kmsg`,
infiniband-diags on `PATH`). Under `--simulate` it hands over to the simulator
(`fleetwatch.sim.exporter_hardware`), imported only then: the exporter on a real node loads
no simulator module (tests/exporter/test_lean.py reads a real process's modules).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fleetwatch.collectors.base import CollectorContext
from fleetwatch.exporter.machine import Hardware
from fleetwatch.exporter.settings import ExportSettings


def real_hardware(settings: ExportSettings) -> Hardware:
    """The node itself: `pynvml`, `--path.sysfs`, the kernel log and tools on PATH."""
    import pynvml

    context = CollectorContext(
        sysfs_root=settings.sysfs_root,
        procfs_root=settings.procfs_root,
        rootfs_root=settings.rootfs_root,
        nvml=pynvml,
    )
    return Hardware(context=context, settings=settings)


@contextlib.contextmanager
def hardware(settings: ExportSettings) -> Iterator[Hardware]:
    """Real hardware, or the `--simulate` scenario in a temporary sysfs tree (removed after)."""
    if settings.simulate is None:
        yield real_hardware(settings)
        return
    from fleetwatch.sim.exporter_hardware import scenario_hardware

    with scenario_hardware(settings.simulate, settings) as simulated:
        yield simulated
