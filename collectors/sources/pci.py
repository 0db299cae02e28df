"""PCI sysfs (`<root>/bus/pci/devices`): the NVIDIA GPUs on the bus, and where a device sits.

The GPUs on the bus are counted without NVML: a GPU the driver lost, or that never
initialised, is still a PCI function until it falls off the bus, so the count beside
NVML's tells the two apart. A GPU is a function with vendor 0x10de and class VGA
(0x0300xx) or 3D controller (0x0302xx, every datacenter GPU); NVSwitches (bridge
0x0680xx), audio functions (0x0403xx) and SR-IOV virtual functions of a GPU (they carry a
`physfn` link: a vGPU host lists dozens) are not GPUs. `vendor` and `class` are values the
kernel cached at enumeration, so reading them never touches the device.

A training job's collectives cross the HCA nearest each GPU, so the InfiniBand `_info`
series names the NUMA node and the GPUs under the same PCIe switch as each HCA: this
module also walks the PCI tree from a device up to its root port; it knows nothing of
InfiniBand beyond the class link's shape.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fleetwatch.collectors.sources.files import ReadProblem, read_regular

_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_NVIDIA_VENDOR: Final = "0x10de"
# PCI class codes of GPUs: VGA controller (0x0300xx) and 3D controller (0x0302xx).
_GPU_CLASSES: Final = ("0x0300", "0x0302")
# What each attribute holds (`0x` and lowercase hex, as the kernel prints it).
_ID_FORMATS: Final = {
    "vendor": re.compile(r"0x[0-9a-f]{4}"),
    "device": re.compile(r"0x[0-9a-f]{4}"),
    "class": re.compile(r"0x[0-9a-f]{6}"),
}
# The function went away while being read (hot removal): it is no longer on the bus.
_GONE: Final = frozenset({errno.ENOENT, errno.ENODEV})


@dataclass(frozen=True, kw_only=True)
class HcaTopology:
    """Where an HCA sits on the PCI tree: its address, NUMA node and the nearby GPUs.

    `gpus` are NVML-order indices (NVML enumerates GPUs in PCI address order) of the GPUs
    under the same PCIe switch as the HCA.
    """

    pci_address: str | None = None
    numa_node: int | None = None
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PciGpu:
    """An NVIDIA GPU on the bus: its address (`0000:18:00.0`) and PCI device id (`0x2330`).

    `device_id` is "" when the `device` file could not be read (the GPU still counts:
    vendor and class said what it is).
    """

    address: str
    device_id: str


@dataclass(frozen=True, kw_only=True)
class PciGpuScan:
    """One pass over the bus: the GPUs found, in address order, and files that failed.

    A function whose `vendor` or `class` could not be read is not counted and its file is
    in `problems`.
    """

    gpus: tuple[PciGpu, ...]
    problems: tuple[ReadProblem, ...]


class _Gone(Exception):
    """The function vanished while it was read."""


def _read_id(directory: str, name: str, problems: list[ReadProblem]) -> str | None:
    """The `0x...` id in `directory/name`; None (and a problem) for an unreadable or garbage
    file; `_Gone` when the function was removed under the reader."""
    path = os.path.join(directory, name)
    try:
        text = read_regular(path, 64).decode("ascii").strip().lower()
    except OSError as exc:
        if exc.errno in _GONE and not os.path.isdir(directory):
            raise _Gone from exc
        problems.append(ReadProblem(path=path, reason=exc.strerror or str(exc)))
        return None
    except UnicodeDecodeError:
        problems.append(ReadProblem(path=path, reason="not ASCII text"))
        return None
    if not _ID_FORMATS[name].fullmatch(text):
        reason = f"expected a PCI {name} id, got {text[:20]!r}"
        problems.append(ReadProblem(path=path, reason=reason))
        return None
    return text


def _gpu_at(directory: str, address: str, problems: list[ReadProblem]) -> PciGpu | None:
    """The GPU at `directory`, or None for any other function (or one that failed)."""
    if _read_id(directory, "vendor", problems) != _NVIDIA_VENDOR:
        return None
    pci_class = _read_id(directory, "class", problems)
    if pci_class is None or not pci_class.startswith(_GPU_CLASSES):
        return None
    if os.path.lexists(os.path.join(directory, "physfn")):
        return None  # an SR-IOV virtual function of a GPU, not a GPU of its own
    return PciGpu(address=address, device_id=_read_id(directory, "device", problems) or "")


class PciBus:
    """The NVIDIA GPUs under `<root>/bus/pci/devices`, scanned again and again.

    A function's vendor, class and device ids are fixed while it is on the bus, so each
    scan lists the folder (one call) and reads only the functions that were not there last
    time; one that left the listing leaves the scan at once. A function with an unreadable
    or garbage file is read again next scan (its problem is reported every time).
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        self._known: dict[str, PciGpu | None] = {}  # by address: a GPU, or None (not one)

    def scan(self) -> PciGpuScan | None:
        """This scan's GPUs; None when there is no such folder (no PCI sysfs: not a GPU
        node). Other failures to list the folder raise `OSError`."""
        pci = os.path.join(self._root, "bus", "pci", "devices")
        try:
            names = sorted(os.listdir(pci))
        except FileNotFoundError:
            self._known.clear()
            return None
        known: dict[str, PciGpu | None] = {}
        gpus: list[PciGpu] = []
        problems: list[ReadProblem] = []
        for name in names:
            if name in self._known:
                gpu = known[name] = self._known[name]
            else:
                before = len(problems)
                try:
                    gpu = _gpu_at(os.path.join(pci, name), name, problems)
                except _Gone:
                    continue
                if len(problems) == before:
                    known[name] = gpu
            if gpu is not None:
                gpus.append(gpu)
        self._known = known
        return PciGpuScan(gpus=tuple(gpus), problems=tuple(problems))


def scan_gpus(root: Path) -> PciGpuScan | None:
    """One scan of the NVIDIA GPUs under `<root>/bus/pci/devices` (`PciBus.scan`)."""
    return PciBus(root).scan()


def nvml_bus_id(address: str) -> str:
    """A sysfs PCI address as NVML writes a bus id: `0000:18:00.0` -> `00000000:18:00.0`."""
    domain, bus, rest = address.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"


def _read_small(path: Path) -> str | None:
    try:
        return read_regular(str(path), 64).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None


def find_gpus(root: Path) -> list[str]:
    """Real paths of NVIDIA GPUs under `<root>/bus/pci/devices`, in PCI address order
    (none when the folder cannot be listed: the topology is then unknown, not an error)."""
    try:
        scan = scan_gpus(root)
    except OSError:
        return []
    pci = root / "bus" / "pci" / "devices"
    return [] if scan is None else [os.path.realpath(pci / gpu.address) for gpu in scan.gpus]


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
