"""Fixture sysfs trees → golden expositions, and the per-file tolerance they exercise."""

from __future__ import annotations

import errno
import logging
import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from fleetwatch.cli import build_parser
from fleetwatch.collectors import COLLECTORS
from fleetwatch.collectors.infiniband import InfinibandCollector, InfinibandSettings
from fleetwatch.exporter.render import Renderer
from fleetwatch.exporter.settings import ExportSettings
from tests.golden import assert_golden
from tests.infiniband.fixtures import (
    CX7_COUNTERS,
    FIXTURES,
    FailingFiles,
    cx7_ndr,
    make_collector,
)


def exposition(tmp_path: Path, name: str, expected: str | None = None) -> str:
    files = FIXTURES[name](tmp_path)
    collector = make_collector(tmp_path, files=files, expected=expected)
    try:
        return Renderer().render(collector.collect()).decode()
    finally:
        collector.close()


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_tree_matches_golden(tmp_path: Path, name: str) -> None:
    assert_golden(f"infiniband/{name}.prom", exposition(tmp_path, name))


def test_data_counters_are_words_times_four(tmp_path: Path) -> None:
    text = exposition(tmp_path, "cx7_ndr")
    words = int(CX7_COUNTERS["port_xmit_data"])
    assert (
        f'fleetwatch_infiniband_port_data_bytes_total{{device="mlx5_0",direction="tx",port="1"}} '
        f"{float(words * 4):.1f}" in text.replace("1e+12", "1000000000000.0")
    )
    assert (
        'fleetwatch_infiniband_port_rate_bytes_per_second{device="mlx5_0",port="1"} 5e+10' in text
    )


def test_saturated_counters_are_flagged(tmp_path: Path) -> None:
    text = exposition(tmp_path, "saturated")
    for counter in ("link_downed", "excessive_buffer_overrun", "xmit_discards", "xmit_wait"):
        assert (
            'fleetwatch_infiniband_port_error_saturated{device="mlx5_3",'
            f'error="{counter}",port="1"}} 1.0' in text
        )
    assert (
        'fleetwatch_infiniband_port_error_saturated{device="mlx5_3",error="symbol",'
        'port="1"} 0.0' in text
    )


def test_einval_skips_only_that_value(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        text = exposition(tmp_path, "einval")
    assert 'error="vl15_dropped",port="1"' not in text
    assert 'fleetwatch_infiniband_port_xmit_wait_total{device="mlx5_4",port="1"}' not in text
    assert 'error="vl15_dropped",port="2"' in text
    assert 'fleetwatch_infiniband_port_rate_bytes_per_second{device="mlx5_4",port="1"}' in text
    assert 'fleetwatch_infiniband_port_rate_bytes_per_second{device="mlx5_4",port="2"}' not in text
    # EINVAL/ENOSYS are "not available here"; EIO is a fault a person should see.
    reasons = [getattr(r, "reason", "") for r in caplog.records]
    assert any("EIO" in reason for reason in reasons), reasons
    assert not any("EINVAL" in reason or "ENOSYS" in reason for reason in reasons)


def test_garbage_is_skipped_with_a_logged_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        text = exposition(tmp_path, "garbage")
    assert 'error="symbol"' not in text
    assert 'error="rcv"' not in text
    assert 'error="link_downed",port="1"} 2.0' in text
    assert "fleetwatch_infiniband_port_physical_state_id" not in text
    assert "fleetwatch_infiniband_port_up" not in text
    paths = {getattr(r, "path", "") for r in caplog.records}
    assert any(p.endswith("counters/symbol_error") for p in paths), paths
    assert any(p.endswith("ports/1/phys_state") for p in paths), paths


def test_down_port_has_no_rate(tmp_path: Path) -> None:
    text = exposition(tmp_path, "no_counters")
    assert 'fleetwatch_infiniband_port_up{device="irdma0",port="1"} 0.0' in text
    assert 'rate_bytes_per_second{device="irdma0"' not in text
    assert (
        'fleetwatch_infiniband_port_hw_stat_total{device="hfi1_0",port="",stat="RcvOvflCnt"} 3.0'
        in text
    )


def test_expected_rate_flag(tmp_path: Path) -> None:
    text = exposition(tmp_path, "cx7_ndr", expected="mlx5_9=100,mlx5_*=400")
    assert (
        'fleetwatch_infiniband_port_expected_rate_bytes_per_second{device="mlx5_0",port="1"} 5e+10'
        in text
    )


def test_no_infiniband_means_no_series(tmp_path: Path) -> None:
    collector = make_collector(tmp_path)
    assert collector.collect() == []


def test_files_failing_after_discovery_lose_only_their_values(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Faults that start mid-run go through the file-by-file path, not the fast pass."""
    cx7_ndr(tmp_path)
    files = FailingFiles()
    collector = make_collector(tmp_path, files=files)
    before = Renderer().render(collector.collect()).decode()
    counters = tmp_path / "class/infiniband/mlx5_0/ports/1/counters"
    files.on_read["counters/VL15_dropped"] = errno.EINVAL
    files.on_read["counters/port_rcv_packets"] = errno.EIO
    (counters / "symbol_error").write_text("garbage\n")
    with caplog.at_level(logging.WARNING):
        during = Renderer().render(collector.collect()).decode()
    gone = {
        'fleetwatch_infiniband_port_errors_total{device="mlx5_0",error="vl15_dropped",port="1"}',
        'fleetwatch_infiniband_port_error_saturated{device="mlx5_0",error="vl15_dropped",port="1"}',
        'fleetwatch_infiniband_port_packets_total{device="mlx5_0",direction="rx",port="1"}',
        'fleetwatch_infiniband_port_errors_total{device="mlx5_0",error="symbol",port="1"}',
        'fleetwatch_infiniband_port_error_saturated{device="mlx5_0",error="symbol",port="1"}',
    }

    def series(text: str) -> set[str]:
        return {line.rpartition(" ")[0] for line in text.splitlines() if line[:1] != "#"}

    assert series(before) - series(during) == gone
    # Two values were skipped for a reason worth a look (EIO, garbage); EINVAL is not one.
    problems = "fleetwatch_infiniband_sysfs_read_errors_total"
    assert series(during) - series(before) == {problems}
    assert f"\n{problems} 2.0\n" in during
    reasons = {getattr(r, "path", ""): getattr(r, "reason", "") for r in caplog.records}
    assert "EIO" in reasons[str(counters / "port_rcv_packets")]
    assert "garbage" in reasons[str(counters / "symbol_error")]
    assert str(counters / "VL15_dropped") not in reasons  # "not available" is not news
    # The faults clear: every value is back on the next cycle, without a re-discovery.
    files.on_read.clear()
    (counters / "symbol_error").write_text("3\n")
    after = Renderer().render(collector.collect()).decode()
    assert series(after) == series(before) | {problems}  # a counter: it stays
    assert f"\n{problems} 2.0\n" in after
    collector.close()


def test_changes_show_after_cycles_where_nothing_moved(tmp_path: Path) -> None:
    """Families rebuilt only from changed inputs still show every change, once."""
    cx7_ndr(tmp_path)
    collector = make_collector(tmp_path)
    first = Renderer().render(collector.collect()).decode()
    assert Renderer().render(collector.collect()).decode() == first
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    (port / "counters/symbol_error").write_text("9\n")
    (port / "hw_counters/out_of_sequence").write_text("13\n")
    (port / "state").write_text("1: DOWN\n")
    changed = Renderer().render(collector.collect()).decode()
    ids = 'device="mlx5_0",port="1"'
    for line in (
        'fleetwatch_infiniband_port_errors_total{device="mlx5_0",error="symbol",port="1"} 9.0',
        f'fleetwatch_infiniband_port_hw_stat_total{{{ids},stat="out_of_sequence"}} 13.0',
        f"fleetwatch_infiniband_port_state_id{{{ids}}} 1.0",
        f"fleetwatch_infiniband_port_up{{{ids}}} 0.0",
        f"fleetwatch_infiniband_port_state_changes_total{{{ids}}} 1.0",
    ):
        assert line in changed, line
    assert "fleetwatch_infiniband_port_rate_bytes_per_second" not in changed
    # Nothing moved again: the same exposition, the transition counted once.
    assert Renderer().render(collector.collect()).decode() == changed
    collector.close()


def test_hw_counters_are_read_at_most_every_interval(tmp_path: Path) -> None:
    """Port counters every collection; hw_counters once per interval, and again at once
    after a re-discovery (new descriptors)."""
    cx7_ndr(tmp_path)
    now = [1000.0]
    collector = make_collector(tmp_path, monotonic=lambda: now[0], hw_stats_seconds=30.0)
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    ids = 'device="mlx5_0",port="1"'
    hw_line = f'fleetwatch_infiniband_port_hw_stat_total{{{ids},stat="out_of_sequence"}} '
    symbol_line = (
        'fleetwatch_infiniband_port_errors_total{device="mlx5_0",error="symbol",port="1"} '
    )
    first = Renderer().render(collector.collect()).decode()
    assert hw_line in first
    (port / "counters/symbol_error").write_text("9\n")
    (port / "hw_counters/out_of_sequence").write_text("13\n")
    now[0] += 29.0
    early = Renderer().render(collector.collect()).decode()
    assert symbol_line + "9.0" in early
    assert hw_line + "13.0" not in early
    assert [line for line in early.splitlines() if line.startswith(hw_line)] == [
        line for line in first.splitlines() if line.startswith(hw_line)
    ]
    now[0] += 1.0
    assert hw_line + "13.0" in Renderer().render(collector.collect()).decode()
    (port / "hw_counters/out_of_sequence").write_text("14\n")
    now[0] += 61.0  # past the re-discovery interval: everything is read again
    assert hw_line + "14.0" in Renderer().render(collector.collect()).decode()
    collector.close()


def test_a_bad_hw_counter_is_counted_once_a_read(tmp_path: Path) -> None:
    """A hw_counters file holding garbage is skipped and counted when it is read, once per
    interval, not again by each collection in between (they keep the last values read);
    the port counters beside it are read every collection."""
    cx7_ndr(tmp_path)
    now = [1000.0]
    collector = make_collector(tmp_path, monotonic=lambda: now[0], hw_stats_seconds=30.0)
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    (port / "hw_counters/out_of_sequence").write_text("garbage\n")
    ids = 'device="mlx5_0",port="1"'
    read_errors = "fleetwatch_infiniband_sysfs_read_errors_total "
    hw_lines = f"fleetwatch_infiniband_port_hw_stat_total{{{ids},"
    symbol = 'fleetwatch_infiniband_port_errors_total{device="mlx5_0",error="symbol",port="1"} '

    def lines() -> list[str]:
        return Renderer().render(collector.collect()).decode().splitlines()

    first = lines()
    assert read_errors + "1.0" in first
    assert not [line for line in first if 'stat="out_of_sequence"' in line]
    kept = [line for line in first if line.startswith(hw_lines)]
    assert kept  # the other hw_counters of the port
    for symbols in range(1, 6):  # five collections inside the interval
        (port / "counters/symbol_error").write_text(f"{symbols}\n")
        now[0] += 5.0
        text = lines()
        assert read_errors + "1.0" in text
        assert [line for line in text if line.startswith(hw_lines)] == kept
        assert f"{symbol}{symbols}.0" in text
    now[0] += 5.0  # the interval is over: read, and skipped, again
    assert read_errors + "2.0" in lines()
    collector.close()


def test_hw_stats_interval_is_a_bounded_flag() -> None:
    assert InfinibandSettings().hw_stats_interval == 30.0
    parser = build_parser()
    args = parser.parse_args(["export", "--collector.infiniband.hw-stats.interval=2m"])
    assert ExportSettings.from_args(args, COLLECTORS).collectors["infiniband"] == replace(
        InfinibandSettings(), hw_stats_interval=120.0
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["export", "--collector.infiniband.hw-stats.interval=0s"])


def _collect_within(collector: InfinibandCollector, seconds: float) -> str:
    """One collection on a worker thread; fails the test instead of hanging with it."""
    result: list[str] = []
    worker = threading.Thread(
        target=lambda: result.append(Renderer().render(collector.collect()).decode()),
        daemon=True,
    )
    worker.start()
    worker.join(timeout=seconds)
    assert not worker.is_alive(), f"collect() still blocked after {seconds}s"
    return result[0]


def test_fifo_in_place_of_a_counter_file_is_a_per_file_problem(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A FIFO opened for reading blocks until a writer comes: it must be refused, not read."""
    reference, fifos = tmp_path / "reference", tmp_path / "fifos"
    cx7_ndr(reference)
    cx7_ndr(fifos)
    port = fifos / "class/infiniband/mlx5_0/ports/1"
    replaced = [
        port / "counters" / "symbol_error",
        port / "hw_counters" / "out_of_sequence",
        port / "link_layer",
        fifos / "devices/pci0000:00/0000:00:01.0/0000:19:00.0/numa_node",
    ]
    for path in replaced:
        path.unlink()
        os.mkfifo(path)
    expected = _collect_within(make_collector(reference), 30.0)
    collector = make_collector(fifos)
    with caplog.at_level(logging.WARNING):
        first = _collect_within(collector, 30.0)
        second = _collect_within(collector, 30.0)

    def values(text: str) -> dict[str, str]:
        return dict(line.rsplit(" ", 1) for line in text.splitlines() if line and line[:1] != "#")

    ours, theirs = values(second), values(expected)
    lost = {name for name in theirs if name not in ours}
    assert lost == {
        'fleetwatch_infiniband_port_errors_total{device="mlx5_0",error="symbol",port="1"}',
        'fleetwatch_infiniband_port_error_saturated{device="mlx5_0",error="symbol",port="1"}',
        'fleetwatch_infiniband_port_hw_stat_total{device="mlx5_0",port="1",stat="out_of_sequence"}',
    } | {name for name in theirs if name.startswith("fleetwatch_infiniband_port_info{")}
    # Every other counter is still served, with the same value.
    shared = {name: value for name, value in theirs.items() if name in ours}
    assert len(shared) > 20
    assert all(ours[name] == value for name, value in shared.items())
    # The info series is still there, without what the FIFOs held (link layer, NUMA node).
    info = next(name for name in ours if name.startswith("fleetwatch_infiniband_port_info{"))
    assert 'link_layer=""' in info
    assert 'numa_node=""' in info
    # Counted once per discovery, where the files are opened (the PCI topology file is
    # read quietly: an unreadable one only leaves its label empty).
    assert ours["fleetwatch_infiniband_sysfs_read_errors_total"] == "3.0"
    assert values(first)["fleetwatch_infiniband_sysfs_read_errors_total"] == "3.0"
    # Logged once per file, naming the file and why.
    logged = [
        (getattr(r, "path", ""), getattr(r, "reason", ""))
        for r in caplog.records
        if r.getMessage() == "skipped an InfiniBand sysfs value"
    ]
    assert sorted(logged) == sorted(
        (str(path), "not a regular file: a FIFO") for path in replaced[:3]
    )
    collector.close()
