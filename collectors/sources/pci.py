"""PCI topology from sysfs (`<root>/bus/pci/devices`): where a device sits, and its GPUs.

A training job's collectives cross the HCA nearest each GPU, so the InfiniBand `_info`
series names the NUMA node and the GPUs under the same PCIe switch as each HCA. This
module finds NVIDIA GPUs by vendor and class and walks the PCI tree from a device up to
its root port; it knows nothing of InfiniBand beyond the class link's shape.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fleetwatch.collectors.sources.files import read_regular

_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_NVIDIA_VENDOR: Final = "0x10de"
# PCI class codes of GPUs: VGA controller (0x0300xx) and 3D controller (0x0302xx).
_GPU_CLASSES: Final = ("0x0300", "0x0302")


@dataclass(frozen=True, kw_only=True)
class HcaTopology:
    """Where an HCA sits on the PCI tree: its address, NUMA node and the nearby GPUs.

    `gpus` are NVML-order indices (NVML enumerates GPUs in PCI address order) of the GPUs
    under the same PCIe switch as the HCA.
    """

    pci_address: str | None = None
    numa_node: int | None = None
    gpus: tuple[int, ...] = ()


def _read_small(path: Path) -> str | None:
    try:
        return read_regular(str(path), 64).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None


def find_gpus(root: Path) -> list[str]:
    """Real paths of NVIDIA GPUs under `<root>/bus/pci/devices`, in PCI address order."""
    pci = root / "bus" / "pci" / "devices"
    try:
        names = sorted(os.listdir(pci))
    except OSError:
        return []
    found = []
    for name in names:
        entry = pci / name
        vendor = _read_small(entry / "vendor")
        pci_class = _read_small(entry / "class") or ""
        if vendor == _NVIDIA_VENDOR and pci_class.startswith(_GPU_CLASSES):
            found.append(os.path.realpath(entry))
    return found


def _pci_chain(path: str) -> list[str]:
    """PCI device directories from `path` up to (not including) the root complex."""
    chain = []
    current = path
    while _PCI_ADDRESS.fullmatch(os.path.basename(current)):
        chain.append(current)
        current = os.path.dirname(current)
    return chain


def hca_topology(root: Path, device_dir: Path, gpus: list[str]) -> HcaTopology:
    """The HCA's PCI address, NUMA node, and the GPUs sharing its nearest PCIe switch.

    The class directory links into `devices/pci.../<address>/infiniband/<dev>`. Walking up
    from the HCA, the first bridge below the root port that also has GPUs beneath it is
    the shared switch; an HCA directly on a root port shares no switch with a GPU.
    """
    real = os.path.realpath(device_dir)
    pci_dir = os.path.dirname(os.path.dirname(real))
    chain = _pci_chain(pci_dir)
    if not chain:
        return HcaTopology()
    numa_text = _read_small(Path(pci_dir) / "numa_node")
    numa = int(numa_text) if numa_text and numa_text.lstrip("-").isdigit() else None
    near: list[str] = []
    # chain[0] is the HCA, chain[-1] the root port: candidates are the bridges between.
    for bridge in chain[1:-1]:
        near = [gpu for gpu in gpus if gpu.startswith(bridge + os.sep)]
        if near:
            break
    return HcaTopology(
        pci_address=os.path.basename(pci_dir),
        numa_node=numa if numa is not None and numa >= 0 else None,
        gpus=tuple(gpus.index(gpu) for gpu in near),
    )
