"""perfquery/ibstat parsers on the real formats, and the wrappers on real and fake tools."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from fleetwatch.collectors.sources.ibtools import (
    IbToolError,
    IbTools,
    parse_ibstat,
    parse_perfquery,
)
from fleetwatch.exporter.render import Renderer
from tests.infiniband.fixtures import add_device, ib_port, make_collector

PERFQUERY_X = """\
# Port extended counters: Lid 2 port 1 (CapMask: 0x5300 CapMask2: 0x0000002)
PortSelect:......................1
CounterSelect:...................0x0000
PortXmitData:....................1000
PortRcvData:.....................2000
SymbolErrorCounter:..............70000
LinkDownedCounter:...............300
PortXmitWait:....................5000000000
"""
PERFQUERY_X_LEGACY = """\
# Port extended counters: Lid 2 port 1 (CapMask: 0x5A00)
PortSelect:......................1
PortXmitData:....................1000
SymbolErrorCounter:..............0
"""
PERFQUERY_PLAIN = """\
# Port counters: Lid 2 port 1 (CapMask: 0x5A00)
PortSelect:......................1
SymbolErrorCounter:..............65535
PortRcvRemPhysErrors:............4
PortXmitWait:....................4294967295
"""
IBSTAT = """\
CA 'mlx5_0'
\tCA type: MT4129
\tNumber of ports: 1
\tFirmware version: 28.39.1002
\tHardware version: 0
\tNode GUID: 0xa088c20300b10000
\tSystem image GUID: 0xa088c20300b10000
\tPort 1:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tRate: 400
\t\tBase lid: 17
\t\tLMC: 0
\t\tSM lid: 1
\t\tCapability mask: 0xa751e848
\t\tPort GUID: 0xa088c20300b10001
\t\tLink layer: InfiniBand
\t\tEffective speed: 400
CA 'mlx5_1'
\tCA type: MT4129
\tNumber of ports: 1
\tFirmware version: 28.39.1002
\tHardware version: 0
\tNode GUID: 0xa088c20300b10100
\tSystem image GUID: 0xa088c20300b10100
\tPort 1:
\t\tState:   Down
\t\tPhysical state: Disabled
\t\tRate: 10
\t\tBase lid: 65535
\t\tLMC: 0
\t\tSM lid: 0
\t\tCapability mask: 0xa751e848
\t\tPort GUID: 0xa088c20300b10101
\t\tLink layer: InfiniBand
CA 'mlx5_10'
\tCA type: MT4129
\tNumber of ports: 1
\tFirmware version: 28.39.1002
\tHardware version: 0
\tNode GUID: 0xa088c20300b10a00
\tSystem image GUID: 0xa088c20300b10a00
\tPort 1:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tRate: 200
CA 'mlx5_2'
"""


def test_perfquery_extended_with_capmask2_gives_64bit_errors() -> None:
    parsed = parse_perfquery(PERFQUERY_X)
    assert parsed.extended
    assert parsed.has_64bit_errors
    assert parsed.error_counters() == {
        "symbol": 70000,
        "link_downed": 300,
        "xmit_wait": 5000000000,
    }


def test_perfquery_legacy_without_capmask2_is_not_trusted() -> None:
    parsed = parse_perfquery(PERFQUERY_X_LEGACY)
    assert parsed.extended
    assert parsed.cap_mask2 is None
    assert parsed.error_counters() == {}


def test_perfquery_plain_counters_and_short_names() -> None:
    parsed = parse_perfquery(PERFQUERY_PLAIN)
    assert not parsed.extended
    assert parsed.values["PortRcvRemPhysErrors"] == 4
    assert parsed.error_counters() == {}


def test_perfquery_without_header_is_an_error() -> None:
    with pytest.raises(IbToolError, match="no counters header"):
        parse_perfquery("ibwarn: something\n")


def test_ibstat_string_sorted_and_truncated() -> None:
    cas = parse_ibstat(IBSTAT + "ibpanic: [123] main: stat of IB device 'mlx5_2' failed\n")
    assert [ca.name for ca in cas] == ["mlx5_0", "mlx5_1", "mlx5_10", "mlx5_2"]
    assert [ca.complete for ca in cas] == [True, True, False, False]
    first, down = cas[0].ports[0], cas[1].ports[0]
    assert (first.state, first.rate_gbps, first.base_lid, first.link_layer) == (
        "Active",
        400.0,
        17,
        "InfiniBand",
    )
    # A down port prints a rate that means nothing: it is not reported.
    assert (down.state, down.rate_gbps) == ("Down", None)


def _listing() -> dict[str, tuple[int, ...]]:
    return {"mlx5_0": (1,)}


def test_real_debian_tools_fail_with_a_reason(tmp_path: Path) -> None:
    """This machine has infiniband-diags but no HCA: the real failure path."""
    if shutil.which("perfquery") is None:
        pytest.skip("infiniband-diags is not installed")
    tools = IbTools.find(
        search_path=None, timeout_seconds=10, listing=_listing, sysfs_root=str(tmp_path)
    )
    assert tools is not None
    with pytest.raises(IbToolError, match=r"perfquery exited with 255: .*iberror"):
        tools.perfquery_extended("mlx5_0", 1)
    # With no HCA, Debian's ibstat lists nothing and exits 0; a named CA fails with ibpanic.
    assert tools.ibstat() == ([], None)
    with pytest.raises(IbToolError, match=r"ibstat exited with 255: ibpanic"):
        tools.run(shutil.which("ibstat"), "mlx5_0")


def test_arguments_are_checked_against_the_sysfs_listing(tmp_path: Path) -> None:
    tools = IbTools(
        perfquery="/bin/false",
        ibstat=None,
        timeout_seconds=1,
        listing=_listing,
        env=os.environ,
    )
    with pytest.raises(IbToolError, match="not in the sysfs listing"):
        tools.perfquery_extended("-x; rm -rf /", 1)
    with pytest.raises(IbToolError, match="port 2 of mlx5_0"):
        tools.perfquery_extended("mlx5_0", 2)


def test_timeout_is_reported(tmp_path: Path) -> None:
    slow = tmp_path / "perfquery"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(slow.stat().st_mode | stat.S_IEXEC)
    tools = IbTools.find(
        search_path=str(tmp_path), timeout_seconds=0.3, listing=_listing, sysfs_root="/"
    )
    assert tools is not None
    with pytest.raises(IbToolError, match="timed out"):
        tools.perfquery_extended("mlx5_0", 1)


def test_real_tools_failing_leave_sysfs_values(tmp_path: Path) -> None:
    """A saturated port makes the collector ask the real perfquery, which fails here."""
    if shutil.which("perfquery") is None:
        pytest.skip("infiniband-diags is not installed")
    add_device(tmp_path, "mlx5_0", ports={1: ib_port(counters={"symbol_error": "65535"})})
    collector = make_collector(tmp_path, tool_path=os.environ.get("PATH", ""))
    text = Renderer().render(collector.collect()).decode()
    assert (
        'fleetwatch_infiniband_port_errors_total{device="mlx5_0",error="symbol",port="1"}' in text
    )
    assert 'error_saturated{device="mlx5_0",error="symbol",port="1"} 1.0' in text
