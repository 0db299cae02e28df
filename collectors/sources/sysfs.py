"""InfiniBand devices and ports from sysfs (`<root>/class/infiniband`), as typed readings.

`InfinibandSysfs` discovers every device and port once (static attributes, PCI topology,
and a descriptor kept open for every file that changes), then each `read()` re-reads
those descriptors with `os.pread` at offset 0: a sysfs attribute is regenerated on every
read from offset 0, so this costs one system call per value and no path walks.

Per-file tolerance (reference/infiniband.md): EINVAL, ENOSYS, EACCES, EOPNOTSUPP, a
missing file and the old kernels' `N/A (no PMA)` skip that value only; a garbage value
skips that value and is reported as a `ReadProblem`; ENODEV (the device went away under
an open descriptor) drops that device from the reading and asks for re-discovery. One
bad file never loses other values, ports or devices.

Readings are native units: data counters in 4-octet words as the kernel counts them,
rates in Gb/s as the `rate` file prints them. No Prometheus here.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol, TypeVar

# PMA PortCounters error counters: sysfs file -> (error name, width in bits). They
# saturate at all-ones instead of wrapping (reference/infiniband.md).
PMA_ERROR_COUNTERS: Final[Mapping[str, tuple[str, int]]] = {
    "symbol_error": ("symbol", 16),
    "link_error_recovery": ("link_error_recovery", 8),
    "link_downed": ("link_downed", 8),
    "port_rcv_errors": ("rcv", 16),
    "port_rcv_remote_physical_errors": ("rcv_remote_physical", 16),
    "port_rcv_switch_relay_errors": ("rcv_switch_relay", 16),
    "port_xmit_discards": ("xmit_discards", 16),
    "port_xmit_constraint_errors": ("xmit_constraint", 8),
    "port_rcv_constraint_errors": ("rcv_constraint", 8),
    "local_link_integrity_errors": ("local_link_integrity", 4),
    "excessive_buffer_overrun_errors": ("excessive_buffer_overrun", 4),
    "VL15_dropped": ("vl15_dropped", 16),
    "port_xmit_wait": ("xmit_wait", 32),
}
# Width of each PMA counter by error name, for saturation checks and the simulator.
PMA_ERROR_BITS: Final[Mapping[str, int]] = dict(PMA_ERROR_COUNTERS.values())

# Files that are configuration, not counters, inside hw_counters/.
_NOT_COUNTERS: Final = frozenset({"lifespan"})
# Errors that mean "this value is not available here": skip it quietly.
_UNAVAILABLE: Final = frozenset(
    {errno.EINVAL, errno.ENOSYS, errno.EACCES, errno.EPERM, errno.EOPNOTSUPP, errno.ENOENT}
)
_READ_SIZE: Final = 256
_T = TypeVar("_T")
_STATE = re.compile(r"\s*(\d+)\s*:\s*(\S.*?)\s*")
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec\b.*")
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_NVIDIA_VENDOR: Final = "0x10de"
# PCI class codes of GPUs: VGA controller (0x0300xx) and 3D controller (0x0302xx).
_GPU_CLASSES: Final = ("0x0300", "0x0302")


class FileAccess(Protocol):
    """The three system calls the reader makes; tests substitute failing files."""

    def open(self, path: str) -> int: ...

    def pread(self, fd: int, size: int, offset: int, /) -> bytes: ...

    def close(self, fd: int) -> None: ...


class OsFiles:
    """Real files: `os.open` read-only, `os.pread` at offset 0."""

    def open(self, path: str) -> int:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    # The system call itself, not a wrapper: it runs once per value per cycle.
    pread = staticmethod(os.pread)

    def close(self, fd: int) -> None:
        os.close(fd)


@dataclass(frozen=True, kw_only=True)
class ReadProblem:
    """A value that was skipped for a reason a person should see (garbage, I/O error)."""

    path: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class HcaTopology:
    """Where an HCA sits on the PCI tree: its address, NUMA node and the nearby GPUs.

    `gpus` are NVML-order indices (NVML enumerates GPUs in PCI address order) of the GPUs
    under the same PCIe switch as the HCA; `gpu_pci_addresses` are their addresses.
    """

    pci_address: str | None = None
    numa_node: int | None = None
    gpus: tuple[int, ...] = ()
    gpu_pci_addresses: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class IbDeviceInfo:
    """Static attributes of one device (`mlx5_0`), read at discovery."""

    device: str
    board_id: str | None
    firmware_version: str | None
    hca_type: str | None
    node_guid: str | None
    node_desc: str | None
    topology: HcaTopology


@dataclass(frozen=True, kw_only=True)
class IbPortReading:
    """One port at one instant. Absent values are None / missing keys, never a fake 0.

    `counters` maps `counters/` file names to raw values (data counters in 4-octet
    words); `hw_counters` maps driver counter names to values.
    """

    device: str
    port: int
    link_layer: str | None
    state_id: int | None
    state: str | None
    phys_state_id: int | None
    phys_state: str | None
    rate_gbps: float | None
    counters: Mapping[str, int]
    hw_counters: Mapping[str, int]

    @property
    def active(self) -> bool:
        """State ACTIVE (4) and physical state LinkUp (5)."""
        return self.state_id == 4 and self.phys_state_id == 5


@dataclass(frozen=True, kw_only=True)
class IbDeviceReading:
    """A device with its ports and device-level `hw_counters`."""

    info: IbDeviceInfo
    ports: tuple[IbPortReading, ...]
    hw_counters: Mapping[str, int]


@dataclass(frozen=True, kw_only=True)
class IbReading:
    """Everything one `read()` saw. `vanished` devices disappeared while being read."""

    devices: tuple[IbDeviceReading, ...]
    problems: tuple[ReadProblem, ...] = ()
    vanished: tuple[str, ...] = ()


class DeviceVanished(Exception):
    """A descriptor of this device answered ENODEV: the device was removed."""


def parse_state(text: str) -> tuple[int, str] | None:
    """`"4: ACTIVE"` -> (4, "ACTIVE"); `"7: Phy Test"` keeps the space; None if garbage."""
    match = _STATE.fullmatch(text)
    return (int(match.group(1)), match.group(2)) if match else None


def parse_rate_gbps(text: str) -> float | None:
    """`"400 Gb/sec (4X NDR)"` -> 400.0; None if garbage."""
    match = _RATE.fullmatch(text)
    return float(match.group(1)) if match else None


@dataclass(kw_only=True)
class _PortFiles:
    device: str
    port: int
    link_layer: str | None
    state: int | None
    phys_state: int | None
    rate: int | None
    counters: list[tuple[str, int]] = field(default_factory=list)
    hw_counters: list[tuple[str, int]] = field(default_factory=list)


@dataclass(kw_only=True)
class _DeviceFiles:
    info: IbDeviceInfo
    ports: list[_PortFiles]
    hw_counters: list[tuple[str, int]]


class InfinibandSysfs:
    """Reads `<root>/class/infiniband`: discover once, then `read()` every cycle."""

    def __init__(self, *, root: Path, files: FileAccess | None = None) -> None:
        self.root = root
        self._files: FileAccess = files or OsFiles()
        self._devices: list[_DeviceFiles] = []
        self._paths: dict[int, str] = {}
        self._problems: list[ReadProblem] = []

    # -- discovery ----------------------------------------------------------------------
    def discover(self) -> list[ReadProblem]:
        """(Re)build the device list and descriptors; returns problems seen on the way."""
        self.close()
        self._problems = []
        class_dir = self.root / "class" / "infiniband"
        try:
            names = sorted(os.listdir(class_dir))
        except FileNotFoundError:
            names = []
        gpus = find_gpus(self.root)
        for name in names:
            device_dir = class_dir / name
            if not device_dir.is_dir():
                continue
            self._devices.append(self._discover_device(name, device_dir, gpus))
        return self._problems

    def listing(self) -> dict[str, tuple[int, ...]]:
        """Devices and their port numbers as last discovered (to check tool arguments)."""
        return {d.info.device: tuple(p.port for p in d.ports) for d in self._devices}

    def _discover_device(self, name: str, device_dir: Path, gpus: list[str]) -> _DeviceFiles:
        info = IbDeviceInfo(
            device=name,
            board_id=self._read_static(device_dir / "board_id"),
            firmware_version=self._read_static(device_dir / "fw_ver"),
            hca_type=self._read_static(device_dir / "hca_type"),
            node_guid=self._read_static(device_dir / "node_guid"),
            node_desc=self._read_static(device_dir / "node_desc"),
            topology=hca_topology(self.root, device_dir, gpus),
        )
        ports: list[_PortFiles] = []
        for port_name in _sorted_numeric(device_dir / "ports"):
            port_dir = device_dir / "ports" / port_name
            ports.append(
                _PortFiles(
                    device=name,
                    port=int(port_name),
                    link_layer=self._read_static(port_dir / "link_layer"),
                    state=self._open(port_dir / "state"),
                    phys_state=self._open(port_dir / "phys_state"),
                    rate=self._open(port_dir / "rate"),
                    counters=self._open_all(port_dir / "counters"),
                    hw_counters=self._open_all(port_dir / "hw_counters"),
                )
            )
        return _DeviceFiles(
            info=info, ports=ports, hw_counters=self._open_all(device_dir / "hw_counters")
        )

    def _read_static(self, path: Path) -> str | None:
        fd = self._open(path)
        if fd is None:
            return None
        try:
            return self._text(fd)
        finally:
            self._paths.pop(fd, None)
            self._files.close(fd)

    def _open(self, path: Path) -> int | None:
        try:
            fd = self._files.open(str(path))
        except OSError as exc:
            if exc.errno not in _UNAVAILABLE:
                self._problems.append(ReadProblem(path=str(path), reason=_reason(exc)))
            return None
        self._paths[fd] = str(path)
        return fd

    def _open_all(self, directory: Path) -> list[tuple[str, int]]:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            return []
        opened = []
        for name in names:
            if name in _NOT_COUNTERS:
                continue
            fd = self._open(directory / name)
            if fd is not None:
                opened.append((name, fd))
        return opened

    # -- reading ------------------------------------------------------------------------
    def read(self) -> IbReading:
        """Re-read every kept descriptor now."""
        self._problems = []
        devices: list[IbDeviceReading] = []
        vanished: list[str] = []
        for device in self._devices:
            try:
                devices.append(
                    IbDeviceReading(
                        info=device.info,
                        ports=tuple(self._read_port(port) for port in device.ports),
                        hw_counters=self._counters(device.hw_counters),
                    )
                )
            except DeviceVanished:
                vanished.append(device.info.device)
        return IbReading(
            devices=tuple(devices), problems=tuple(self._problems), vanished=tuple(vanished)
        )

    def _read_port(self, files: _PortFiles) -> IbPortReading:
        state = self._parsed(files.state, parse_state, "a state like '4: ACTIVE'")
        phys = self._parsed(files.phys_state, parse_state, "a state like '5: LinkUp'")
        return IbPortReading(
            device=files.device,
            port=files.port,
            link_layer=files.link_layer,
            state_id=state[0] if state else None,
            state=state[1] if state else None,
            phys_state_id=phys[0] if phys else None,
            phys_state=phys[1] if phys else None,
            rate_gbps=self._parsed(files.rate, parse_rate_gbps, "a rate like '400 Gb/sec'"),
            counters=self._counters(files.counters),
            hw_counters=self._counters(files.hw_counters),
        )

    def _counters(self, opened: list[tuple[str, int]]) -> dict[str, int]:
        values: dict[str, int] = {}
        pread = self._files.pread
        for name, fd in opened:
            # The hot loop of a collection: one system call and one int() per value.
            try:
                data = pread(fd, _READ_SIZE, 0)
            except OSError as exc:
                self._failed(fd, exc)
                continue
            try:
                values[name] = int(data)
            except ValueError:
                value = self._garbage_counter(fd, data)
                if value is not None:
                    values[name] = value
                continue
            if values[name] < 0:
                del values[name]
                self._garbage_counter(fd, data)
        return values

    def _garbage_counter(self, fd: int, data: bytes) -> int | None:
        """Slow path for a counter that is not a plain decimal: hex, N/A, or garbage."""
        text = data.decode(errors="replace").split("\n", 1)[0].strip()
        if text.startswith("N/A"):
            return None
        try:
            value = int(text, 0)
        except ValueError:
            value = -1
        if value < 0:
            self._problems.append(
                ReadProblem(path=self._paths[fd], reason=f"expected a counter, got {text[:40]!r}")
            )
            return None
        return value

    def _parsed(
        self, fd: int | None, parse: Callable[[str], _T | None], expected: str
    ) -> _T | None:
        if fd is None:
            return None
        text = self._text(fd)
        if text is None or text.startswith("N/A"):
            return None
        value = parse(text)
        if value is None:
            self._problems.append(
                ReadProblem(path=self._paths[fd], reason=f"expected {expected}, got {text[:40]!r}")
            )
        return value

    def _text(self, fd: int) -> str | None:
        data = self._raw(fd)
        if data is None:
            return None
        return data.decode(errors="replace").split("\n", 1)[0].strip()

    def _raw(self, fd: int) -> bytes | None:
        try:
            return self._files.pread(fd, _READ_SIZE, 0)
        except OSError as exc:
            self._failed(fd, exc)
            return None

    def _failed(self, fd: int, exc: OSError) -> None:
        """Classify a failed read: device gone (raise), unavailable (quiet), or a problem."""
        if exc.errno == errno.ENODEV:
            raise DeviceVanished(self._paths.get(fd, "?")) from exc
        if exc.errno not in _UNAVAILABLE:
            self._problems.append(ReadProblem(path=self._paths[fd], reason=_reason(exc)))

    def close(self) -> None:
        """Close every kept descriptor (before re-discovery and at shutdown)."""
        for fd in self._paths:
            try:
                self._files.close(fd)
            except OSError:  # already gone with its device; nothing left to release
                continue
        self._paths.clear()
        self._devices = []


def _reason(exc: OSError) -> str:
    return f"{errno.errorcode.get(exc.errno or 0, 'error')}: {exc.strerror}"


def _sorted_numeric(directory: Path) -> list[str]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted((n for n in names if n.isdigit()), key=int)


# -- PCI topology ---------------------------------------------------------------------------
def _read_small(path: Path) -> str | None:
    try:
        return path.read_text().strip()
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
        gpu_pci_addresses=tuple(os.path.basename(gpu) for gpu in near),
    )


def iter_ports(reading: IbReading) -> Iterator[tuple[IbDeviceReading, IbPortReading]]:
    """Every (device, port) pair of a reading, in device then port order."""
    for device in reading.devices:
        for port in device.ports:
            yield device, port
