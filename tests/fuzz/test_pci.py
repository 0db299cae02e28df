"""PCI sysfs, fuzzed: the vendor, class and device files of the functions a GPU node shows
(an H100, a VGA BMC, an NVSwitch, an HCA; tests/gpu/test_pci.py's), with mutated contents.
A garbage file is a problem and its function is not counted; a GPU is counted only from
well-formed ids."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Final

from hypothesis import given
from hypothesis import strategies as st

from fleetwatch.collectors.sources.pci import PciGpuScan, scan_gpus
from tests.fuzz.harness import FUZZ_COSTLY, exercise, named
from tests.fuzz.mutations import mutated_text

FUNCTIONS: Final = {
    "0000:18:00.0": {"vendor": "0x10de", "class": "0x030200", "device": "0x2330"},
    "0000:2a:00.0": {"vendor": "0x10de", "class": "0x030000", "device": "0x20b0"},
    "0000:03:00.0": {"vendor": "0x1a03", "class": "0x030000", "device": "0x2000"},
    "0000:e1:00.0": {"vendor": "0x10de", "class": "0x068000", "device": "0x22a3"},
    "0000:19:00.0": {"vendor": "0x15b3", "class": "0x020700", "device": "0x1021"},
}
ID_TEXT: Final = mutated_text(
    sorted({value + "\n" for files in FUNCTIONS.values() for value in files.values()}),
    steps=2,
    huge=65536,
)
ID: Final = re.compile(r"0x[0-9a-f]{4}")


def scan_holds(scan: PciGpuScan | None) -> None:
    assert scan is not None
    for gpu in scan.gpus:
        assert gpu.address in FUNCTIONS
        assert gpu.device_id == "" or ID.fullmatch(gpu.device_id)
    for problem in scan.problems:
        named(problem.reason)


@FUZZ_COSTLY
@given(
    st.fixed_dictionaries(
        {
            address: st.fixed_dictionaries(dict.fromkeys(files, ID_TEXT))
            for address, files in FUNCTIONS.items()
        }
    )
)
def test_pci_sysfs(functions: dict[str, dict[str, str]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for address, files in functions.items():
            directory = root / "bus" / "pci" / "devices" / address
            directory.mkdir(parents=True)
            for name, text in files.items():
                (directory / name).write_bytes(text.encode(errors="surrogateescape"))
        exercise(
            "PCI sysfs ids",
            scan_gpus,
            root,
            malformed=lambda scan: scan is None or bool(scan.problems),
            holds=scan_holds,
        )
