"""Xid counters from injected NVML events and kernel-log lines, de-duplicated."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from fleetwatch.collectors import xid
from fleetwatch.collectors.base import CollectorContext
from fleetwatch.collectors.sources.kmsg import KmsgReader, normalize_pci, parse_xid
from fleetwatch.collectors.xid import XidCollector, XidLedger
from fleetwatch.sim import servers
from fleetwatch.sim.fake_nvml import FakeNvml, SimulatedKernelLog
from fleetwatch.sim.scenario import Fault

from fleetwatch.cli import build_parser
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
            "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off",
            ("0000:18:00", 79, None),
        ),
        (
            "4,1207,5312345678,-;NVRM: Xid (PCI:0000:ab:00): 48, pid=1234, DBE",
            ("0000:ab:00", 48, 1207),
        ),
        ("[ 12.3] NVRM: Xid (PCI:0000:DB:00.0): 119, pid=1, Timeout", ("0000:db:00", 119, None)),
        ("NVRM: Xid (PCI:0000:18:00): 13", ("0000:18:00", 13, None)),
    ],
)
def test_parse_xid_lines(line: str, expected: tuple[str, int, int | None]) -> None:
    found = parse_xid(line)
    assert found is not None
    assert (found.pci_bus_id, found.xid, found.sequence) == expected


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:18:00): , pid=1",
        "NVRM: Xid (PCI:zz:18:00): 79, pid=1",
        "NVRM: Xid (PCI:0000:18:00): 0, pid=1",
        "NVRM: GPU at PCI:0000:18:00: GPU-1234",
        "6,99,1,-;usb 1-1: new device",
        " SUBSYSTEM=pci",
        "",
    ],
)
def test_malformed_lines_give_nothing(line: str) -> None:
    assert parse_xid(line) is None


def test_normalize_pci() -> None:
    assert normalize_pci("00000000:18:00.0") == normalize_pci("0000:18:00") == "0000:18:00"


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


def test_injected_nvml_events_and_kernel_log_lines(tmp_path: Path) -> None:
    fake, source = simulated(at=120.0)
    bus = {g.index: normalize_pci(g.identity.pci_bus_id) for g in source.gpus()}
    log = tmp_path / "kmsg"
    log.write_text(
        f"6,1,1000000,-;NVRM: Xid (PCI:{bus[2]}): 31, pid=77, MMU fault\n"
        "6,2,1000001,-;garbage without an xid\n"
        "NVRM: Xid (PCI:0000:18:00): notanumber\n"
        f"6,1,1000000,-;NVRM: Xid (PCI:{bus[2]}): 31, pid=77, MMU fault\n"  # record read twice
    )
    collector = XidCollector(
        source=source, kernel_log=KmsgReader(path=log), ledger=XidLedger(window=5.0)
    )
    try:
        collector.start()
        fake.inject_xid(5, 74)
        fake.inject_xid(5, 74)
        expected = {("2", "31"): 1.0, ("5", "74"): 2.0}
        servers.wait_until(lambda: xids(collector) == expected, timeout=10, what="Xid counters")
        with log.open("a") as more:
            more.write(f"6,3,{int(time.monotonic() * 1e6)},-;NVRM: Xid (PCI:{bus[5]}): 74, pid=1\n")
        fake.inject_xid(5, 74)  # the NVML report of the same event as the new kernel line
        servers.wait_until(
            lambda: collector.ledger.counts().get(("5", source.gpus()[5].identity.uuid, "74")) == 3,
            timeout=10,
            what="third Xid 74",
        )
        assert xids(collector) == {("2", "31"): 1.0, ("5", "74"): 3.0}
    finally:
        collector.close()


def test_lost_gpu_keeps_its_xid_counter_in_simulation() -> None:
    faults = (Fault(at=130, kind="xid", gpu=6, xid=79), Fault(at=130, kind="gpu_lost", gpu=6))
    fake, source = simulated(at=120.0, faults=faults)
    source.gpus()  # enumerated while GPU 6 was healthy
    clock = fake.node.clock
    collector = XidCollector(
        source=source, kernel_log=SimulatedKernelLog(node=fake.node), ledger=XidLedger(window=10.0)
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
        collector.start()
        fake.inject_xid(1, 48)
        servers.wait_until(lambda: xids(collector) == {("1", "48"): 1.0}, timeout=10, what="Xid")
        assert [t.name for t in collector._threads] == ["xid-nvml"]
    finally:
        collector.close()


def test_kmsg_source_alone_registers_no_nvml_events() -> None:
    faults = (Fault(at=100, kind="xid", gpu=4, xid=119),)  # before the exporter started
    fake, _ = simulated(at=120.0, faults=faults)
    collector = _created(fake, "--collector.xid.source=kmsg")
    try:
        collector.start()
        servers.wait_until(lambda: xids(collector) == {("4", "119"): 1.0}, timeout=10, what="Xid")
        assert [t.name for t in collector._threads] == ["xid-kmsg"]
        assert fake.event_sets == []
    finally:
        collector.close()


def test_both_sources_count_the_history_and_new_events_once() -> None:
    faults = (Fault(at=100, kind="xid", gpu=4, xid=119),)
    fake, _ = simulated(at=120.0, faults=faults)
    collector = _created(fake, "--collector.xid.source=nvml,kmsg")
    try:
        collector.start()
        servers.wait_until(lambda: xids(collector) == {("4", "119"): 1.0}, timeout=10, what="Xid")
        servers.wait_until(lambda: len(fake.event_sets) == 1, timeout=10, what="event set")
        assert sorted(t.name for t in collector._threads) == ["xid-kmsg", "xid-nvml"]
    finally:
        collector.close()
