"""Kernel-log records, fuzzed: every record the Xid and storage tests hold, as /dev/kmsg hands
them out, mutated (binary bytes, escapes, continuation lines, unterminated and 1 MiB lines).
A record gives an event, None or `Unreadable` with a known reason, never an exception; an
event comes only from a kernel-facility record and carries bounded, well-formed labels."""

from __future__ import annotations

import math
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

from hypothesis import given
from hypothesis import strategies as st

from fleetwatch.collectors.sources.kmsg import (
    MAX_RECORD,
    UNREADABLE_REASONS,
    FallenOffBus,
    KernelEvent,
    KernelXid,
    KmsgReader,
    SwitchXid,
    Unreadable,
    parse_record,
)
from fleetwatch.collectors.sources.kmsg_storage import StorageEvent
from tests.fuzz.harness import FUZZ, bounded_label, exercise, named, peak_bytes
from tests.fuzz.mutations import MIB, mutated_bytes, mutated_text
from tests.gpu.kmsglines import record

MESSAGES: Final = (
    "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:ab:00): 48, pid=1234, DBE",
    "NVRM: Xid (0000:03:00): 14, Channel 00000001",
    "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
    "(Node Reboot Required)",
    "NVRM: Xid (PCI:0000:04:00): 150, MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 "
    "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
    "NVRM: The NVIDIA GPU 0000:18:00.0\nNVRM: (PCI ID: 10de:2901) installed in this system "
    "has\nNVRM: fallen off the bus and is not responding to commands.\n",
    "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
    "NVRM: GPU has fallen off the bus.",
    "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV",
    "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Fatal, Link 30 LTSSM Fault Up\n"
    "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 30",
    "nfs: server nfs-1.example not responding, still trying",
    "nfs: server nfs-1.example OK",
    "INFO: task python3:4242 blocked for more than 122 seconds.",
    "EXT4-fs error (device sdb7): ext4_journal_check_start:87: comm torch: Detected aborted",
    "EXT4-fs (dm-17): Remounting filesystem read-only",
    "XFS (nvme1n1): Corruption of in-memory data detected.  Shutting down filesystem",
    "nvme nvme3: I/O 17 (Read) QID 4 timeout, aborting",
    "nvme nvme0: controller is down; will reset: CSTS=0x3, PCI_STATUS=0x10",
    "LustreError: 167-0: lustre-MDT0000-mdc: This client was evicted by lustre-MDT0000; in "
    "progress operations using this service will fail.",
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
)


def _escaped(message: str) -> str:
    """A message as /dev/kmsg escapes it (bytes below 0x20 or above 0x7e as \\xNN)."""
    return "".join(
        chr(byte) if 0x20 <= byte < 0x7F and byte != 0x5C else f"\\x{byte:02x}"
        for byte in message.encode()
    )


SEEDS: Final = (
    *(
        f"{prio},{n},{5_000_000 + n},-{flags};{_escaped(message)}\n{dictionary}"
        for n, message in enumerate(MESSAGES)
        for prio, flags, dictionary in (
            (3, "", ""),
            (4, ",caller=T1", " SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n"),
            (12, "", ""),  # what a write to /dev/kmsg from user space gets
        )
    ),
    record(1, 7.5, MESSAGES[0]),
    "garbage without a header\n",
    " KEY=continuation\n",
)

PCI: Final = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}")
_PRIORITY: Final = re.compile(r"(\d{1,20}),")


def kernel_wrote(line: str) -> bool:
    """Whether the record's priority is of the kernel's facility (0)."""
    found = _PRIORITY.match(line)
    return found is not None and int(found[1]) >> 3 == 0


Reading = KernelEvent | Unreadable | None


def record_holds(line: str) -> Callable[[Reading], None]:
    """What a reading of one line must satisfy; a function of the result for `exercise`."""

    def holds(found: Reading) -> None:
        if isinstance(found, Unreadable):
            assert found.reason in UNREADABLE_REASONS
            named(found.why)
            return
        if found is None:
            return
        assert kernel_wrote(line), "an event from a record the kernel did not write"
        assert found.sequence >= 0
        assert math.isfinite(found.seconds)
        assert found.seconds >= 0
        match found:
            case KernelXid():
                assert PCI.fullmatch(found.pci_bus_id)
                assert 1 <= found.xid <= 9999
                assert found.recovery_action is None or found.recovery_action >= 0
            case FallenOffBus():
                assert found.pci_bus_id == "" or PCI.fullmatch(found.pci_bus_id)
            case SwitchXid():
                assert PCI.fullmatch(found.pci_bus_id)
                assert 0 <= found.sxid <= 99999
                assert re.fullmatch(r"nvswitch\d+", found.device)
            case StorageEvent():
                for label in (found.subject, found.fs, found.detail):
                    bounded_label(label, MAX_RECORD)

    return holds


def _malformed(found: Reading) -> bool:
    return isinstance(found, Unreadable)


@FUZZ
@given(mutated_text(SEEDS))
def test_kernel_log_record(text: str) -> None:
    for line in text.split("\n"):
        exercise(
            "kernel log record (kmsg)",
            parse_record,
            line,
            malformed=_malformed,
            holds=record_holds(line),
        )


@FUZZ
@given(mutated_bytes([seed.encode() for seed in SEEDS]), st.integers(1, 4))
def test_kernel_log_reader(raw: bytes, pieces: int) -> None:
    """The reader of a file of records: bytes split anywhere, lines left unterminated."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kmsg"
        path.write_bytes(b"")
        reader = KmsgReader(path=path)
        try:
            lines: list[str] = []
            step = max(len(raw) // pieces, 1)
            for start in range(0, len(raw), step):
                with path.open("ab") as log:
                    log.write(raw[start : start + step])
                lines += reader.read(0.0)
        finally:
            reader.close()
    for line in lines:
        assert len(line) <= MAX_RECORD + 1
        exercise(
            "kernel log reader (kmsg file)",
            parse_record,
            line,
            malformed=_malformed,
            holds=record_holds(line),
        )


def test_a_megabyte_line_costs_bounded_memory_and_is_malformed() -> None:
    line = "3,1,1,-;NVRM: Xid (PCI:0000:18:00): 79, " + "\\x41" * MIB
    found: list[object] = []
    peak = peak_bytes(lambda: found.append(parse_record(line)))
    assert isinstance(found[0], Unreadable)
    assert peak < 64 * 1024  # the line is refused, not copied, unescaped or searched
