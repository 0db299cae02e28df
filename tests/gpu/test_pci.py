"""GPUs counted on the PCI bus from sysfs, without NVML: fixture trees and the simulation."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pynvml
import pytest

from fleetwatch.catalog.gpu import GPUS_VISIBLE
from fleetwatch.catalog.pci import GPU_PCI_INFO, GPUS_PCI_PRESENT
from fleetwatch.cli import build_parser
from fleetwatch.collectors import COLLECTORS
from fleetwatch.collectors.base import CollectorContext
from fleetwatch.collectors.gpu import GpuCollector
from fleetwatch.collectors.pci import READ_ERRORS, PciCollector
from fleetwatch.collectors.sources.nvml import NvmlSource
from fleetwatch.collectors.sources.nvml_calls import NvmlError
from fleetwatch.collectors.sources.pci import nvml_bus_id
from fleetwatch.collectors.xid import FALLEN_OFF_BUS, XidCollector, XidLedger
from fleetwatch.exporter.export import close_collectors, create_collectors
from fleetwatch.exporter.settings import ExportSettings
from fleetwatch.sim import loopback_servers as servers
from fleetwatch.sim.fake_nvml import simulated_pci_bus_id
from fleetwatch.sim.fault_base import Fault, GpuFault
from fleetwatch.sim.gpu_faults import GpuLost, GpuOffBus
from fleetwatch.sim.kernel_log import SimulatedKernelLog
from fleetwatch.sim.sysfs_tree import SimulatedSysfs
from tests.golden import assert_golden
from tests.gpu.simnode import samples, simulated, text

H100 = {"vendor": "0x10de", "device": "0x2330", "class": "0x030200"}


def function(root: Path, address: str, files: Mapping[str, str], *, parent: str = "") -> Path:
    """A PCI function under `devices/pci0000:00/[parent/]address`, linked from bus/pci/devices."""
    directory = root / "devices" / "pci0000:00" / parent / address
    directory.mkdir(parents=True)
    for name, value in files.items():
        (directory / name).write_text(value + "\n")
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / address).symlink_to(os.path.relpath(directory, bus))
    return directory


def collect(root: Path, collector: PciCollector | None = None) -> dict[str, dict[str, float]]:
    """The collector's samples by family, each keyed by its labels as `k=v,...`."""
    families = (collector or PciCollector(root=root)).collect()
    return {
        name: {",".join(f"{k}={v}" for k, v in labels): value for labels, value in found.items()}
        for name in (GPUS_PCI_PRESENT.name, GPU_PCI_INFO.name, READ_ERRORS)
        if (found := samples(families, name))
    }


def test_counts_gpus_by_vendor_and_display_class_only(tmp_path: Path) -> None:
    function(tmp_path, "0000:18:00.0", H100)  # H100 SXM: 3D controller
    function(tmp_path, "0000:2a:00.0", {**H100, "class": "0x030000", "device": "0x20b0"})  # VGA
    nvswitch = {**H100, "class": "0x068000", "device": "0x22a3"}
    function(tmp_path, "0000:e1:00.0", nvswitch)
    function(tmp_path, "0000:2a:00.1", {**H100, "class": "0x040300", "device": "0x1aef"})  # audio
    bmc_vga = {"vendor": "0x1a03", "device": "0x2000", "class": "0x030000"}
    function(tmp_path, "0000:03:00.0", bmc_vga)
    hca = {"vendor": "0x15b3", "device": "0x1021", "class": "0x020700"}
    function(tmp_path, "0000:19:00.0", hca)
    # An SR-IOV virtual function of the H100 (a vGPU host lists dozens): not a GPU of its own.
    vf = function(tmp_path, "0000:18:00.4", H100)
    (vf / "physfn").symlink_to("../0000:18:00.0")
    assert collect(tmp_path) == {
        GPUS_PCI_PRESENT.name: {"": 2.0},
        GPU_PCI_INFO.name: {
            "device_id=0x2330,pci_bus_id=00000000:18:00.0": 1.0,
            "device_id=0x20b0,pci_bus_id=00000000:2A:00.0": 1.0,
        },
    }


def test_no_pci_sysfs_is_no_series_and_an_empty_bus_is_zero(tmp_path: Path) -> None:
    assert PciCollector(root=tmp_path).collect() == []
    (tmp_path / "bus" / "pci" / "devices").mkdir(parents=True)
    assert collect(tmp_path) == {GPUS_PCI_PRESENT.name: {"": 0.0}}


def test_unreadable_files_are_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    function(tmp_path, "0000:18:00.0", H100)
    function(tmp_path, "0000:2a:00.0", {**H100, "class": "VGA"})  # garbage
    fifo = function(tmp_path, "0000:3a:00.0", {"class": "0x030200", "device": "0x2330"})
    os.mkfifo(fifo / "vendor")  # must not block the reader
    function(tmp_path, "0000:5d:00.0", {"vendor": "0x10de", "class": "0x030200"})  # no device
    collector = PciCollector(root=tmp_path)
    with caplog.at_level(logging.WARNING):
        first = collect(tmp_path, collector)
        second = collect(tmp_path, collector)
    # The GPU without a `device` file still counts: vendor and class say what it is.
    assert first[GPUS_PCI_PRESENT.name] == {"": 2.0}
    assert set(first[GPU_PCI_INFO.name]) == {
        "device_id=0x2330,pci_bus_id=00000000:18:00.0",
        "device_id=,pci_bus_id=00000000:5D:00.0",
    }
    assert first[READ_ERRORS] == {"": 3.0}
    assert second[READ_ERRORS] == {"": 6.0}
    logged = [
        Path(r.__dict__["path"]) for r in caplog.records if r.name == "fleetwatch.collectors.pci"
    ]
    assert sorted((p.parent.name, p.name) for p in logged) == [
        ("0000:2a:00.0", "class"),
        ("0000:3a:00.0", "vendor"),
        ("0000:5d:00.0", "device"),
    ]


def test_a_function_removed_while_read_is_gone_not_an_error(tmp_path: Path) -> None:
    function(tmp_path, "0000:18:00.0", H100)
    gone = function(tmp_path, "0000:2a:00.0", H100)
    for name in H100:
        (gone / name).unlink()
    gone.rmdir()  # bus/pci/devices still links to it, as in the middle of a hot removal
    assert collect(tmp_path) == {
        GPUS_PCI_PRESENT.name: {"": 1.0},
        GPU_PCI_INFO.name: {"device_id=0x2330,pci_bus_id=00000000:18:00.0": 1.0},
    }


def test_an_unlistable_bus_fails_the_collector(tmp_path: Path) -> None:
    (tmp_path / "bus" / "pci").mkdir(parents=True)
    (tmp_path / "bus" / "pci" / "devices").write_text("not a folder\n")
    with pytest.raises(OSError, match="devices"):
        PciCollector(root=tmp_path).collect()


@pytest.mark.parametrize(
    ("address", "expected"),
    [("0000:18:00.0", "00000000:18:00.0"), ("0000:db:00.1", "00000000:DB:00.1"),
     ("10000:e1:1f.7", "00010000:E1:1F.7")],
)  # fmt: skip
def test_bus_ids_are_written_as_nvml_writes_them(address: str, expected: str) -> None:
    assert nvml_bus_id(address) == expected


def simulated_tree(root: Path, *faults: Fault, at: float = 120.0) -> NvmlSource:
    """The dgx-h100 node with `faults` at time `at`: its sysfs tree under `root`, its NVML."""
    fake, source = simulated(at=at, faults=faults)
    SimulatedSysfs(node=fake.node, root=root).write()
    return source


def test_golden_exposition(tmp_path: Path) -> None:
    """The simulated DGX H100's bus: 8 GPUs among NVSwitches, the BMC's VGA, HCAs, bridges."""
    simulated_tree(tmp_path)
    assert_golden("pci/dgx-h100.prom", text(PciCollector(root=tmp_path).collect()))


def test_simulated_gpus_sit_at_the_bus_ids_nvml_reports(tmp_path: Path) -> None:
    source = simulated_tree(tmp_path)
    nvml_ids = {gpu.identity.pci_bus_id for gpu in source.gpus()}
    assert set(collect(tmp_path)[GPU_PCI_INFO.name]) == {
        f"device_id=0x2330,pci_bus_id={bus_id}" for bus_id in nvml_ids
    }
    assert len(nvml_ids) == 8


def test_bus_ids_stay_unique_and_in_order_on_a_rack() -> None:
    ids = [simulated_pci_bus_id(gpu) for gpu in range(72)]
    assert ids == sorted(set(ids))


@pytest.mark.parametrize(
    ("kind", "visible", "on_bus"), [(GpuLost, 7.0, 8.0), (GpuOffBus, 7.0, 7.0)]
)
def test_a_lost_gpu_stays_on_the_bus_until_it_falls_off(
    tmp_path: Path, kind: type[GpuFault], visible: float, on_bus: float
) -> None:
    source = simulated_tree(tmp_path, kind(at=50.0, gpu=3))
    gpu = GpuCollector(source=source, expected_count=None).collect()
    assert samples(gpu, GPUS_VISIBLE.name) == {(): visible}
    pci = collect(tmp_path)
    assert pci[GPUS_PCI_PRESENT.name] == {"": on_bus}
    assert (f"device_id=0x2330,pci_bus_id={simulated_pci_bus_id(3)}" in pci[GPU_PCI_INFO.name]) == (
        on_bus == 8.0
    )


def test_falling_off_the_bus_is_logged_by_the_kernel(tmp_path: Path) -> None:
    fake, source = simulated(at=120.0, faults=(GpuOffBus(at=50.0, gpu=3),))
    log = SimulatedKernelLog(node=fake.node)
    log.opened_at = 0.0  # the exporter started at boot: the fall is news
    collector = XidCollector(
        source=source, kernel_log=log, ledger=XidLedger(window=10.0), nvml_events=False
    )
    try:
        servers.wait_until(
            lambda: samples(collector.collect(), FALLEN_OFF_BUS) or None,
            timeout=10,
            what="the fallen-off-the-bus record",
        )
        ((labels, count),) = samples(collector.collect(), FALLEN_OFF_BUS).items()
    finally:
        collector.close()
    assert dict(labels)["pci_bus_id"] == "0000:5d:00"
    assert count == 1.0


@pytest.mark.parametrize(
    "error", [pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_LibRmVersionMismatch]
)
def test_the_count_survives_an_nvml_that_does_not_start(
    tmp_path: Path, error: type[pynvml.NVMLError]
) -> None:
    """The point of counting on the bus: with NVML broken (no driver, or a driver upgraded
    under a running kernel module), the GPUs are still seen."""
    fake, _ = simulated()
    SimulatedSysfs(node=fake.node, root=tmp_path).write()
    fake.fail("nvmlInit", error=error)
    args = build_parser().parse_args(["export", f"--path.sysfs={tmp_path}"])
    context = CollectorContext(sysfs_root=tmp_path, nvml=fake)
    collectors = create_collectors(context, ExportSettings.from_args(args, COLLECTORS))
    try:
        try:
            gpu = collectors["gpu"].collect()
        except NvmlError:
            gpu = []
        assert gpu == []
        assert samples(collectors["pci"].collect(), GPUS_PCI_PRESENT.name) == {(): 8.0}
    finally:
        close_collectors(collectors)


def test_a_gpu_that_appears_or_leaves_shows_in_the_next_cycle(tmp_path: Path) -> None:
    function(tmp_path, "0000:18:00.0", H100)
    collector = PciCollector(root=tmp_path)
    assert collect(tmp_path, collector)[GPUS_PCI_PRESENT.name] == {"": 1.0}
    added = function(tmp_path, "0000:2a:00.0", H100)
    found = collect(tmp_path, collector)
    assert found[GPUS_PCI_PRESENT.name] == {"": 2.0}
    assert "device_id=0x2330,pci_bus_id=00000000:2A:00.0" in found[GPU_PCI_INFO.name]
    (tmp_path / "bus" / "pci" / "devices" / "0000:2a:00.0").unlink()
    shutil.rmtree(added)
    assert collect(tmp_path, collector) == {
        GPUS_PCI_PRESENT.name: {"": 1.0},
        GPU_PCI_INFO.name: {"device_id=0x2330,pci_bus_id=00000000:18:00.0": 1.0},
    }


def test_a_known_function_is_not_read_again(tmp_path: Path) -> None:
    gpu = function(tmp_path, "0000:18:00.0", H100)
    collector = PciCollector(root=tmp_path)
    first = collect(tmp_path, collector)
    (gpu / "vendor").write_text("garbage\n")  # read again, it would no longer count
    assert collect(tmp_path, collector) == first
    assert collect(tmp_path, PciCollector(root=tmp_path))[GPUS_PCI_PRESENT.name] == {"": 0.0}
