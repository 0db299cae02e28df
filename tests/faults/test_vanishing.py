"""Devices and mounts vanishing between listing and reading, and coming back.

A GPU's PCI function still listed in `bus/pci/devices` whose directory is gone (the middle of
a hot removal), and a mount still listed in mountinfo whose mount point is gone (unmounted
between the two reads): the other devices' and mounts' readings stay, the vanished one's
series are absent, and it is back in the next cycle once it reappears. A GPU lost from NVML
mid-cycle is driven on the real pynvml and the mock NVML
(`tests/faults/test_nvml_error_codes.py`: `GPU_IS_LOST`, `NOT_FOUND` and `GPU_NOT_FOUND` for
one GPU's handle from every call of a cycle).
"""

from __future__ import annotations

import os
from pathlib import Path

from fleetwatch.catalog.pci import GPU_PCI_INFO, GPUS_PCI_PRESENT
from fleetwatch.collectors import storage
from fleetwatch.collectors.pci import PciCollector
from fleetwatch.collectors.storage import StorageCollector, StorageSettings
from testbed.mounts import write_procfs
from tests.gpu.simnode import samples
from tests.storage.exposition import collect_samples
from tests.storage.exposition import sample as value_of

H100 = {"vendor": "0x10de", "device": "0x2330", "class": "0x030200"}


def pci_function(root: Path, address: str) -> Path:
    """An H100 function under `devices/pci0000:00/`, linked from `bus/pci/devices`."""
    directory = root / "devices" / "pci0000:00" / address
    directory.mkdir(parents=True)
    for name, text in H100.items():
        (directory / name).write_text(text + "\n")
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    link = bus / address
    if not link.is_symlink():
        link.symlink_to(os.path.relpath(directory, bus))
    return directory


def on_bus(collector: PciCollector) -> tuple[float, set[str]]:
    families = collector.collect()
    present = samples(families, GPUS_PCI_PRESENT.name)[()]
    info = {dict(labels)["pci_bus_id"] for labels in samples(families, GPU_PCI_INFO.name)}
    return present, info


def test_a_gpu_vanishing_mid_read_leaves_the_others_and_comes_back(tmp_path: Path) -> None:
    pci_function(tmp_path, "0000:18:00.0")
    vanishing = pci_function(tmp_path, "0000:2a:00.0")
    collector = PciCollector(root=tmp_path)
    for name in H100:
        (vanishing / name).unlink()
    vanishing.rmdir()  # still listed: removed between the listing and the read
    assert on_bus(collector) == (1.0, {"00000000:18:00.0"})
    pci_function(tmp_path, "0000:2a:00.0")  # back (a rescan found it again)
    assert on_bus(collector) == (2.0, {"00000000:18:00.0", "00000000:2A:00.0"})


def _local_mount(point: Path) -> str:
    return f"90 22 259:3 / {point} rw,relatime shared:50 - ext4 /dev/nvme1n1 rw\n"


def test_a_mount_vanishing_after_listing_is_counted_and_comes_back(tmp_path: Path) -> None:
    kept, vanishing = tmp_path / "kept", tmp_path / "vanishing"
    kept.mkdir()
    procfs = write_procfs(tmp_path / "proc", mountinfo=_local_mount(kept) + _local_mount(vanishing))
    collector = StorageCollector(
        procfs=procfs,
        settings=StorageSettings(mounts=(str(kept), str(vanishing))),
        wait=30.0,
    )
    try:
        gone = collect_samples(collector)  # listed in mountinfo; its mount point is not there
        vanishing.mkdir()
        back = collect_samples(collector)
    finally:
        collector.close()
    assert value_of(gone, storage.SIZE, mountpoint=str(kept)) is not None
    assert value_of(gone, storage.SIZE, mountpoint=str(vanishing)) is None  # absent, not 0
    errors = {
        dict(labels)["reason"]: count
        for (name, labels), count in gone.items()
        if name == storage.CALL_ERRORS and dict(labels)["mountpoint"] == str(vanishing)
    }
    assert errors == {"ENOENT": 1.0}
    assert value_of(back, storage.SIZE, mountpoint=str(vanishing)) is not None  # next cycle
    assert value_of(back, storage.SIZE, mountpoint=str(kept)) is not None
