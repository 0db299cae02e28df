"""A generated sysfs tree for the simulated node: real files that move over time.

`SimulatedSysfs.write()` creates (first call) or refreshes (later calls) the tree at the
node's current simulated time, so the exporter reads it through `--path.sysfs` exactly as
it reads `/sys`, and node_exporter can read the same tree. Files are rewritten in place
(same inode: `pwrite` at 0, then `ftruncate`), so readers that keep descriptors open and
re-read them with `os.pread` see new values, as they do on real sysfs.

The layout follows real sysfs: `class/infiniband/<dev>` is a symlink into a DGX-like PCI
hierarchy (`devices/pci0000:RR/<root port>/<switch>/<downstream port>/<HCA>/infiniband/
<dev>`), with the GPU of the same rail under the same PCIe switch, and every PCI function
listed in `bus/pci/devices`. Each GPU sits at the bus id the fake NVML reports for it.
Storage HCAs (beyond the GPU count) hang off their own root port. Functions that are not
GPUs stand beside them as on a real host: the BMC's VGA controller (ASPEED), and on an
8-GPU baseboard four NVSwitches (NVIDIA vendor, bridge class). A GPU that falls off the
bus (`gpu_off_bus` fault) leaves `bus/pci/devices` as on a PCIe surprise removal.

Beside the tree, `fleetwatch-sim/ibtools.json` carries what the fake `perfquery` and
`ibstat` print (LIDs, GUIDs, 64-bit extended counters); they find the tree through the
`FLEETWATCH_SYSFS_ROOT` environment variable that the tool wrappers set.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fleetwatch.collectors.sources.sysfs import PMA_ERROR_COUNTERS
from fleetwatch.sim.scenario import HcaSpec
from fleetwatch.sim.world import SimulatedNode

TOOLS_FILE: Final = Path("fleetwatch-sim") / "ibtools.json"
_SPEED_NAMES: Final = {25: "EDR", 50: "HDR", 100: "NDR", 200: "XDR", 10: "QDR", 14: "FDR"}
# Counter files by the simulated error they show (the inverse of PMA_ERROR_COUNTERS).
_ERROR_FILES: Final = {error: name for name, (error, _bits) in PMA_ERROR_COUNTERS.items()}
# The driver counters of a ConnectX-7 port as mlx5 lists them (26 files with `lifespan`),
# so benches and goldens read as many files as a real host has, not a sample.
_IB_HW_COUNTERS: Final = (
    "duplicate_request",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "req_rnr_retries_exceeded",
    "req_transport_retries_exceeded",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "rx_atomic_requests",
    "rx_dct_connect",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "rx_write_requests",
)
# RoCE ports add the congestion-control counters (ECN marks, CNPs sent and handled).
_ROCE_HW_COUNTERS: Final = (
    *_IB_HW_COUNTERS,
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
)
_DEFAULT_HOSTNAME: Final = "dgx-sim"
# PCI bus numbers of the eight GPUs of a DGX H100 in NVML order. GPU i and the HCA of
# rail i share a root port `_GPU_BELOW_ROOT` buses above the GPU.
_DGX_GPU_BUSES: Final = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_GPU_BELOW_ROOT: Final = 3
_SLOTS_PER_DOMAIN: Final = 28
# (path below devices/, vendor, device, class) of the functions that are not GPUs or HCAs.
_BMC_VGA: Final = (
    ("pci0000:00/0000:00:1c.0", "0x8086", "0x1bbc", "0x060400"),
    ("pci0000:00/0000:00:1c.0/0000:03:00.0", "0x1a03", "0x2000", "0x030000"),
)
_NVSWITCHES: Final = tuple(
    entry
    for i in range(4)
    for entry in (
        (f"pci0000:e0/0000:e0:0{i + 1}.0", "0x8086", "0x1bbc", "0x060400"),
        (f"pci0000:e0/0000:e0:0{i + 1}.0/0000:e{i + 1}:00.0", "0x10de", "0x22a3", "0x068000"),
    )
)


def rate_text(rate_gbps: float) -> str:
    """The kernel's rate line: `400 Gb/sec (4X NDR)`."""
    lane = rate_gbps / 4
    name = _SPEED_NAMES.get(int(lane), "SDR")
    number = int(rate_gbps) if float(rate_gbps).is_integer() else rate_gbps
    return f"{number} Gb/sec (4X {name})"


@dataclass(frozen=True, kw_only=True)
class _HcaPlace:
    """Where one HCA (and maybe its rail GPU) sits on the generated PCI tree."""

    hca_path: str
    gpu_path: str | None
    bridges: tuple[str, ...]
    numa_node: int


def _slot_root(slot: int) -> tuple[int, int]:
    """(PCI domain, root bus) of rail `slot` (GPU `slot` and HCA `slot`): a DGX H100's for
    the first eight, then 8 buses a slot, 28 slots a domain from domain 1, so addresses
    stay unique and in NVML order."""
    if slot < len(_DGX_GPU_BUSES):
        return 0, _DGX_GPU_BUSES[slot] - _GPU_BELOW_ROOT
    domain, index = divmod(slot - len(_DGX_GPU_BUSES), _SLOTS_PER_DOMAIN)
    return domain + 1, 0x10 + 8 * index


def gpu_pci_address(gpu: int) -> str:
    """The sysfs PCI address of simulated GPU `gpu` (`0000:18:00.0`)."""
    domain, root_bus = _slot_root(gpu)
    return f"{domain:04x}:{root_bus + _GPU_BELOW_ROOT:02x}:00.0"


def _place(index: int, gpus: int, hcas: int) -> _HcaPlace:
    """PCI paths for HCA `index`: rails pair HCA i with GPU i behind one PCIe switch."""
    domain, root_bus = _slot_root(index)
    dom = f"{domain:04x}"
    root = f"pci{dom}:{root_bus:02x}"
    root_port = f"{root}/{dom}:{root_bus:02x}:01.0"
    numa = 0 if index < max(hcas, 1) / 2 else 1
    hca = f"{dom}:{root_bus + 4:02x}:00.0"
    if index >= gpus:
        return _HcaPlace(
            hca_path=f"{root_port}/{hca}", gpu_path=None, bridges=(root_port,), numa_node=numa
        )
    switch = f"{root_port}/{dom}:{root_bus + 1:02x}:00.0"
    down_gpu = f"{switch}/{dom}:{root_bus + 2:02x}:00.0"
    down_hca = f"{switch}/{dom}:{root_bus + 2:02x}:01.0"
    return _HcaPlace(
        hca_path=f"{down_hca}/{hca}",
        gpu_path=f"{down_gpu}/{gpu_pci_address(index)}",
        bridges=(root_port, switch, down_gpu, down_hca),
        numa_node=numa,
    )


class SimulatedSysfs:
    """Writes the simulated node's sysfs tree under `root` at its current simulated time."""

    def __init__(self, *, node: SimulatedNode, root: Path, hostname: str = _DEFAULT_HOSTNAME):
        self.node = node
        self.root = root
        self.hostname = hostname
        # By path string (hashing a Path costs more than the write it guards).
        self._fds: dict[str, int] = {}
        self._written: dict[str, bytes] = {}  # what each file holds, to skip unchanged ones
        self._created = False

    def write(self, t: float | None = None) -> None:
        """Create the tree on first call, then refresh every changing file in place."""
        t = self.node.now() if t is None else t
        if not self._created:
            self._create_static()
            self._created = True
        self._remove_gpus_off_bus(t)
        tools: dict[str, Any] = {}
        for index, hca in enumerate(self.node.scenario.infiniband):
            tools[hca.device] = self._write_hca(index, hca, t)
        tools_data = json.dumps(tools, indent=1, sort_keys=True).encode()
        if self._written.get(str(TOOLS_FILE)) != tools_data:
            self._write_atomic(self.root / TOOLS_FILE, tools_data.decode())
            self._written[str(TOOLS_FILE)] = tools_data

    def close(self) -> None:
        """Close the descriptors kept for in-place updates."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    # -- static layout ------------------------------------------------------------------
    def _create_static(self) -> None:
        scenario = self.node.scenario
        hcas = len(scenario.infiniband)
        (self.root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
        (self.root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
        for index, hca in enumerate(scenario.infiniband):
            place = _place(index, scenario.gpus, hcas)
            for bridge in place.bridges:
                self._pci_function(bridge, vendor="0x8086", device="0x1bbc", pci_class="0x060400")
            if place.gpu_path is not None:
                self._pci_function(
                    place.gpu_path, vendor="0x10de", device="0x2330", pci_class="0x030200"
                )
                self._numa(place.gpu_path, place.numa_node)
            hca_class = "0x020700" if hca.link_layer == "InfiniBand" else "0x020000"
            self._pci_function(
                place.hca_path, vendor="0x15b3", device="0x1021", pci_class=hca_class
            )
            self._numa(place.hca_path, place.numa_node)
            self._create_device(index, hca, place)
        others = (*_BMC_VGA, *(_NVSWITCHES if scenario.gpus == 8 else ()))
        for path, vendor, device, pci_class in others:
            self._pci_function(path, vendor=vendor, device=device, pci_class=pci_class)
        # GPUs without an HCA of their own still appear on the bus.
        for gpu in range(hcas, scenario.gpus):
            place = _place(gpu, scenario.gpus, scenario.gpus)
            for bridge in place.bridges:
                self._pci_function(bridge, vendor="0x8086", device="0x1bbc", pci_class="0x060400")
            if place.gpu_path is not None:
                self._pci_function(
                    place.gpu_path, vendor="0x10de", device="0x2330", pci_class="0x030200"
                )
                self._numa(place.gpu_path, place.numa_node)

    def _pci_function(self, path: str, *, vendor: str, device: str, pci_class: str) -> None:
        directory = self.root / "devices" / path
        directory.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", pci_class)):
            (directory / name).write_text(value + "\n")
        link = self.root / "bus" / "pci" / "devices" / directory.name
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(directory, link.parent))

    def _remove_gpus_off_bus(self, t: float) -> None:
        """Take each GPU that fell off the bus out of `bus/pci/devices` and `devices/`."""
        pci = self.root / "bus" / "pci" / "devices"
        for gpu in range(self.node.scenario.gpus):
            link = pci / gpu_pci_address(gpu)
            if not self.node.gpu_on_bus(gpu, t) and link.is_symlink():
                shutil.rmtree(link.resolve())
                link.unlink()

    def _numa(self, path: str, numa_node: int) -> None:
        (self.root / "devices" / path / "numa_node").write_text(f"{numa_node}\n")

    def _create_device(self, index: int, hca: HcaSpec, place: _HcaPlace) -> None:
        pci_dir = self.root / "devices" / place.hca_path
        device_dir = pci_dir / "infiniband" / hca.device
        device_dir.mkdir(parents=True, exist_ok=True)
        static = {
            "fw_ver": "28.39.1002",
            "board_id": "MT_0000000838",
            "hca_type": "MT4129",
            "node_guid": _guid(index, 0),
            "sys_image_guid": _guid(index, 0),
            "node_desc": f"{self.hostname} {hca.device}",
            "node_type": "1: CA",
        }
        for name, value in static.items():
            (device_dir / name).write_text(value + "\n")
        device_link = device_dir / "device"
        if not device_link.is_symlink():
            device_link.symlink_to(os.path.relpath(pci_dir, device_dir))
        class_link = self.root / "class" / "infiniband" / hca.device
        if not class_link.is_symlink():
            class_link.symlink_to(os.path.relpath(device_dir, class_link.parent))
        for port in range(1, hca.ports + 1):
            port_dir = device_dir / "ports" / str(port)
            (port_dir / "counters").mkdir(parents=True, exist_ok=True)
            (port_dir / "hw_counters").mkdir(parents=True, exist_ok=True)
            (port_dir / "link_layer").write_text(hca.link_layer + "\n")
            (port_dir / "hw_counters" / "lifespan").write_text("10\n")
            lid = 0 if hca.link_layer == "Ethernet" else _lid(index, port)
            (port_dir / "lid").write_text(f"0x{lid:x}\n")
            (port_dir / "sm_lid").write_text("0x1\n" if lid else "0x0\n")

    # -- moving values ------------------------------------------------------------------
    def _write_hca(self, index: int, hca: HcaSpec, t: float) -> dict[str, Any]:
        node = self.node
        device_dir = self.root / "class" / "infiniband" / hca.device
        ports: dict[str, Any] = {}
        for port in range(1, hca.ports + 1):
            port_dir = f"{device_dir}/ports/{port}"
            state = node.port_state(hca.device, port, t)
            rate = state.rate_gbps if state.state_id == 4 else 10.0
            self._update(f"{port_dir}/state", f"{state.state_id}: {state.state}")
            self._update(f"{port_dir}/phys_state", f"{state.phys_state_id}: {state.phys_state}")
            self._update(f"{port_dir}/rate", rate_text(rate))
            counters = self._port_counters(hca.device, port, t)
            for name, value in counters.items():
                self._update(f"{port_dir}/counters/{name}", str(value))
            hw = _ROCE_HW_COUNTERS if hca.link_layer == "Ethernet" else _IB_HW_COUNTERS
            for offset, name in enumerate(hw):
                self._update(f"{port_dir}/hw_counters/{name}", str(int(t * offset) // 7))
            extended = {
                error: node.port_error_raw(hca.device, port, error, t) for error in _ERROR_FILES
            }
            lid = 0 if hca.link_layer == "Ethernet" else _lid(index, port)
            ports[str(port)] = {
                "state": state.state,
                "phys_state": state.phys_state,
                "rate_gbps": rate,
                "link_layer": hca.link_layer,
                "lid": lid,
                "sm_lid": 1 if lid else 0,
                "port_guid": _guid(index, port),
                "counters": counters,
                "extended": extended,
            }
        return {
            "hca_type": "MT4129",
            "firmware": "28.39.1002",
            "hardware": "0",
            "node_guid": _guid(index, 0),
            "ports": ports,
        }

    def _port_counters(self, device: str, port: int, t: float) -> dict[str, int]:
        node = self.node
        counters = {
            name: node.port_error(device, port, error, t) for error, name in _ERROR_FILES.items()
        }
        packets = {d: node.port_packets(device, port, d, t) for d in ("tx", "rx")}
        counters.update(
            {
                "port_xmit_data": node.port_data_words(device, port, "tx", t),
                "port_rcv_data": node.port_data_words(device, port, "rx", t),
                "port_xmit_packets": packets["tx"],
                "port_rcv_packets": packets["rx"],
                "multicast_xmit_packets": packets["tx"] // 1000,
                "multicast_rcv_packets": packets["rx"] // 1000,
                "unicast_xmit_packets": packets["tx"] - packets["tx"] // 1000,
                "unicast_rcv_packets": packets["rx"] - packets["rx"] // 1000,
            }
        )
        return counters

    def _update(self, path: str, text: str) -> None:
        """Rewrite `path` in place (same inode), creating it on first use; a file whose
        text has not changed is not touched (most error counters stand still)."""
        data = (text + "\n").encode()
        if self._written.get(path) == data:
            return
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        self._written[path] = data

    def _write_atomic(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(text)
        temporary.replace(path)


def _guid(index: int, port: int) -> str:
    value = 0xA088C20300B10000 + index * 0x100 + port
    text = f"{value:016x}"
    return ":".join(text[i : i + 4] for i in range(0, 16, 4))


def _lid(index: int, port: int) -> int:
    return 0x10 + index * 4 + port
