"""InfiniBand input, fuzzed: sysfs port state and rate strings and counter files (the
ConnectX-7 tree of tests/infiniband/fixtures.py), `perfquery` and `ibstat` output and the
error lines infiniband-diags print (the formats the tool tests hold). Garbage is None or a
problem, an absent header is `IbToolError`; no counter is negative, no rate NaN or infinite."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Final

from hypothesis import given
from hypothesis import strategies as st

from fleetwatch.collectors.sources.ibtools import (
    IbstatCa,
    IbToolError,
    PerfqueryCounters,
    parse_ibstat,
    parse_perfquery,
    tool_reason,
)
from fleetwatch.collectors.sources.sysfs import (
    IbReading,
    InfinibandSysfs,
    parse_rate_gbps,
    parse_state,
)
from tests.fuzz.harness import (
    FUZZ,
    FUZZ_COSTLY,
    bounded_label,
    exercise,
    finite_counts,
    finite_number,
    named,
    peak_bytes,
)
from tests.fuzz.mutations import MIB, mutated_text
from tests.infiniband.fixtures import CX7_COUNTERS, CX7_HW_COUNTERS, add_device, ib_port

STATES: Final = ("4: ACTIVE", "1: DOWN", "7: Phy Test", "5: LinkUp", "3: Disabled", "N/A")
RATES: Final = ("400 Gb/sec (4X NDR)", "200 Gb/sec (2X NDR)", "2.5 Gb/sec (1X SDR)", "N/A")
# infiniband-diags' formats, as tests/infiniband/test_ibtools.py holds them.
PERFQUERY: Final = (
    "# Port extended counters: Lid 2 port 1 (CapMask: 0x5300 CapMask2: 0x0000002)\n"
    "PortSelect:......................1\nCounterSelect:...................0x0000\n"
    "PortXmitData:....................1000\nPortRcvData:.....................2000\n"
    "SymbolErrorCounter:..............70000\nLinkDownedCounter:...............300\n"
    "PortXmitWait:....................5000000000\n",
    "# Port extended counters: Lid 2 port 1 (CapMask: 0x5A00)\n"
    "PortSelect:......................1\nPortXmitData:....................1000\n"
    "SymbolErrorCounter:..............0\n",
    "# Port counters: Lid 2 port 1 (CapMask: 0x5A00)\nPortSelect:......................1\n"
    "SymbolErrorCounter:..............65535\nPortRcvRemPhysErrors:............4\n"
    "PortXmitWait:....................4294967295\n",
    "ibwarn: [1234] mad_rpc_open_port: can't open UMAD port ((null):0)\n"
    "ibpanic: [1234] main: can't open UMAD port ((null):0)\n",
)
IBSTAT: Final = (
    "CA 'mlx5_0'\n\tCA type: MT4129\n\tNumber of ports: 1\n\tFirmware version: 28.39.1002\n"
    "\tHardware version: 0\n\tNode GUID: 0xa088c20300b10000\n"
    "\tSystem image GUID: 0xa088c20300b10000\n\tPort 1:\n\t\tState: Active\n"
    "\t\tPhysical state: LinkUp\n\t\tRate: 400\n\t\tBase lid: 17\n\t\tLMC: 0\n\t\tSM lid: 1\n"
    "\t\tCapability mask: 0xa751e848\n\t\tPort GUID: 0xa088c20300b10001\n"
    "\t\tLink layer: InfiniBand\n\t\tEffective speed: 400\n"
    "CA 'mlx5_1'\n\tCA type: MT4129\n\tNumber of ports: 1\n\tPort 1:\n\t\tState:   Down\n"
    "\t\tPhysical state: Disabled\n\t\tRate: 10\n\t\tBase lid: 65535\n"
    "CA 'mlx5_10'\n\tCA type: MT4129\n\tNumber of ports: 1\n\tPort 1:\n\t\tState: Active\n"
    "\t\tPhysical state: LinkUp\n\t\tRate: 200\nCA 'mlx5_2'\n",
    "ibwarn: [77] umad_get_ca: can't open mlx5_3\nibpanic: [77] main: stat of CA failed\n",
)


def state_holds(found: tuple[int, str] | None) -> None:
    if found is not None:
        finite_counts((found[0],))
        bounded_label(found[1], 8 * MIB)  # at most the mutated line (4 growths of 1 MiB)


@FUZZ
@given(mutated_text(STATES))
def test_sysfs_port_state(text: str) -> None:
    line = text.split("\n", 1)[0].strip()  # what the reader hands over: the first line
    exercise("InfiniBand sysfs state", parse_state, line, holds=state_holds)


@FUZZ
@given(mutated_text(RATES))
def test_sysfs_rate(text: str) -> None:
    line = text.split("\n", 1)[0].strip()
    exercise(
        "InfiniBand sysfs rate",
        parse_rate_gbps,
        line,
        holds=finite_number,
        malformed=lambda rate: rate is None,
    )


def reading_holds(reading: IbReading) -> None:
    """Every counter None (unreadable) or a non-negative integer; every port state sane."""
    finite_counts(value for value in reading.values if value is not None)
    for port in reading.ports:
        if port is None:
            continue
        finite_number(port.rate_gbps)
        finite_counts(n for n in (port.state_id, port.phys_state_id) if n is not None)
    for problem in reading.problems:
        named(problem.reason)


COUNTER_FILES: Final = {**CX7_COUNTERS, **{f"hw:{k}": v for k, v in CX7_HW_COUNTERS.items()}}
_FILE_TEXT: Final = mutated_text((*COUNTER_FILES.values(), "N/A (no PMA)", "0x1f"), huge=65536)


@FUZZ_COSTLY
@given(
    st.fixed_dictionaries(dict.fromkeys(COUNTER_FILES, _FILE_TEXT)),
    st.tuples(mutated_text(STATES), mutated_text(STATES), mutated_text(RATES)),
)
def test_sysfs_counter_tree(files: dict[str, str], port: tuple[str, str, str]) -> None:
    """A ConnectX-7 port whose every counter file and state file holds mutated text."""
    counters = {k: v for k, v in files.items() if not k.startswith("hw:")}
    hw = {k[3:]: v for k, v in files.items() if k.startswith("hw:")}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        state, phys_state, rate = (text.replace("/", "_") for text in port)
        tree = ib_port(
            state=state, phys_state=phys_state, rate=rate, counters=counters, hw_counters=hw
        )
        add_device(root, "mlx5_0", ports={1: tree})
        sysfs = InfinibandSysfs(root=root)
        try:
            sysfs.discover()
            exercise(
                "InfiniBand sysfs counters",
                lambda _: sysfs.read(),
                None,
                malformed=lambda reading: bool(reading.problems),
                holds=reading_holds,
            )
        finally:
            sysfs.close()


def perfquery_holds(found: PerfqueryCounters) -> None:
    finite_counts(found.values.values())
    finite_counts(found.error_counters().values())
    finite_counts((found.cap_mask, *(() if found.cap_mask2 is None else (found.cap_mask2,))))


@FUZZ
@given(mutated_text(PERFQUERY))
def test_perfquery(text: str) -> None:
    exercise(
        "perfquery output", parse_perfquery, text, errors=(IbToolError,), holds=perfquery_holds
    )


def ibstat_holds(cas: list[IbstatCa]) -> None:
    for ca in cas:
        bounded_label(ca.name, 8 * MIB)
        finite_counts(n for n in (ca.number_of_ports,) if n is not None)
        for port in ca.ports:
            finite_counts((port.port,))
            finite_number(port.rate_gbps)
            finite_counts(n for n in (port.base_lid, port.sm_lid) if n is not None)


@FUZZ
@given(mutated_text(IBSTAT))
def test_ibstat(text: str) -> None:
    exercise(
        "ibstat output",
        parse_ibstat,
        text,
        malformed=lambda cas: not all(ca.complete for ca in cas),
        holds=ibstat_holds,
    )


TOOL_ERRORS: Final = (
    PERFQUERY[3],
    IBSTAT[1],
    "ibwarn: [3309] mad_rpc: _do_madrpc failed; dport (Lid 17)\n"
    "iberror: [pid 3309] perfquery: failed: perfquery: PORT_COUNTERS query failed\n",
    "iberror: ibdiag: stat of IB device 'mlx5_9' failed: No such file or directory\n",
)


def reason_holds(reason: str | None) -> None:
    if reason is not None:
        named(reason)


@FUZZ
@given(mutated_text(TOOL_ERRORS))
def test_infiniband_diags_errors(text: str) -> None:
    """What a failing infiniband-diags tool prints (`ibwarn`, `iberror`, `ibpanic` lines):
    the reason a collector logs and counts."""
    exercise(
        "infiniband-diags error output",
        tool_reason,
        text,
        malformed=lambda reason: reason is not None,
        holds=reason_holds,
    )


def test_perfquery_negative_counter_is_not_read() -> None:
    """Found by the fuzzer: `int(text, 0)` reads "-1", which no counter can hold."""
    found = parse_perfquery(PERFQUERY[1].replace("..1\n", "..-1\n", 1))
    assert "PortSelect" not in found.values
    assert found.values["PortXmitData"] == 1000


def test_sysfs_numbers_too_long_to_be_a_state_or_rate() -> None:
    """Found by the fuzzer: a 5000-digit state id made int() raise, and a 400-digit rate
    read as an infinite one."""
    assert parse_state("4" * 5000 + ": ACTIVE") is None
    assert parse_rate_gbps("4" * 400 + " Gb/sec (4X NDR)") is None
    assert parse_state("4: ACTIVE") == (4, "ACTIVE")
    assert parse_rate_gbps("2.5 Gb/sec (1X SDR)") == 2.5


def test_a_state_with_a_long_run_of_blanks_is_read_in_linear_time() -> None:
    """Found by the fuzzer: the state pattern's lazy name before trailing blanks backtracked
    quadratically on a line with a long run of blanks in it (a 1 MiB line took hours)."""
    line = "4: ACTIVE" + " " * MIB + "x"
    found: list[object] = []
    peak_bytes(lambda: found.append(parse_state(line)))
    assert found == [(4, "ACTIVE" + " " * MIB + "x")]
    assert parse_state(" 7: Phy Test ") == (7, "Phy Test")


def test_perfquery_padding_dots_are_read_in_linear_time() -> None:
    """A value that could start with a padding dot made a line of a million dots quadratic."""
    text = PERFQUERY[1] + "PortRcvData:" + "." * MIB + "x y\n"
    assert "PortRcvData" not in parse_perfquery(text).values
    assert parse_perfquery(PERFQUERY[0]).values["PortXmitWait"] == 5000000000


def test_ibstat_numbers_no_port_holds_are_not_read() -> None:
    """Found by `./dev.sh fuzz --examples 600`: a port number of 5000 digits raised, a rate
    of -1 or inf and a lid of -1 were read."""
    text = IBSTAT[0].replace("Rate: 400", "Rate: inf", 1).replace("Base lid: 17", "Base lid: -1")
    text += "CA 'mlx5_9'\n\tPort " + "9" * 5000 + ":\n"
    port = parse_ibstat(text)[0].ports[0]
    assert (port.rate_gbps, port.base_lid) == (None, None)


def test_a_tools_error_lines_are_named_by_an_excerpt() -> None:
    """Found by the fuzzer (`named`): every `ibwarn`/`iberror`/`ibpanic` line a tool printed
    went into the reason, however many and however long (an 8 KiB line was logged whole)."""
    reason = tool_reason("ibwarn: [1] " + "x" * MIB + "\n" + "ibpanic: [1] main: failed\n" * 1000)
    assert reason is not None
    named(reason)
    assert reason.startswith("ibpanic: [1] main: failed | ")
