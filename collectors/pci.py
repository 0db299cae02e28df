"""PCI collector: the NVIDIA GPUs on the PCI bus, counted from sysfs without NVML.

NVML lists the GPUs its driver initialised; a GPU that the driver lost, or that failed to
initialise after a reboot, is missing there but still a PCI function until it falls off
the bus. `fleetwatch_gpus_pci_present` beside `fleetwatch_gpus_visible` tells the two
apart with no configured expectation, and keeps reporting when NVML does not start at all
(this collector never calls it). `fleetwatch_gpu_pci_info` names each GPU by the bus id
NVML uses, so `fleetwatch_gpu_pci_info unless on(node, pci_bus_id) fleetwatch_gpu_info` is the
GPU NVML lost.

A node without PCI sysfs has no series (not a GPU node, not a failure); a node with PCI
sysfs and no NVIDIA GPU reads 0. The bus is listed every cycle, and a function's ids are
read when it appears (`PciBus`): a GPU that falls off the bus or comes back shows in the
next cycle, without a few hundred reads of fixed ids every cycle.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

from fleetwatch.catalog import collected_by
from fleetwatch.catalog.pci import GPU_PCI_INFO, GPUS_PCI_PRESENT, PCI_SYSFS_READ_ERRORS_TOTAL
from fleetwatch.collectors.base import CollectorContext, CollectorSpec, NoSettings
from fleetwatch.collectors.families import FamilyBuilder, LabelCache, SeriesFamily
from fleetwatch.collectors.sources.files import ReadProblems
from fleetwatch.collectors.sources.pci import PciBus, nvml_bus_id
from fleetwatch.logs import LogOnce

log = logging.getLogger(__name__)

READ_ERRORS = PCI_SYSFS_READ_ERRORS_TOTAL.name
SPECS: Final = collected_by("pci")


class PciCollector:
    """Counts the NVIDIA GPUs under `<sysfs>/bus/pci/devices` each cycle."""

    def __init__(self, *, root: Path) -> None:
        self._bus = PciBus(root)
        self._labels = LabelCache(SPECS)
        self._problems = ReadProblems(
            LogOnce(log),
            "skipped a PCI sysfs file (a GPU whose vendor or class fails is not counted)",
        )

    def collect(self) -> list[SeriesFamily]:
        scan = self._bus.scan()
        if scan is None:
            return []
        self._problems.report(scan.problems)
        builder = FamilyBuilder(self._labels)
        builder.add(GPUS_PCI_PRESENT.name, (), len(scan.gpus))
        for gpu in scan.gpus:
            builder.add(GPU_PCI_INFO.name, (nvml_bus_id(gpu.address), gpu.device_id), 1)
        if self._problems.total:
            builder.add(READ_ERRORS, (), self._problems.total)
        return builder.families()

    def close(self) -> None:
        """Nothing to release: every file is closed after its read."""


def _create(context: CollectorContext, _settings: NoSettings) -> PciCollector:
    return PciCollector(root=context.sysfs_root)


SPEC = CollectorSpec(
    name="pci",
    help="NVIDIA GPUs on the PCI bus, from sysfs (independent of NVML)",
    settings=NoSettings,
    create=_create,
    metrics=SPECS,
)
