"""The NVIDIA GPUs on the PCI bus, counted from sysfs without NVML (the `pci` collector).

Part of the metric catalog (`fleetwatch.catalog`): each family is declared here once and
imported by name wherever it is emitted or read."""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.gpu import GPU_INFO
from fleetwatch.catalog.spec import Families

FAMILIES: Final = Families(collectors=("pci",))
"""Every family of this module, in declaration order (the order docs/metrics.md lists them)."""

GPUS_PCI_PRESENT: Final = FAMILIES.declare(
    "fleetwatch_gpus_pci_present",
    "gauge",
    (
        "NVIDIA GPUs on the PCI bus (vendor 0x10de, VGA or 3D controller; NVSwitches and "
        "SR-IOV virtual functions excluded), read from sysfs without NVML."
    ),
    (),
    unit="GPUs",
    source="`bus/pci/devices/*/vendor` and `class`",
    series="1",
)


GPU_PCI_INFO: Final = FAMILIES.declare(
    "fleetwatch_gpu_pci_info",
    "gauge",
    (
        "An NVIDIA GPU on the PCI bus (value 1): its bus id as NVML writes it (join "
        f"{GPU_INFO} on node and pci_bus_id) and its PCI device id."
    ),
    ("pci_bus_id", "device_id"),
    unit="info (1)",
    source="`bus/pci/devices/<address>/device`",
    series="G",
    label_values={
        "pci_bus_id": (
            "(as NVML writes it, `00000000:18:00.0`: join "
            f"`{GPU_INFO}` on it and `node`; `fleetwatch_gpu_pci_info "
            f"unless on(node, pci_bus_id) {GPU_INFO}` is the GPU NVML "
            "does not list)"
        ),
        "device_id": "(PCI device id, `0x2330`; empty when unreadable)",
    },
)


PCI_SYSFS_READ_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_pci_sysfs_read_errors_total",
    "counter",
    ("PCI sysfs files that could not be read or held garbage (that function was not counted)."),
    (),
    unit="files",
    source=(
        "`vendor`, `class` or `device` files that could not be read or held garbage "
        "(that function is not counted, or its `device_id` is empty); absent until "
        "the first"
    ),
    series="1",
)
