"""Fixture sysfs trees for the InfiniBand collector, written by the tests themselves.

Each builder writes one realistic device into a tree root (files as nested dicts, the
`class/infiniband/<dev>` symlink into a PCI device directory as on real sysfs).
`FailingFiles` makes chosen files fail with an errno, which no plain file can do.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Union

from fleetwatch.collectors.infiniband import InfinibandCollector
from fleetwatch.collectors.infiniband_layout import parse_expected_rates
from fleetwatch.collectors.sources.ibtools import IbTools
from fleetwatch.collectors.sources.sysfs import FileAccess, InfinibandSysfs, OsFiles
from fleetwatch.collectors.sources.udev import DeviceEvents, EventMonitor

Tree = Mapping[str, Union[str, "Tree"]]

# A ConnectX-7 NDR port as a real H100 host shows it (values made up, formats real).
CX7_COUNTERS: dict[str, str] = {
    "symbol_error": "3",
    "link_error_recovery": "1",
    "link_downed": "2",
    "port_rcv_errors": "0",
    "port_rcv_remote_physical_errors": "0",
    "port_rcv_switch_relay_errors": "0",
    "port_xmit_discards": "17",
    "port_xmit_constraint_errors": "0",
    "port_rcv_constraint_errors": "0",
    "local_link_integrity_errors": "0",
    "excessive_buffer_overrun_errors": "0",
    "VL15_dropped": "0",
    "port_xmit_wait": "123456",
    "port_xmit_data": "250000000000",
    "port_rcv_data": "240000000000",
    "port_xmit_packets": "244140625",
    "port_rcv_packets": "234375000",
    "unicast_xmit_packets": "244000000",
    "unicast_rcv_packets": "234000000",
    "multicast_xmit_packets": "140625",
    "multicast_rcv_packets": "375000",
}
CX7_HW_COUNTERS: dict[str, str] = {
    "duplicate_request": "0",
    "local_ack_timeout_err": "4",
    "out_of_sequence": "12",
    "packet_seq_err": "1",
    "lifespan": "10",
}


def write_tree(directory: Path, tree: Tree) -> None:
    """Write nested dicts as directories and strings as files (newline added)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in tree.items():
        if isinstance(content, str):
            (directory / name).write_text(content + "\n")
        else:
            write_tree(directory / name, content)


def add_device(
    root: Path,
    name: str,
    *,
    pci_path: str = "pci0000:00/0000:00:01.0/0000:19:00.0",
    attrs: Mapping[str, str] | None = None,
    ports: Mapping[int, Tree] | None = None,
    extra: Tree | None = None,
    numa_node: str = "0",
) -> Path:
    """One device under a PCI function, linked from `class/infiniband/<name>`."""
    pci_dir = root / "devices" / pci_path
    write_tree(pci_dir, {"vendor": "0x15b3", "class": "0x020700", "numa_node": numa_node})
    device_dir = pci_dir / "infiniband" / name
    defaults = {
        "board_id": "MT_0000000838",
        "fw_ver": "28.39.1002",
        "hca_type": "MT4129",
        "node_guid": "a088:c203:00b1:0000",
    }
    write_tree(device_dir, {**defaults, **(attrs or {})})
    write_tree(device_dir, {"ports": {str(n): tree for n, tree in (ports or {}).items()}})
    if extra:
        write_tree(device_dir, extra)
    link = root / "class" / "infiniband" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(device_dir, link.parent))
    return device_dir


def ib_port(
    *,
    state: str = "4: ACTIVE",
    phys_state: str = "5: LinkUp",
    rate: str | None = "400 Gb/sec (4X NDR)",
    link_layer: str = "InfiniBand",
    counters: Mapping[str, str] | None = None,
    hw_counters: Mapping[str, str] | None = None,
) -> Tree:
    """A port directory; `counters=None` means the full ConnectX-7 set."""
    tree: dict[str, Tree | str] = {
        "state": state,
        "phys_state": phys_state,
        "link_layer": link_layer,
        "counters": dict(CX7_COUNTERS if counters is None else counters),
    }
    if rate is not None:
        tree["rate"] = rate
    if hw_counters is not None:
        tree["hw_counters"] = dict(hw_counters)
    return tree


class FailingFiles:
    """Real files, except that paths ending in a chosen suffix fail with an errno.

    `on_open` failures happen at discovery, `on_read` ones on every read: this is how
    a driver answers EINVAL/ENOSYS for a counter it cannot provide, or ENODEV once its
    device is gone.
    """

    def __init__(self, *, on_read: Mapping[str, int] | None = None) -> None:
        self._real = OsFiles()
        self.on_read: dict[str, int] = dict(on_read or {})
        self._names: dict[int, str] = {}

    def open(self, path: str) -> int:
        fd = self._real.open(path)
        self._names[fd] = path
        return fd

    def pread(self, fd: int, size: int, offset: int, /) -> bytes:
        path = self._names[fd]
        for suffix, code in self.on_read.items():
            if path.endswith(suffix):
                raise OSError(code, os.strerror(code), path)
        return self._real.pread(fd, size, offset)

    def close(self, fd: int) -> None:
        self._names.pop(fd, None)
        self._real.close(fd)


class FakeUdevDevice:
    """What a pyudev Device from a Monitor carries that the collector uses."""

    def __init__(self, subsystem: str, action: str) -> None:
        self.subsystem = subsystem
        self.action = action


class FakeMonitor:
    """pyudev's `Monitor.poll` interface over a queue the test fills."""

    def __init__(self) -> None:
        self.queue: list[FakeUdevDevice] = []

    def poll(self, timeout: float | None = None) -> FakeUdevDevice | None:
        return self.queue.pop(0) if self.queue else None


def make_collector(
    root: Path,
    *,
    files: FileAccess | None = None,
    tool_path: str | None = None,
    monitor: EventMonitor | None = None,
    expected: str | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    hw_stats_seconds: float = 0.0,
) -> InfinibandCollector:
    """A collector on a fixture tree; tools only when `tool_path` names where they are.

    hw_counters are read every collection unless `hw_stats_seconds` says otherwise."""
    sysfs = InfinibandSysfs(root=root, files=files)
    tools = None
    if tool_path is not None:
        tools = IbTools.find(
            search_path=tool_path,
            timeout_seconds=5.0,
            listing=sysfs.listing,
            sysfs_root=str(root),
        )
    return InfinibandCollector(
        sysfs=sysfs,
        tools=tools,
        events=DeviceEvents(monitor=monitor),
        expected_rates=parse_expected_rates(expected) if expected else (),
        monotonic=monotonic,
        hw_stats_seconds=hw_stats_seconds,
    )


# The named fixture trees: each golden test and the node_exporter cross-check build these.
Fixture = Callable[[Path], FileAccess | None]


def cx7_ndr(root: Path) -> None:
    add_device(root, "mlx5_0", ports={1: ib_port(hw_counters=CX7_HW_COUNTERS)})


def roce_bond(root: Path) -> None:
    roce = {k: v for k, v in CX7_COUNTERS.items() if k != "VL15_dropped"}
    add_device(
        root,
        "mlx5_bond_0",
        attrs={"node_guid": "0000:0000:0000:0000"},
        ports={
            1: ib_port(
                rate="200 Gb/sec (4X HDR)",
                link_layer="Ethernet",
                counters=roce,
                hw_counters={"np_cnp_sent": "42", "np_ecn_marked_roce_packets": "40",
                             "rp_cnp_handled": "39", "out_of_sequence": "2"},
            )
        },
    )  # fmt: skip


def saturated(root: Path) -> None:
    pinned = {
        **CX7_COUNTERS,
        "link_downed": "255",
        "excessive_buffer_overrun_errors": "15",
        "port_xmit_discards": "65535",
        "port_xmit_wait": "4294967295",
    }
    add_device(root, "mlx5_3", ports={1: ib_port(counters=pinned)})


def einval(root: Path) -> FileAccess:
    add_device(root, "mlx5_4", ports={1: ib_port(), 2: ib_port()})
    return FailingFiles(
        on_read={
            "ports/1/counters/VL15_dropped": errno.EINVAL,
            "ports/1/counters/port_xmit_wait": errno.ENOSYS,
            "ports/2/rate": errno.EINVAL,
            "ports/2/counters/symbol_error": errno.EIO,
        }
    )


def missing_rate(root: Path) -> None:
    add_device(root, "mlx5_5", ports={1: ib_port(rate=None)})


def garbage(root: Path) -> None:
    junk = {**CX7_COUNTERS, "symbol_error": "banana", "port_rcv_errors": "-4"}
    add_device(root, "mlx5_6", ports={1: ib_port(counters=junk, phys_state="LinkUp?")})


def no_pma(root: Path) -> None:
    old = dict.fromkeys(CX7_COUNTERS, "N/A (no PMA)")
    add_device(root, "mlx4_0", ports={1: ib_port(counters=old, rate="40 Gb/sec (4X QDR)")})


def no_counters(root: Path) -> None:
    """hfi1/irdma-like devices: no counters/, hw_counters at port or device level."""
    port = ib_port(rate="100 Gb/sec (4X EDR)")
    del port["counters"]  # type: ignore[attr-defined]
    add_device(
        root,
        "hfi1_0",
        attrs={"hca_type": "", "board_id": "Intel Omni-Path HFI Silicon 100 Series"},
        ports={1: {**port, "hw_counters": {"TxWords": "1000", "RxWords": "900"}}},
        extra={"hw_counters": {"DcRecvErr": "0", "RcvOvflCnt": "3"}},
    )
    eth = ib_port(rate="100 Gb/sec (4X EDR)", link_layer="Ethernet", state="1: DOWN",
                  phys_state="3: Disabled")  # fmt: skip
    del eth["counters"]  # type: ignore[attr-defined]
    add_device(root, "irdma0", pci_path="pci0000:80/0000:80:02.0/0000:81:00.0",
               ports={1: eth}, extra={"hw_counters": {"ip4InReceives": "77"}})  # fmt: skip


FIXTURES: dict[str, Callable[[Path], FileAccess | None]] = {
    "cx7_ndr": cx7_ndr,
    "roce_bond": roce_bond,
    "saturated": saturated,
    "einval": einval,
    "missing_rate": missing_rate,
    "garbage": garbage,
    "no_pma": no_pma,
    "no_counters": no_counters,
}
