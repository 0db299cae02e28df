"""Xid counters from injected NVML events and kernel-log lines, de-duplicated."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.cli import build_parser
from fleetwatch.collectors import xid
from fleetwatch.collectors.base import CollectorContext
from fleetwatch.collectors.sources.kmsg import (
    FallenOffBus,
    KernelXid,
    KmsgReader,
    NvlinkFields,
    SwitchXid,
    Unreadable,
    normalize_pci,
    parse_record,
    unescape,
)
from fleetwatch.collectors.xid import (
    LISTENING,
    NVML_ERRORS,
    NvmlXids,
    Origin,
    XidCollector,
    XidLedger,
)
from fleetwatch.exporter.render import Renderer
from fleetwatch.sim import loopback_servers as servers
from fleetwatch.sim.fake_nvml import FakeNvml, simulated_pci_bus_id
from fleetwatch.sim.gpu_faults import GpuLost, Xid
from fleetwatch.sim.kernel_log import SimulatedKernelLog
from fleetwatch.sim.nvml_records import FakeEventData, FakeEventSet
from tests.gpu.kmsglines import an_hour_ago, record
from tests.gpu.simnode import samples, simulated

XID = "fleetwatch_gpu_xid_errors_total"


def xids(collector: XidCollector) -> dict[tuple[str, str], float]:
    return {
        (dict(k)["gpu"], dict(k)["xid"]): v for k, v in samples(collector.collect(), XID).items()
    }


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "3,7,5000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.",
            KernelXid(pci_bus_id="0000:18:00", xid=79, sequence=7, seconds=5.0),
        ),
        (
            "4,1207,5312345678,-;NVRM: Xid (PCI:0000:ab:00): 48, pid=1234, DBE",
            KernelXid(pci_bus_id="0000:ab:00", xid=48, sequence=1207, seconds=5312.345678),
        ),
        (
            "3,8,1,-,caller=T1;NVRM: Xid (PCI:0000:DB:00.0): 119, pid=1, Timeout",
            KernelXid(pci_bus_id="0000:db:00", xid=119, sequence=8, seconds=1e-6),
        ),
        (
            "3,9,2,-;NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
            FallenOffBus(pci_bus_id="0000:91:00", sequence=9, seconds=2e-6),
        ),
        (
            "3,10,3,-;NVRM: GPU at PCI:0000:1a:00: GPU has fallen off the bus.",
            FallenOffBus(pci_bus_id="0000:1a:00", sequence=10, seconds=3e-6),
        ),
        (
            "3,11,4,-;NVRM: GPU has fallen off the bus.",
            FallenOffBus(pci_bus_id="", sequence=11, seconds=4e-6),
        ),
        (
            "4,12,5,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 "
            "egress non-posted PRIV error (First)",
            SwitchXid(
                device="nvswitch3",
                pci_bus_id="0000:05:00",
                sxid=12028,
                fatal=False,
                sequence=12,
                seconds=5e-6,
            ),
        ),
        (
            "3,13,6,-;nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM "
            "Fault Up",
            SwitchXid(
                device="nvswitch1",
                pci_bus_id="0000:06:00",
                sxid=20034,
                fatal=True,
                sequence=13,
                seconds=6e-6,
            ),
        ),
        # The driver's follow-up line of an SXid already counted, other messages, a record's
        # continuation line, blank lines: nothing.
        ("4,14,7,-;nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 22013, Severity 0 Engine", None),
        ("6,99,1,-;usb 1-1: new device", None),
        (" SUBSYSTEM=pci", None),
        ("", None),
    ],
)
def test_parse_records(line: str, expected: object) -> None:
    assert parse_record(line) == expected


def kmsg_record(sequence: int, usec: int, message: str, *, dictionary: str = "") -> str:
    r"""One record as /dev/kmsg's read() builds it: header, the message with every byte below
    0x20 or above 0x7e (and the backslash) escaped as \xNN, then " KEY=value" lines."""
    escaped = "".join(
        f"\\x{byte:02x}" if byte < 0x20 or byte > 0x7E or byte == 0x5C else chr(byte)
        for byte in message.encode()
    )
    return f"3,{sequence},{usec},-;{escaped}\n{dictionary}"


# The driver's own texts (open-gpu-kernel-modules' nv.c, one nv_printf, and NVIDIA's Xid docs).
DRIVER_FALLEN = (
    "NVRM: The NVIDIA GPU 0000:18:00.0\n"
    "NVRM: (PCI ID: 10de:2901) installed in this system has\n"
    "NVRM: fallen off the bus and is not responding to commands.\n"
)
DRIVER_FALLEN_NO_ID = (
    "NVRM: The NVIDIA GPU 0000:3b:00.0\n"
    "NVRM: installed in this system has\n"
    "NVRM: fallen off the bus and is not responding to commands.\n"
)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (DRIVER_FALLEN, FallenOffBus(pci_bus_id="0000:18:00", sequence=40, seconds=7.5)),
        (DRIVER_FALLEN_NO_ID, FallenOffBus(pci_bus_id="0000:3b:00", sequence=40, seconds=7.5)),
        (
            "NVRM: GPU 18:00.0: GPU has fallen off the bus.",
            FallenOffBus(pci_bus_id="0000:18:00", sequence=40, seconds=7.5),
        ),
        (
            "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
            "(Node Reboot Required)",
            KernelXid(
                pci_bus_id="0000:18:00", xid=154, sequence=40, seconds=7.5, recovery_action=2
            ),
        ),
        (
            "NVRM: Xid (PCI:0000:04:00): 150, MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 "
            "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
            KernelXid(
                pci_bus_id="0000:04:00",
                xid=150,
                sequence=40,
                seconds=7.5,
                nvlink=NvlinkFields(unit="MSE_WATCHDOG", fatal=True, intr_info=0, error_status=0),
            ),
        ),
        (
            "NVRM: Xid (0000:03:00): 14, Channel 00000001",  # before the driver printed "PCI:"
            KernelXid(pci_bus_id="0000:03:00", xid=14, sequence=40, seconds=7.5),
        ),
        (
            "NVRM: Xid (PCI:0000:5a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen "
            "off the bus.",
            KernelXid(pci_bus_id="0000:5a:00", xid=79, sequence=40, seconds=7.5),
        ),
        (
            "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Fatal, Link 30 LTSSM Fault Up\n"
            "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 30",
            SwitchXid(
                device="nvswitch2",
                pci_bus_id="0000:07:00",
                sxid=20034,
                fatal=True,
                sequence=40,
                seconds=7.5,
            ),
        ),
    ],
)
def test_driver_texts_as_dev_kmsg_delivers_them(message: str, expected: object) -> None:
    line, *dictionary = kmsg_record(
        40, 7_500_000, message, dictionary=" SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n"
    ).split("\n")
    assert ("\\x0a" in line) == ("\n" in message)  # the driver's newlines, escaped
    assert parse_record(line) == expected
    assert [parse_record(extra) for extra in dictionary] == [None] * len(dictionary)


def test_unescape_gives_back_the_bytes() -> None:
    assert unescape("a\\x0ab\\x5cx41\\xc3\\xa9") == "a\nb\\x41\u00e9"
    assert unescape("no escapes") == "no escapes"


@pytest.mark.parametrize(
    ("line", "reason", "why"),
    [
        ("NVRM: Xid (PCI:0000:18:00): 13", "no_timestamp", "not a prio,seq,usec,flags;message"),
        ("[ 12.3] NVRM: Xid (PCI:0000:DB:00.0): 119, pid=1, Timeout", "no_timestamp", "not a"),
        ("3,5,,-;NVRM: Xid (PCI:0000:18:00): 48, pid=1", "no_timestamp", "not a"),
        ("3,x,1,-;NVRM: Xid (PCI:0000:18:00): 48, pid=1", "no_timestamp", "not a"),
        ("3,5,1,-;NVRM: Xid (PCI:0000:18:00): , pid=1", "malformed", "Xid record does not"),
        ("3,5,1,-;NVRM: Xid (PCI:zz:18:00): 79, pid=1", "malformed", "Xid record does not"),
        ("3,5,1,-;NVRM: Xid (PCI:0000:18:00): 0, pid=1", "malformed", "Xid record does not"),
        ("3,5,1,-;NVRM: Xid (PCI:0000:1", "malformed", "Xid record does not parse"),  # truncated
        ("3,5,1,-;NVRM: Xid (PCI:\\x00\\xff\\x01", "binary", "Xid record holds binary data"),
        ("3,5,1,-;nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): garbled, Fatal", "malformed", "SXid"),
        (
            "3,5,1,-;NVRM: The NVIDIA GPU \\x8a\\x07 has fallen off the bus",
            "binary",
            "fallen-off-the-bus record holds binary data",
        ),
        (
            "3,5,1,-;NVRM: The NVIDIA GPU 0000:18:00.0\\x0aNVRM: (PCI ID: 10de:2901) install",
            None,  # truncated before the words that say what happened: not ours, not counted
            None,
        ),
        (
            "3,5,1,-;NVRM: GPU zz: GPU has fallen off the bus.",
            "malformed",
            "fallen-off-the-bus record does not parse",
        ),
    ],
)
def test_unreadable_records(line: str, reason: str | None, why: str | None) -> None:
    found = parse_record(line)
    if reason is None:
        assert found is None
        return
    assert isinstance(found, Unreadable)
    assert (found.reason, found.line) == (reason, line)
    assert why is not None
    assert found.why.startswith(why)


def test_normalize_pci() -> None:
    assert normalize_pci("00000000:18:00.0") == normalize_pci("0000:18:00") == "0000:18:00"
    assert normalize_pci("18:00.0") == normalize_pci("18:00") == "0000:18:00"


def test_ledger_counts_each_xid_once_across_sources() -> None:
    clock = ManualClock()
    ledger = XidLedger(window=10.0, clock=clock)
    assert ledger.record(gpu="3", uuid="u3", xid=79, origin="nvml")
    clock.now += 2
    assert not ledger.record(gpu="3", uuid="u3", xid=79, origin="kmsg")  # the same event
    assert ledger.record(gpu="3", uuid="u3", xid=79, origin="kmsg", at=100.0)  # old history
    clock.now += 60
    assert ledger.record(gpu="3", uuid="u3", xid=79, origin="nvml")  # a new one later
    assert ledger.record(gpu="3", uuid="u3", xid=48, origin="kmsg", sequence=7)
    assert not ledger.record(gpu="3", uuid="u3", xid=48, origin="kmsg", sequence=7)  # reread
    assert ledger.counts() == {("3", "u3", "79"): 3, ("3", "u3", "48"): 1}


def test_an_nvml_take_matches_a_kernel_record_anywhere_in_its_span() -> None:
    """An NVML take reports what was raised since the last one: a kernel record of the same
    Xid within the window of that span is the same event, however long the span."""
    clock = ManualClock()
    clock.now = 1000.0
    ledger = XidLedger(window=10.0, clock=clock)
    assert ledger.record(gpu="1", uuid="u1", xid=48, origin="kmsg", at=970.0)
    assert not ledger.record(gpu="1", uuid="u1", xid=48, origin="nvml", since=940.0)  # 940-1000
    assert ledger.record(gpu="1", uuid="u1", xid=48, origin="nvml", since=1000.0, at=1060.0)
    assert not ledger.record(gpu="1", uuid="u1", xid=48, origin="kmsg", at=1068.0)  # in window
    assert ledger.record(gpu="1", uuid="u1", xid=48, origin="nvml", since=1060.0, at=1120.0)
    assert ledger.record(gpu="1", uuid="u1", xid=48, origin="kmsg", at=1135.0)  # 15 s after
    assert ledger.counts() == {("1", "u1", "48"): 4}


@given(
    gaps=st.lists(st.floats(min_value=21.0, max_value=400.0), min_size=1, max_size=25),
    interval=st.floats(min_value=0.5, max_value=120.0),
    offset=st.floats(min_value=0.0, max_value=1.0),
    delays=st.lists(st.floats(min_value=0.0, max_value=3.0), min_size=25, max_size=25),
)
def test_each_xid_both_sources_report_counts_once(
    gaps: list[float], interval: float, offset: float, delays: list[float]
) -> None:
    """Xids more than two windows apart, each logged by the kernel (stamped when raised, read
    up to 3 s later) and taken from NVML at the next run (reported as raised since the last
    run), whatever the interval: the ledger counts each once, in any order of arrival."""
    window = 10.0
    raised = [1000.0 + sum(gaps[: n + 1]) for n in range(len(gaps))]
    runs = [1000.0 + offset * interval + k * interval for k in range(int(sum(gaps) / interval) + 3)]
    # (arrives, 0 kernel / 1 NVML, at, since)
    arrivals: list[tuple[float, int, float, float | None]] = []
    for n, at in enumerate(raised):
        arrivals.append((at + delays[n], 0, at, None))  # the kernel record
        run = next(k for k, t in enumerate(runs) if t >= at)
        last_run = runs[run - 1] if run else 990.0
        arrivals.append((runs[run], 1, runs[run], last_run))  # the NVML take
    ledger = XidLedger(window=window, clock=ManualClock())
    for _arrives, nvml, at, since in sorted(arrivals, key=lambda a: (a[0], a[1])):
        origin: Origin = "nvml" if nvml else "kmsg"
        ledger.record(gpu="2", uuid="u2", xid=48, origin=origin, at=at, since=since)
    assert ledger.counts() == {("2", "u2", "48"): len(raised)}


def test_reports_kept_for_a_match_are_bounded() -> None:
    ledger = XidLedger(window=10.0, clock=ManualClock())
    for _ in range(1000):  # an Xid storm seen by NVML alone
        ledger.record(gpu="0", uuid="u0", xid=13, origin="nvml")
    assert ledger.counts() == {("0", "u0", "13"): 1000}
    assert len(ledger._unmatched["nvml", "0", "13"]) == 256


def family(collector: XidCollector, name: str) -> dict[tuple[str, ...], float]:
    """Samples of family `name` by label values, labels in name order."""
    return {
        tuple(v for _, v in k): value for k, value in samples(collector.collect(), name).items()
    }


def test_injected_nvml_events_and_kernel_log_lines(tmp_path: Path) -> None:
    fake, source = simulated(at=120.0)
    bus = {g.index: normalize_pci(g.identity.pci_bus_id) for g in source.gpus()}
    log = tmp_path / "kmsg"
    log.touch()
    collector = XidCollector(
        source=source, kernel_log=KmsgReader(path=log), ledger=XidLedger(window=5.0)
    )
    now = time.monotonic()
    log.write_text(
        record(1, now, f"NVRM: Xid (PCI:{bus[2]}): 31, pid=77, MMU fault")
        + record(2, now, "garbage without an xid")
        + record(1, now, f"NVRM: Xid (PCI:{bus[2]}): 31, pid=77, MMU fault")  # read twice
    )
    try:
        collector.start()
        fake.inject_xid(5, 74)
        fake.inject_xid(5, 74)
        expected = {("2", "31"): 1.0, ("5", "74"): 2.0}
        servers.wait_until(lambda: xids(collector) == expected, timeout=10, what="Xid counters")
        with log.open("a") as more:
            more.write(record(3, time.monotonic(), f"NVRM: Xid (PCI:{bus[5]}): 74, pid=1"))
        fake.inject_xid(5, 74)  # the NVML report of the same event as the new kernel line
        third = {("2", "31"): 1.0, ("5", "74"): 3.0}
        servers.wait_until(lambda: xids(collector) == third, timeout=10, what="third Xid 74")
        assert xids(collector) == third  # counted once, not once a source
    finally:
        collector.close()


def wait_for_unreadable(
    collector: XidCollector, *, no_timestamp: float, malformed: float, what: str
) -> None:
    """Wait until the unreadable-record counters read these counts (the records before
    them have been handled by then)."""
    expected = {
        ("no_timestamp",): no_timestamp,
        ("malformed",): malformed,
        ("binary",): 0.0,
        ("user_space",): 0.0,
    }
    servers.wait_until(
        lambda: family(collector, "fleetwatch_kmsg_unreadable_records_total") == expected,
        timeout=10,
        what=what,
    )


def test_kernel_log_history_is_not_new(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A log file read from its start: records stamped before the reader opened are
    history, records appended later with a later stamp are new; unreadable ones counted."""
    _, source = simulated(at=120.0)
    gpus = {g.index: g.identity for g in source.gpus()}
    bus = {index: normalize_pci(identity.pci_bus_id) for index, identity in gpus.items()}
    old = an_hour_ago()
    log = tmp_path / "kmsg"
    log.write_text(
        record(1, old, f"NVRM: Xid (PCI:{bus[2]}): 48, pid=77, DBE")
        + record(2, old, f"NVRM: Xid (PCI:{bus[2]}): 48, pid=78, DBE")
        + record(3, old, f"NVRM: GPU {bus[3]}.0: GPU has fallen off the bus.")
        + record(4, old, "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 48")
        + f"NVRM: Xid (PCI:{bus[2]}): 95, no record header\n"
        + f"3,5,,-;NVRM: Xid (PCI:{bus[2]}): 95, no timestamp\n"
        + f"3,6,{round(old * 1e6)},-;NVRM: Xid (PCI:{bus[2]}): notanumber\n"
        + " SUBSYSTEM=pci\n"
    )
    collector = XidCollector(
        source=source,
        kernel_log=KmsgReader(path=log),
        ledger=XidLedger(window=5.0),
        nvml_events=False,
    )
    try:
        with caplog.at_level(logging.WARNING, logger="fleetwatch.collectors.xid"):
            collector.start()
            wait_for_unreadable(
                collector, no_timestamp=2.0, malformed=1.0, what="the log read to its end"
            )
            history = {("2", gpus[2].uuid, "48"): 2.0}
            assert family(collector, "fleetwatch_gpu_xid_history_errors") == history
            assert xids(collector) == {}  # no new Xid: the counter's series does not exist
            assert family(collector, "fleetwatch_gpu_fallen_off_bus_total") == {}
            assert family(collector, "fleetwatch_nvswitch_sxid_errors_total") == {}
            now = time.monotonic()
            with log.open("a") as more:
                more.write(
                    record(7, now, f"NVRM: Xid (PCI:{bus[2]}): 48, pid=79, DBE")
                    + record(8, old, f"NVRM: Xid (PCI:{bus[2]}): 48, late but old")
                    + record(9, now, f"NVRM: GPU {bus[3]}.0: GPU has fallen off the bus.")
                    + record(10, now, "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, x")
                    + record(11, now, "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {}")
                    + "no header again\n"
                )
            wait_for_unreadable(
                collector, no_timestamp=3.0, malformed=1.0, what="the appended records"
            )
        assert xids(collector) == {("2", "48"): 1.0}
        assert family(collector, "fleetwatch_gpu_xid_history_errors") == {
            ("2", gpus[2].uuid, "48"): 3.0
        }
        assert family(collector, "fleetwatch_gpu_fallen_off_bus_total") == {
            ("3", bus[3], gpus[3].uuid): 1.0
        }
        assert family(collector, "fleetwatch_nvswitch_sxid_errors_total") == {
            ("nvswitch0", "fatal", "20034"): 1.0
        }
        logged = [r for r in caplog.records if "unreadable kernel log" in r.getMessage()]
        assert sorted(r.__dict__["reason"] for r in logged) == ["malformed", "no_timestamp"]
    finally:
        collector.close()


def test_lost_gpu_keeps_its_xid_counter_in_simulation() -> None:
    faults = (Xid(at=130, gpu=6, xid=79), GpuLost(at=130, gpu=6))
    fake, source = simulated(at=120.0, faults=faults)
    source.gpus()  # enumerated while GPU 6 was healthy
    clock = fake.node.clock
    kernel_log = SimulatedKernelLog(node=fake.node)
    collector = XidCollector(
        source=source, kernel_log=kernel_log, ledger=XidLedger(window=30.0, clock=kernel_log.now)
    )
    try:
        collector.start()
        object.__setattr__(clock, "at", 140.0)  # time passes: the Xid and the loss happen
        servers.wait_until(lambda: xids(collector) == {("6", "79"): 1.0}, timeout=10, what="Xid 79")
        # Both sources delivered once the kernel line and the NVML event matched each other.
        servers.wait_until(
            lambda: not any(collector.ledger._unmatched.values()), timeout=10, what="the match"
        )
        assert xids(collector) == {("6", "79"): 1.0}
    finally:
        collector.close()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("nvml", {"nvml"}),
        ("kmsg", {"kmsg"}),
        ("nvml,kmsg", {"nvml", "kmsg"}),
        ("kmsg, nvml", {"nvml", "kmsg"}),
    ],
)
def test_source_flag_picks_the_xid_sources(value: str, expected: set[str]) -> None:
    args = build_parser().parse_args(["export", f"--collector.xid.source={value}"])
    assert xid.SPEC.read_settings(args).source == expected


@pytest.mark.parametrize("value", ["", "dmesg", "nvml,", "nvml,syslog"])
def test_source_flag_rejects_unknown_sources(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["export", f"--collector.xid.source={value}"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "--collector.xid.source" in error
    assert "expected nvml, kmsg or nvml,kmsg" in error


def _created(fake: FakeNvml, *flags: str) -> XidCollector:
    """The collector as `fleetwatch export` builds it from `flags` on the simulated node."""
    args = build_parser().parse_args(["export", *flags])
    context = CollectorContext(
        sysfs_root=Path("/nonexistent"),
        nvml=fake,
        open_kernel_log=lambda _path: SimulatedKernelLog(node=fake.node),
    )
    collector = xid.SPEC.create(context, xid.SPEC.read_settings(args))
    assert isinstance(collector, XidCollector)
    return collector


def test_nvml_source_says_the_kernel_log_is_not_read(caplog: pytest.LogCaptureFixture) -> None:
    fake, _ = simulated(at=120.0)
    with caplog.at_level(logging.INFO, logger="fleetwatch.collectors.xid"):
        collector = _created(fake)
    try:
        assert any("NVML events only" in r.getMessage() for r in caplog.records)
        assert xids(collector) == {}  # the first run opens the event set
        fake.inject_xid(1, 48)
        assert xids(collector) == {("1", "48"): 1.0}  # the next run takes the queued event
        assert xids(collector) == {("1", "48"): 1.0}  # taken once
        # NVML alone: no listener thread; the takes run on a lane woken only by a run
        assert collector._threads == []
        assert collector._take_lane is not None
        assert collector._take_lane._thread.name == "lane-xid-nvml"
    finally:
        collector.close()
    assert [events.freed for events in fake.event_sets] == [True]


def _blocked_event_waits(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event]:
    """Make the fake's event waits block, as in a wedged driver, until `release` is set;
    `blocked` is set once a wait blocks."""
    blocked, release = threading.Event(), threading.Event()
    real_wait = fake.nvmlEventSetWait_v2

    def wait(events: FakeEventSet, timeout: int) -> FakeEventData:
        blocked.set()
        release.wait(30)
        return real_wait(events, timeout)

    monkeypatch.setattr(fake, "nvmlEventSetWait_v2", wait)
    return blocked, release


def test_a_take_blocked_in_nvml_holds_only_its_lane(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, source = simulated(at=120.0)
    collector = _created(fake)
    uuid = source.gpus()[3].identity.uuid
    try:
        fake.inject_xid(3, 48)
        assert xids(collector) == {("3", "48"): 1.0}
        assert set(family(collector, LISTENING).values()) == {1.0}
        blocked, release = _blocked_event_waits(fake, monkeypatch)
        fake.inject_xid(3, 48)
        with caplog.at_level(logging.WARNING, logger="fleetwatch.collectors.xid"):
            assert xids(collector) == {("3", "48"): 1.0}  # waited its second, then served
            assert blocked.is_set()
            for _ in range(3):  # the lane is busy: no take starts, the counts are served
                assert xids(collector) == {("3", "48"): 1.0}
            listening = family(collector, LISTENING)  # every GPU's events wait behind it
        assert listening == {(str(gpu), source.gpus()[gpu].identity.uuid): 0.0 for gpu in range(8)}
        blocked_logs = [r for r in caplog.records if "blocked in NVML" in r.getMessage()]
        assert len(blocked_logs) == 1
        release.set()
        servers.wait_until(
            lambda: collector.ledger.counts() == {("3", uuid, "48"): 2},
            timeout=10,
            what="the blocked take's event",
        )
        assert xids(collector) == {("3", "48"): 2.0}
        assert set(family(collector, LISTENING).values()) == {1.0}
    finally:
        release.set()
        collector.close()


def test_failed_nvml_calls_are_served_as_counts_and_listening_goes_to_zero() -> None:
    fake, source = simulated(at=120.0)
    collector = _created(fake)
    uuid = source.gpus()[6].identity.uuid
    fake.fail("nvmlDeviceRegisterEvents", error=pynvml.NVMLError_Unknown, gpu=6)
    try:
        assert family(collector, NVML_ERRORS) == {  # labels in name order
            ("nvmlDeviceRegisterEvents", "Unknown", "6", uuid): 1.0
        }
        listening = family(collector, LISTENING)
        assert listening[("6", uuid)] == 0.0
        assert sum(listening.values()) == 7.0
        fake.clear_failures()
        fake.fail("nvmlEventSetWait_v2", error=pynvml.NVMLError_Timeout)  # none queued: no error
        assert family(collector, LISTENING)[("6", uuid)] == 1.0  # registered at this run
        fake.fail("nvmlEventSetWait_v2", error=pynvml.NVMLError_InsufficientResources)
        text = Renderer().render(collector.collect()).decode()
        assert (
            'fleetwatch_gpu_xid_nvml_errors_total{call="nvmlEventSetWait_v2",'
            'error="InsufficientResources",gpu="",uuid=""} 1.0'
        ) in text
        assert 'fleetwatch_gpu_xid_events_listening{gpu="6",uuid="' + uuid + '"} 0.0' in text
        fake.clear_failures()
        assert set(family(collector, LISTENING).values()) == {1.0}
        assert len(family(collector, NVML_ERRORS)) == 2  # counters stay
    finally:
        collector.close()


def test_the_kernel_log_alone_serves_no_nvml_event_families() -> None:
    fake, _ = simulated(at=120.0)
    collector = _created(fake, "--collector.xid.source=kmsg")
    try:
        names = {f.sample_name for f in collector.collect()}
        assert not names & {LISTENING, NVML_ERRORS}
    finally:
        collector.close()


def _state(taker: NvmlXids) -> tuple[dict[str, bool], dict[tuple[str, str, str], int]]:
    """Listening by GPU, and failures by (gpu, call, error), as the taker last published."""
    state = taker.state
    listening = {gpu: on for (gpu, _), on in state.listening}
    return listening, {(gpu, call, error): n for (gpu, _, call, error), n in state.failures}


def test_nvml_xids_try_again_at_the_next_take_count_failures_and_close_frees_the_set(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, source = simulated(at=120.0)
    ledger = XidLedger(window=10.0)
    taker = NvmlXids(source, ledger)
    fake.fail("nvmlEventSetCreate", error=pynvml.NVMLError_Unknown)
    with caplog.at_level(logging.WARNING, logger="fleetwatch.collectors.xid"):
        taker.take()
        taker.take()  # the same failure again: counted, not logged again
    assert [r.getMessage() for r in caplog.records] == [
        "an NVML call for Xid events failed: the Xids it concerns are not counted from NVML "
        "until it answers (tried again at each run)"
    ]
    no_set = {str(gpu): False for gpu in range(8)}  # none listens while there is no set
    assert _state(taker) == (no_set, {("", "nvmlEventSetCreate", "Unknown"): 2})
    fake.clear_failures()
    fake.fail("nvmlDeviceRegisterEvents", error=pynvml.NVMLError_Timeout, gpu=5)
    taker.take()  # the set is made; GPU 5 is not registered
    assert len(fake.event_sets) == 1
    listening, failures = _state(taker)
    assert listening == {str(gpu): gpu != 5 for gpu in range(8)}
    assert failures[("5", "nvmlDeviceRegisterEvents", "Timeout")] == 1
    fake.clear_failures()
    fake.inject_xid(2, 79)
    fake.fail("nvmlEventSetWait_v2", error=pynvml.NVMLError_Unknown)
    taker.take()  # GPU 5 registered now; the take fails: the event stays queued, the set kept
    listening, failures = _state(taker)
    assert listening == {str(gpu): False for gpu in range(8)}
    assert failures[("", "nvmlEventSetWait_v2", "Unknown")] == 1
    assert ledger.counts() == {}
    fake.clear_failures()
    taker.take()
    assert ledger.counts() == {("2", source.gpus()[2].identity.uuid, "79"): 1}
    assert _state(taker)[0] == {str(gpu): True for gpu in range(8)}
    assert fake.event_sets[0].gpus == set(range(8))
    assert len(fake.event_sets) == 1
    taker.close(timeout=1.0)
    assert fake.event_sets[0].freed
    fake.inject_xid(2, 79)
    taker.take()  # closed: nothing taken, no set opened again
    assert len(fake.event_sets) == 1
    assert sum(ledger.counts().values()) == 1


def test_a_gpu_identified_after_the_set_was_made_is_registered_at_the_next_take() -> None:
    fake, source = simulated(at=120.0)
    fake.fail("nvmlDeviceGetUUID", error=pynvml.NVMLError_Unknown, gpu=7)
    ledger = XidLedger(window=10.0)
    taker = NvmlXids(source, ledger)
    taker.take()  # NVML identifies 7 GPUs: the set is made for them
    assert _state(taker)[0] == {str(gpu): True for gpu in range(7)}
    assert fake.event_sets[0].gpus == set(range(7))
    fake.clear_failures()
    fake.inject_xid(7, 48)
    taker.take()  # GPU 7 identified now: registered on the same set, its Xid taken
    assert _state(taker)[0] == {str(gpu): True for gpu in range(8)}
    assert fake.event_sets[0].gpus == set(range(8))
    assert len(fake.event_sets) == 1
    assert ledger.counts() == {("7", source.gpus()[7].identity.uuid, "48"): 1}
    taker.close(timeout=1.0)


def test_a_gpu_without_xid_events_is_left_out_and_not_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, source = simulated(at=120.0)
    asked: list[int] = []
    supported = fake.nvmlDeviceGetSupportedEventTypes

    def events_of(handle: Any) -> int:
        asked.append(handle.index)
        return 0 if handle.index == 4 else supported(handle)

    monkeypatch.setattr(fake, "nvmlDeviceGetSupportedEventTypes", events_of)
    taker = NvmlXids(source, XidLedger(window=10.0))
    taker.take()
    taker.take()
    assert sorted(asked) == list(range(8))
    assert _state(taker) == ({str(gpu): True for gpu in range(8) if gpu != 4}, {})
    taker.close(timeout=1.0)


def test_a_set_under_a_blocked_take_is_not_freed(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, source = simulated(at=120.0)
    taker = NvmlXids(source, XidLedger(window=10.0))
    taker.take()
    blocked, release = _blocked_event_waits(fake, monkeypatch)
    thread = threading.Thread(target=taker.take)
    thread.start()
    try:
        assert blocked.wait(10)
        with caplog.at_level(logging.WARNING, logger="fleetwatch.collectors.xid"):
            taker.close(timeout=0.05)
        assert not fake.event_sets[0].freed
        assert "NVML Xid event set left open" in caplog.text
    finally:
        release.set()
        thread.join(10)


def test_kmsg_source_alone_registers_no_nvml_events() -> None:
    faults = (  # one before the exporter started, one after
        Xid(at=100, gpu=4, xid=119),
        Xid(at=130, gpu=4, xid=119),
    )
    fake, _ = simulated(at=120.0, faults=faults)
    collector = _created(fake, "--collector.xid.source=kmsg")
    try:
        collector.start()
        servers.wait_until(
            lambda: len(family(collector, "fleetwatch_gpu_xid_history_errors")) == 1,
            timeout=10,
            what="the history Xid",
        )
        assert xids(collector) == {}
        object.__setattr__(fake.node.clock, "at", 140.0)
        servers.wait_until(lambda: xids(collector) == {("4", "119"): 1.0}, timeout=10, what="Xid")
        history = family(collector, "fleetwatch_gpu_xid_history_errors")
        assert [(labels[0], labels[2], n) for labels, n in history.items()] == [("4", "119", 1.0)]
        assert [t.name for t in collector._threads] == ["xid-kmsg"]
        assert fake.event_sets == []
    finally:
        collector.close()


def test_both_sources_count_the_history_apart_and_new_events_once() -> None:
    faults = (Xid(at=100, gpu=4, xid=119), Xid(at=130, gpu=4, xid=48))
    fake, _ = simulated(at=120.0, faults=faults)
    collector = _created(fake, "--collector.xid.source=nvml,kmsg")
    try:
        collector.start()
        servers.wait_until(
            lambda: len(family(collector, "fleetwatch_gpu_xid_history_errors")) == 1,
            timeout=10,
            what="the history Xid",
        )
        servers.wait_until(lambda: len(fake.event_sets) == 1, timeout=10, what="event set")
        assert xids(collector) == {}
        object.__setattr__(fake.node.clock, "at", 140.0)  # Xid 48 reaches both sources
        servers.wait_until(lambda: xids(collector) == {("4", "48"): 1.0}, timeout=10, what="Xid")
        servers.wait_until(
            lambda: not any(collector.ledger._unmatched.values()), timeout=10, what="the match"
        )
        assert xids(collector) == {("4", "48"): 1.0}
        assert [t.name for t in collector._threads] == ["xid-kmsg"]  # NVML's: on the lane
        assert collector._take_lane is not None
    finally:
        collector.close()


def exposed(url: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of `name` on the exporter's /metrics, by sorted label items."""
    text = servers.http_get(url + "/metrics").decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_kernel_log_rollout_end_to_end(tmp_path: Path) -> None:
    """`fleetwatch export` started on a kernel log holding an hour-old critical Xid exports
    it as history, not as a new Xid; an Xid logged after start is counted as new."""
    pci = normalize_pci(simulated_pci_bus_id(0))
    log = tmp_path / "kmsg"
    log.write_text(record(1, an_hour_ago(), f"NVRM: Xid (PCI:{pci}): 48, pid=1, DBE"))
    args = [
        "--collector.xid.source=kmsg",
        f"--collector.xid.kmsg-path={log}",
        "--collector.xid.interval=1s",  # each wait below is for the next run: not 5 s each
    ]
    with servers.fleetwatch_export(tmp_path, simulate="dgx-h100", args=args) as exporter:
        history = "fleetwatch_gpu_xid_history_errors"
        servers.wait_until(
            lambda: exposed(exporter.url, history) or None, timeout=30, what="the history family"
        )
        ((labels, count),) = exposed(exporter.url, history).items()
        assert (dict(labels)["gpu"], dict(labels)["xid"], count) == ("0", "48", 1.0)
        assert exposed(exporter.url, XID) == {}  # GPUXidCritical has no series to fire on
        with log.open("a") as more:
            more.write(record(2, time.monotonic(), f"NVRM: Xid (PCI:{pci}): 48, pid=2, DBE"))
        servers.wait_until(
            lambda: (
                [(dict(k)["gpu"], dict(k)["xid"], v) for k, v in exposed(exporter.url, XID).items()]
                == [("0", "48", 1.0)]
            ),
            timeout=30,
            what="the new Xid",
        )
        assert list(exposed(exporter.url, history).values()) == [1.0]


def test_kernel_log_recovery_actions_nvlink5_decode_and_driver_texts(tmp_path: Path) -> None:
    """New records as /dev/kmsg builds them: Xid 154's recovery action, NVLink5 Xids by the
    decode table, and the driver's own fallen-off-the-bus report, attributed by PCI address."""
    _fake, source = simulated(at=120.0)
    gpus = {g.index: g.identity for g in source.gpus()}
    bus = {index: normalize_pci(identity.pci_bus_id) for index, identity in gpus.items()}
    log = tmp_path / "kmsg"
    log.touch()
    collector = XidCollector(
        source=source,
        kernel_log=KmsgReader(path=log),
        ledger=XidLedger(window=5.0),
        nvml_events=False,
    )
    now = round(time.monotonic() * 1e6)
    regs = "0x00000042 0x00000002 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000"
    messages = [
        f"NVRM: Xid (PCI:{bus[1]}): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
        "(GPU Reset Required)",
        f"NVRM: Xid (PCI:{bus[1]}): 154, GPU recovery action changed from 0x1 (GPU Reset "
        "Required) to 0x9 (Something New)",
        f"NVRM: Xid (PCI:{bus[2]}): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 07 ({regs})",
        f"NVRM: Xid (PCI:{bus[2]}): 145, RLW_RXPIPE Fatal XC1 i0 Link 07 ({regs})",
        f"NVRM: Xid (PCI:{bus[2]}): 149, NETIR_FUTURE Fatal XC0 i0 Link 01 ({regs})",
        f"NVRM: Xid (PCI:{bus[2]}): 150, unreadable tail",
        f"NVRM: The NVIDIA GPU {bus[3][5:]}.0\nNVRM: installed in this system has\n"
        "NVRM: fallen off the bus and is not responding to commands.\n",
    ]
    log.write_text(
        "".join(
            kmsg_record(n, now, m, dictionary=" SUBSYSTEM=pci\n") for n, m in enumerate(messages)
        )
    )
    try:
        collector.start()
        expected_nvlink = {  # labels in name order: action, gpu, unit, uuid, xid
            ("none", "2", "RLW_RXPIPE", gpus[2].uuid, "145"): 1.0,
            ("reset_gpu", "2", "RLW_RXPIPE", gpus[2].uuid, "145"): 1.0,  # promoted when Fatal
            ("reset_gpu", "2", "other", gpus[2].uuid, "149"): 1.0,  # no row: catalog action
            ("reset_gpu", "2", "other", gpus[2].uuid, "150"): 1.0,  # fields do not parse
        }
        servers.wait_until(
            lambda: family(collector, xid.NVLINK5) == expected_nvlink,
            timeout=10,
            what="NVLink5 Xids by decoded action",
        )
        assert family(collector, xid.RECOVERY) == {
            ("gpu_reset", "1", gpus[1].uuid): 1.0,
            ("unknown", "1", gpus[1].uuid): 1.0,
        }
        assert family(collector, xid.FALLEN_OFF_BUS) == {("3", bus[3], gpus[3].uuid): 1.0}
        assert xids(collector) == {
            ("1", "154"): 2.0,
            ("2", "145"): 2.0,
            ("2", "149"): 1.0,
            ("2", "150"): 1.0,
        }
        assert family(collector, xid.UNREADABLE) == {
            ("no_timestamp",): 0.0,
            ("malformed",): 0.0,
            ("binary",): 0.0,
            ("user_space",): 0.0,
        }
    finally:
        collector.close()
