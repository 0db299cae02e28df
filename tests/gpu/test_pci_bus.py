"""The PCI bus is listed every cycle and a function's ids read once: a GPU that appears or
falls off the bus shows in the next cycle, and a known function is not read again."""

from __future__ import annotations

import shutil
from pathlib import Path

from fleetwatch.catalog.pci import GPU_PCI_INFO, GPUS_PCI_PRESENT
from fleetwatch.collectors.pci import PciCollector
from tests.gpu.test_pci import H100, collect, function


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
