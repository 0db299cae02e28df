"""InfiniBand devices and ports from sysfs (`<root>/class/infiniband`), as typed readings.

`InfinibandSysfs` discovers every device and port once (static attributes, the PCI
topology from `sources.pci`, and a descriptor kept open for every file that changes, each
counter with a slot), then each `read()` re-reads those descriptors with `os.pread` at
offset 0: a sysfs attribute is regenerated on every read from offset 0, so this costs one
system call per value and no path walks. The whole pass is one comprehension and the
counters are converted by one `map(int, ...)`; readings are slot-indexed lists, not
per-value objects.

Per-file tolerance: EINVAL, ENOSYS, EACCES, EOPNOTSUPP, a
missing file and the old kernels' `N/A (no PMA)` skip that value only (a counter that
answers so at discovery is left out until the next discovery: it stays that way); a
garbage value skips that value and is reported as a `ReadProblem`; ENODEV (the device
went away under an open descriptor) drops that device from the reading and asks for
re-discovery. One bad file never loses other values, ports or devices: any failure or
non-decimal value sends that cycle down a file-by-file path that sorts it out.

Readings are native units: data counters in 4-octet words as the kernel counts them,
rates in Gb/s as the `rate` file prints them. No Prometheus here.
"""

from __future__ import annotations

import errno
import functools
import operator
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NamedTuple, Protocol, cast

from fleetwatch.collectors.sources.files import ReadProblem, open_regular
from fleetwatch.collectors.sources.pci import HcaTopology, find_gpus, hca_topology

# PMA PortCounters error counters: sysfs file -> (error name, width in bits). They
# saturate at all-ones instead of wrapping.
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
# A device's attributes read at discovery (labels of its series): `IbDeviceInfo` field, file.
_STATIC_FILES: Final = {
    "board_id": "board_id",
    "firmware_version": "fw_ver",
    "hca_type": "hca_type",
    "node_guid": "node_guid",
    "node_desc": "node_desc",
}
# Errors that mean "this value is not available here": skip it quietly.
_UNAVAILABLE: Final = frozenset(
    {errno.EINVAL, errno.ENOSYS, errno.EACCES, errno.EPERM, errno.EOPNOTSUPP, errno.ENOENT}
)
_READ_SIZE: Final = 256
# ASCII digits of a bounded count: int() refuses 4300 digits, float() makes 400 of them inf.
# A state is matched stripped, its name greedy: a lazy name before `\s*` went quadratic on a
# long run of blanks inside the line.
_STATE = re.compile(r"([0-9]{1,9})\s*:\s*(\S.*)")
_RATE = re.compile(r"\s*([0-9]{1,9}(?:\.[0-9]{1,9})?)\s*Gb/sec\b.*")


class FileAccess(Protocol):
    """The three system calls the reader makes; tests substitute failing files."""

    def open(self, path: str) -> int: ...

    def pread(self, fd: int, size: int, offset: int, /) -> bytes: ...

    def close(self, fd: int) -> None: ...


class OsFiles:
    """Real files: regular files only, opened read-only and non-blocking; `os.pread`."""

    open = staticmethod(open_regular)

    # The system call itself, not a wrapper: it runs once per value per cycle.
    pread = staticmethod(os.pread)

    def close(self, fd: int) -> None:
        os.close(fd)


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
class IbPort:
    """A port as discovered: static attributes, and the slots its counters are read into.

    `counters` maps `counters/` file names, `hw_counters` driver counter names, to their
    slot in `IbReading.values`. A file that was missing or answered "not available" at
    discovery has no slot until the next discovery.
    """

    device: str
    port: int
    link_layer: str | None
    counters: Mapping[str, int]
    hw_counters: Mapping[str, int]


@dataclass(frozen=True, kw_only=True)
class IbDevice:
    """A device as discovered, with its ports and the slots of device-level hw_counters."""

    info: IbDeviceInfo
    ports: tuple[IbPort, ...]
    hw_counters: Mapping[str, int]


@dataclass(frozen=True, kw_only=True)
class IbPortState:
    """A port's state and trained rate at one instant; None where the file had no value."""

    state_id: int | None
    state: str | None
    phys_state_id: int | None
    phys_state: str | None
    rate_gbps: float | None

    @property
    def active(self) -> bool:
        """State ACTIVE (4) and physical state LinkUp (5)."""
        return self.state_id == 4 and self.phys_state_id == 5


class IbReading(NamedTuple):
    """Everything one `read()` saw (a tuple: made once per cycle, cheaply).

    `values[slot]` is a counter's raw value, None when it could not be read this time.
    `ports` follows the ports of `InfinibandSysfs.devices()`, device then port order; a
    port is None when its device vanished while being read (its name is then in
    `vanished`, its values are None).
    """

    values: Sequence[int | None]
    ports: tuple[IbPortState | None, ...]
    problems: tuple[ReadProblem, ...] = ()
    vanished: tuple[str, ...] = ()


class DeviceVanished(Exception):
    """A descriptor of this device answered ENODEV: the device was removed."""


def parse_state(text: str) -> tuple[int, str] | None:
    """`"4: ACTIVE"` -> (4, "ACTIVE"); `"7: Phy Test"` keeps the space; None if garbage."""
    match = _STATE.fullmatch(text.strip())
    return (int(match.group(1)), match.group(2)) if match else None


def parse_rate_gbps(text: str) -> float | None:
    """`"400 Gb/sec (4X NDR)"` -> 400.0; None if garbage."""
    match = _RATE.fullmatch(text)
    return float(match.group(1)) if match else None


def _first_line(data: bytes) -> str:
    return data.decode(errors="replace").split("\n", 1)[0].strip()


# What a port's state, phys_state and rate files say (one line each).
_PORT_FILES: Final = (
    (parse_state, "a state like '4: ACTIVE'"),
    (parse_state, "a state like '5: LinkUp'"),
    (parse_rate_gbps, "a rate like '400 Gb/sec'"),
)


# Ports say one of a handful of things: each distinct (state, phys_state, rate) is parsed
# once. Returns the state and, for files that held garbage, (file index, reason).
@functools.lru_cache(maxsize=256)
def _parse_port_state(
    state: bytes | None, phys: bytes | None, rate: bytes | None
) -> tuple[IbPortState, tuple[tuple[int, str], ...]]:
    parsed: list[object] = []
    garbage = []
    for index, (data, (parse, expected)) in enumerate(
        zip((state, phys, rate), _PORT_FILES, strict=True)
    ):
        text = None if data is None else _first_line(data)
        value = None if text is None or text.startswith("N/A") else parse(text)
        if value is None and text is not None and not text.startswith("N/A"):
            garbage.append((index, f"expected {expected}, got {text[:40]!r}"))
        parsed.append(value)
    states = cast(tuple[tuple[int, str] | None, tuple[int, str] | None], parsed[:2])
    return (
        IbPortState(
            state_id=states[0][0] if states[0] else None,
            state=states[0][1] if states[0] else None,
            phys_state_id=states[1][0] if states[1] else None,
            phys_state=states[1][1] if states[1] else None,
            rate_gbps=cast(float | None, parsed[2]),
        ),
        tuple(garbage),
    )


class InfinibandSysfs:
    """Reads `<root>/class/infiniband`: discover once, then `read()` every cycle.

    Discovery opens every counter and port state file once; `read()` re-reads all of
    them in one pass with `os.pread` and converts the counters in one pass with `int`.
    Only when that pass meets an error or a value that is not a plain decimal does it go
    file by file, so one bad file costs its own value and nothing else.
    """

    def __init__(self, *, root: Path, files: FileAccess | None = None) -> None:
        self.root = root
        self._files: FileAccess = files or OsFiles()
        self._devices: tuple[IbDevice, ...] = ()
        self._paths: dict[int, str] = {}
        self._problems: list[ReadProblem] = []
        # Every descriptor read each cycle, and the index of its device in `_devices`:
        # counters first (a counter's slot is its index), then port state files.
        self._fds: list[int] = []
        self._fd_device: list[int] = []
        self._counters = 0
        # hw_counters descriptors, opened apart and given the slots after the other
        # counters, so a read can skip them (`read(hw_counters=False)`): their slot
        # dicts, to renumber once the other counters are counted.
        self._hw_fds: list[tuple[int, int]] = []
        self._hw_slot_maps: list[dict[str, int]] = []
        self._hw_span = slice(0, 0)
        self._without_hw: list[int] = []
        # The hw_counters' bytes and values as last read (`read(hw_counters=False)`).
        self._last_hw: tuple[list[bytes | None], list[int | None]] | None = None
        # By port (device then port order): its state, phys_state and rate descriptors
        # while discovering; then a getter of those three from a read, and its device.
        self._port_files: list[tuple[int | None, int | None, int | None]] = []
        self._port_text: list[Callable[[list[bytes | None]], tuple[bytes | None, ...]]] = []
        self._port_device: list[int] = []
        # The port state files' bytes of the last read, and the states parsed from them.
        self._last_texts: list[bytes | None] | None = None
        self._last_ports: tuple[IbPortState | None, ...] = ()
        # What the last discovery was made from (`_shape`), and the counter files it left
        # out as unavailable, which `unchanged()` asks again.
        self._shape: tuple[object, ...] | None = None
        self._left_out: list[str] = []

    # -- discovery ----------------------------------------------------------------------
    def discover(self) -> list[ReadProblem]:
        """(Re)build the device list and descriptors; returns problems seen on the way."""
        self.close()
        self._problems = []
        self._left_out = []
        gpus = find_gpus(self.root)
        self._shape = self._current_shape(gpus)
        class_dir = self.root / "class" / "infiniband"
        try:
            names = sorted(os.listdir(class_dir))
        except FileNotFoundError:
            names = []
        devices: list[IbDevice] = []
        for name in names:
            device_dir = class_dir / name
            if not device_dir.is_dir():
                continue
            devices.append(self._discover_device(len(devices), name, device_dir, gpus))
        self._devices = tuple(devices)
        # hw_counters follow the other counters.
        first_hw = len(self._fds)
        for hw_slots in self._hw_slot_maps:
            for name in hw_slots:
                hw_slots[name] += first_hw
        for hw_fd, device in self._hw_fds:
            self._fds.append(hw_fd)
            self._fd_device.append(device)
        self._hw_span = slice(first_hw, len(self._fds))
        # Port state files follow the counters; a file a port lacks reads the None that
        # `read()` appends after the last descriptor.
        self._counters = len(self._fds)
        missing = self._counters + sum(fd is not None for f in self._port_files for fd in f)
        for files, device in zip(self._port_files, self._port_device, strict=True):
            slots = []
            for fd in files:
                if fd is None:
                    slots.append(missing)
                    continue
                slots.append(len(self._fds))
                self._fds.append(fd)
                self._fd_device.append(device)
            self._port_text.append(operator.itemgetter(*slots))
        self._without_hw = self._fds[: self._hw_span.start] + self._fds[self._hw_span.stop :]
        return self._problems

    def unchanged(self) -> bool:
        """Whether what the last `discover()` was made from still stands: the same devices
        (and the PCI functions they are), GPUs, ports, counter files and static attributes,
        and every counter file it left out as unavailable still so. Folders listed and small
        files read, no counter file opened: 4-9 ms on the real-shaped trees of 8 to 32
        ports, most of it the GPU scan, where a discovery, which opens and probes every
        counter file (784 on 16 ports) and walks the PCI tree, takes 20-54 ms."""
        if self._shape is None or self._shape != self._current_shape(find_gpus(self.root)):
            return False
        for path in self._left_out:
            try:
                fd = self._files.open(path)
            except OSError:
                continue
            try:
                if not self._unavailable(fd):
                    return False
            finally:
                self._files.close(fd)
        return True

    def _current_shape(self, gpus: list[str]) -> tuple[object, ...]:
        """What discovery reads, less the counter values: the devices' names and PCI
        functions, the GPUs (`gpus`: the HCAs' topology labels), each device's static
        attributes, ports with their link layer, and the names in every counter folder."""
        class_dir = self.root / "class" / "infiniband"
        shape: list[object] = [tuple(gpus)]
        for name in _names(class_dir):
            device_dir = class_dir / name
            ports = []
            for port in _sorted_numeric(device_dir / "ports"):
                port_dir = device_dir / "ports" / port
                ports.append((
                    port,
                    self._peek(port_dir / "link_layer"),
                    _names(port_dir / "counters"),
                    _names(port_dir / "hw_counters"),
                ))  # fmt: skip
            shape.append((
                name,
                os.path.realpath(device_dir),
                tuple(self._peek(device_dir / file) for file in _STATIC_FILES.values()),
                _names(device_dir / "hw_counters"),
                tuple(ports),
            ))  # fmt: skip
        return tuple(shape)

    def _peek(self, path: Path) -> bytes | None:
        """A small file's bytes, or None when it cannot be read (nothing reported)."""
        try:
            fd = self._files.open(str(path))
        except OSError:
            return None
        try:
            return self._files.pread(fd, _READ_SIZE, 0)
        except OSError:
            return None
        finally:
            self._files.close(fd)

    def devices(self) -> tuple[IbDevice, ...]:
        """Devices as last discovered."""
        return self._devices

    def listing(self) -> dict[str, tuple[int, ...]]:
        """Devices and their port numbers as last discovered (to check tool arguments)."""
        return {d.info.device: tuple(p.port for p in d.ports) for d in self._devices}

    def _discover_device(
        self, index: int, name: str, device_dir: Path, gpus: list[str]
    ) -> IbDevice:
        static = {key: self._read_static(device_dir / file) for key, file in _STATIC_FILES.items()}
        info = IbDeviceInfo(
            device=name, topology=hca_topology(self.root, device_dir, gpus), **static
        )
        ports: list[IbPort] = []
        for port_name in _sorted_numeric(device_dir / "ports"):
            port_dir = device_dir / "ports" / port_name
            self._port_files.append(
                (
                    self._open(port_dir / "state"),
                    self._open(port_dir / "phys_state"),
                    self._open(port_dir / "rate"),
                )
            )
            self._port_device.append(index)
            ports.append(
                IbPort(
                    device=name,
                    port=int(port_name),
                    link_layer=self._read_static(port_dir / "link_layer"),
                    counters=self._open_counters(index, port_dir / "counters"),
                    hw_counters=self._open_counters(index, port_dir / "hw_counters", hw=True),
                )
            )
        return IbDevice(
            info=info,
            ports=tuple(ports),
            hw_counters=self._open_counters(index, device_dir / "hw_counters", hw=True),
        )

    def _read_static(self, path: Path) -> str | None:
        fd = self._open(path)
        if fd is None:
            return None
        try:
            data = self._raw(fd)
            return None if data is None else _first_line(data)
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

    def _open_counters(self, device: int, directory: Path, *, hw: bool = False) -> dict[str, int]:
        """Open and probe each counter file; those that hold a value get a slot.

        A `hw` folder's slots are provisional (counted from 0) until `discover()` puts them
        after every other counter.
        """
        slots: dict[str, int] = {}
        for name in _names(directory):
            if name in _NOT_COUNTERS:
                continue
            fd = self._open(directory / name)
            if fd is None:
                continue
            if self._unavailable(fd):
                self._left_out.append(self._paths.pop(fd, ""))
                self._files.close(fd)
                continue
            if hw:
                slots[name] = len(self._hw_fds)
                self._hw_fds.append((fd, device))
                continue
            slots[name] = len(self._fds)
            self._fds.append(fd)
            self._fd_device.append(device)
        if hw:
            self._hw_slot_maps.append(slots)
        return slots

    def _unavailable(self, fd: int) -> bool:
        """Does this counter answer "not available here" (EINVAL/ENOSYS/..., N/A)?

        Such a file stays that way, so it is left out until the next discovery instead
        of sending every read down the file-by-file path.
        """
        try:
            data = self._files.pread(fd, _READ_SIZE, 0)
        except OSError as exc:
            return exc.errno in _UNAVAILABLE
        return data.lstrip().startswith(b"N/A")

    # -- reading ------------------------------------------------------------------------
    def read(self, *, hw_counters: bool = True) -> IbReading:
        """Re-read the kept descriptors now; with `hw_counters=False`, every one but the
        hw_counters files, whose values are those of the last read that included them."""
        self._problems = []
        pread = self._files.pread
        gone: set[int] = set()
        hw_span = self._hw_span
        kept = None if hw_counters else self._last_hw
        try:
            if kept is None:
                raw: list[bytes | None] = [pread(fd, _READ_SIZE, 0) for fd in self._fds]
            else:
                raw = [pread(fd, _READ_SIZE, 0) for fd in self._without_hw]
                raw[hw_span.start : hw_span.start] = kept[0]
        except OSError:
            raw = self._read_one_by_one(gone)  # every file, hw_counters too
            kept = None
        # Counters come first, hw_counters last of them; hw_counters not read this time
        # keep the values parsed when they were.
        values = self._counter_values(raw, self._counters if kept is None else hw_span.start)
        if kept is None:
            self._last_hw = (raw[hw_span], values[hw_span])
        else:
            values += kept[1]
        # Port states rarely change: the same files' bytes give the same states (garbage
        # in them was reported when it appeared).
        texts = raw[self._counters :]
        if gone or texts != self._last_texts:
            raw.append(None)
            self._last_ports = tuple(
                None if device in gone else self._port_state(index, text(raw))
                for index, (text, device) in enumerate(
                    zip(self._port_text, self._port_device, strict=True)
                )
            )
            self._last_texts = None if gone else texts
        if gone:  # values read before the device answered ENODEV go with it
            values = [
                None if device in gone else value
                for device, value in zip(self._fd_device, values, strict=False)
            ]
            self._last_hw = None
        return IbReading(
            values=values,
            ports=self._last_ports,
            problems=tuple(self._problems),
            vanished=tuple(self._devices[d].info.device for d in sorted(gone)),
        )

    def _counter_values(self, raw: list[bytes | None], stop: int) -> list[int | None]:
        """The first `stop` counters of `raw` as integers: in one C-level pass, or one by
        one where a read failed or a value is not a plain decimal (reported)."""
        counters = raw[:stop]
        try:
            ints = list(map(int, counters))  # type: ignore[arg-type]  # TypeError on None
            if ints and min(ints) < 0:
                raise ValueError("negative counter")
            return ints  # type: ignore[return-value]  # list is invariant
        except (TypeError, ValueError):  # a failed read or not a plain decimal somewhere
            return [self._counter(fd, data) for fd, data in zip(self._fds, counters, strict=False)]

    def _read_one_by_one(self, gone: set[int]) -> list[bytes | None]:
        """The slow path: each file on its own, so one failure loses only its value."""
        raw: list[bytes | None] = []
        for fd, device in zip(self._fds, self._fd_device, strict=True):
            if device in gone:
                raw.append(None)
                continue
            try:
                raw.append(self._raw(fd))
            except DeviceVanished:
                gone.add(device)
                raw.append(None)
        return raw

    def _port_state(self, index: int, texts: tuple[bytes | None, ...]) -> IbPortState:
        state, garbage = _parse_port_state(*texts)
        for file, reason in garbage:
            fd = self._port_files[index][file]
            self._problems.append(ReadProblem(path=self._paths.get(fd or -1, "?"), reason=reason))
        return state

    def _counter(self, fd: int, data: bytes | None) -> int | None:
        """One counter value the slow way: hex, N/A, or garbage (reported)."""
        if data is None:
            return None
        try:
            value = int(data)
        except ValueError:
            text = _first_line(data)
            if text.startswith("N/A"):
                return None
            try:
                value = int(text, 0)
            except ValueError:
                value = -1
        if value < 0:
            self._problems.append(
                ReadProblem(
                    path=self._paths[fd],
                    reason=f"expected a counter, got {_first_line(data)[:40]!r}",
                )
            )
            return None
        return value

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
        self._devices = ()
        self._fds = []
        self._fd_device = []
        self._counters = 0
        self._hw_fds = []
        self._hw_slot_maps = []
        self._hw_span = slice(0, 0)
        self._without_hw = []
        self._last_hw = None
        self._port_files = []
        self._port_text = []
        self._port_device = []
        self._last_texts = None
        self._last_ports = ()


def _reason(exc: OSError) -> str:
    if exc.errno is None:  # ours, such as NotRegularFile: the message is the reason
        return str(exc)
    return f"{errno.errorcode.get(exc.errno, 'error')}: {exc.strerror}"


def _names(directory: Path) -> tuple[str, ...]:
    """A folder's entries, sorted; none when it cannot be listed."""
    try:
        return tuple(sorted(os.listdir(directory)))
    except OSError:
        return ()


def _sorted_numeric(directory: Path) -> list[str]:
    """A folder's numeric entries (port numbers), in numeric order."""
    return sorted((n for n in _names(directory) if n.isdigit()), key=int)
