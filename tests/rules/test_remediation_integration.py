"""Every clear condition of the remediation contract, against a real Prometheus.

A clear condition lifts a taint, so it must read "clear" only on positive evidence: the
node's exporter up, its collector up and the condition gone, at every sample of the
hold-down; never while the condition holds, never while the exporter is down, its
collector fails, or the series vanish, and never before the hold-down has passed.

One Prometheus serves the module, holding a backfilled history (`promtool tsdb
create-blocks-from openmetrics`) in which each reason has one node per case. The queries
are the contract's own, with `$node` filled in as the tainter fills it, asked at chosen
times; the last ones go through the tainter's own `PrometheusEvidence` at the present.
InfiniBandPortDown does not taint by default, so its clear condition is taken from the
contract of a config that opts it in, the way an operator would.

Backfilled blocks hold no staleness markers (Prometheus writes them when a target or a
series disappears from a scrape), so here a vanished series is asked about once it is
older than the query lookback (5m), where Prometheus no longer returns it either way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from fleetwatch.durations import parse_duration
from fleetwatch.promclient import PrometheusAccess, PrometheusClientSettings
from fleetwatch.rules.config import Config, load_config
from fleetwatch.rules.contract import CLEAR, NODE_PLACEHOLDER
from fleetwatch.rules.definitions import CHECKPOINT_READ_ONLY_REMOUNT_RECORD
from fleetwatch.rules.groups import remediation_contract
from fleetwatch.sim.loopback_servers import Server
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.sources import PrometheusEvidence, promql_string
from testbed.tool_servers import backfill, history_prometheus, prom_query

pytestmark = pytest.mark.integration

STEP = 10
"""Seconds between backfilled samples (a scrape every 10s)."""
SPAN = 1800
"""Seconds of history; case times are seconds after its start."""
FIX = 900
"""When each case's condition goes away, or its series change."""
GONE_FOR = 360
"""How long after vanishing a series is asked about: past the 5m query lookback."""
JOB = 'job="fleetwatch"'


@dataclass(frozen=True)
class Series:
    """One condition series of a reason: its metric and labels, healthy and bad values."""

    metric: str
    labels: str
    healthy: float
    bad: float


CONDITIONS: dict[str, tuple[str, list[Series]]] = {
    "gpu-overheat": (
        "gpu",
        [
            Series("fleetwatch_gpu_temperature_celsius", f'sensor="gpu", gpu="{g}"', 60, 84)
            for g in range(2)
        ],
    ),
    "nvlink-down": (
        "nvlink",
        [Series("fleetwatch_nvlink_up", f'gpu="0", link="{link}"', 1, 0) for link in range(2)],
    ),
    "gpu-fabric": (
        "gpu",
        [
            *(Series("fleetwatch_gpu_fabric_degraded", f'gpu="{g}"', 0, 1) for g in range(2)),
            *(Series("fleetwatch_gpu_fabric_state_id", f'gpu="{g}"', 3, 2) for g in range(2)),
        ],
    ),
    "infiniband-port-down": (
        "infiniband",
        [
            Series("fleetwatch_infiniband_port_up", f'device="mlx5_{d}", port="1"', 1, 0)
            for d in range(2)
        ],
    ),
    "checkpoint-mount-hung": (
        "storage",
        [Series("fleetwatch_storage_hung", f'mountpoint="/ckpt{m}"', 0, 1) for m in range(2)],
    ),
    # The remount record (1: read-only now, writable within presence_history) is the rules'
    # own, tested by promtool (rules/tests/storage.test.yaml); here it is backfilled.
    "checkpoint-mount-read-only": (
        "storage",
        [
            Series(CHECKPOINT_READ_ONLY_REMOUNT_RECORD, f'mountpoint="/ckpt{m}"', 0, 1)
            for m in range(2)
        ],
    ),
}
"""Per reason: the collector that reads it, and its condition's series."""


def opted_in_config() -> Config:
    """The shipped config with InfiniBandPortDown opted in to its declared taint."""
    config = load_config()
    alerts = dict(config.alerts)
    alerts["InfiniBandPortDown"] = dataclasses.replace(
        alerts["InfiniBandPortDown"], taint="infiniband-port-down"
    )
    return dataclasses.replace(config, alerts=alerts)


CONFIG = opted_in_config()
HOLD_DOWN = parse_duration(str(CONFIG.thresholds["untaint_hold_down"]))
CLEAR_QUERIES = {
    reason: entry[CLEAR] for reason, entry in remediation_contract(CONFIG).items() if CLEAR in entry
}


@dataclass
class Timeline:
    """What a node exports at each moment (seconds after the start): None is absent."""

    up: dict[int, float | None]
    collector: dict[int, float | None]
    condition: list[dict[int, float | None]]


def _timeline(series: list[Series], **case: object) -> Timeline:
    """The node's values for one case (see CASES)."""
    times = range(0, SPAN + 1, STEP)

    def value(t: int, healthy: float | None, bad: float | None) -> float | None:
        return bad if t < FIX and case.get("bad_before_fix") else healthy

    up: dict[int, float | None] = {}
    collector: dict[int, float | None] = {}
    condition: list[dict[int, float | None]] = [{} for _ in series]
    for t in times:
        absent = bool(case.get("absent_from_fix") and t >= FIX) or bool(
            case.get("gap") and FIX - 300 <= t < FIX + 300
        )
        up[t] = None if absent else (0.0 if case.get("up_0_from_fix") and t >= FIX else 1.0)
        collector[t] = (
            None if absent else (0.0 if case.get("collector_0_from_fix") and t >= FIX else 1.0)
        )
        for i, s in enumerate(series):
            if absent or (case.get("condition_gone_from_fix") and t >= FIX):
                condition[i][t] = None
            elif case.get("only_bad") == i:
                condition[i][t] = s.bad
            else:
                condition[i][t] = value(t, s.healthy, s.bad)
    return Timeline(up=up, collector=collector, condition=condition)


CASES: dict[str, dict[str, object]] = {
    "recovered": {"bad_before_fix": True},
    "up-0": {"up_0_from_fix": True},
    "collector-0": {"collector_0_from_fix": True},
    "vanished": {"absent_from_fix": True},
    "condition-vanished": {"condition_gone_from_fix": True},
    "returned": {"gap": True},
}
"""How each case's node behaves; `only-bad-N` cases (one condition series still bad, the
others healthy) are added per reason."""


def _cases(reason: str) -> dict[str, dict[str, object]]:
    series = CONDITIONS[reason][1]
    return {**CASES, **{f"only-bad-{i}": {"only_bad": i} for i in range(len(series))}}


def node_name(reason: str, case: str) -> str:
    return f"{reason}--{case}"


def _lines(metric: str, labels: str, values: Mapping[int, float | None], start: int) -> list[str]:
    """OpenMetrics sample lines (its labels take no space after a comma)."""
    labels = labels.replace(", ", ",")
    return [
        f"{metric}{{{labels}}} {value} {start + t}"
        for t, value in sorted(values.items())
        if value is not None
    ]


def write_history(path: Path, start: int) -> None:
    """Every reason's cases as OpenMetrics, one family after another."""
    families: dict[str, list[str]] = {}
    for reason, (collector, series) in CONDITIONS.items():
        for case, spec in _cases(reason).items():
            node = node_name(reason, case)
            timeline = _timeline(series, **spec)
            base = f'{JOB}, instance="{node}:9835", node="{node}"'
            families.setdefault("up", []).extend(_lines("up", base, timeline.up, start))
            families.setdefault("fleetwatch_collector_up", []).extend(
                _lines(
                    "fleetwatch_collector_up",
                    f'{base}, collector="{collector}"',
                    timeline.collector,
                    start,
                )
            )
            for s, values in zip(series, timeline.condition, strict=True):
                families.setdefault(s.metric, []).extend(
                    _lines(s.metric, f"{base}, {s.labels}", values, start)
                )
    with path.open("w") as out:
        for metric, lines in families.items():
            out.write(f"# TYPE {metric} gauge\n")
            out.write("".join(f"{line}\n" for line in lines))
        out.write("# EOF\n")


@dataclass
class History:
    prom: Server
    start: int


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    root = tmp_path_factory.mktemp("remediation")
    # The history ends now, so the tainter's own query (at the present) reads its end.
    start = int(time.time()) // STEP * STEP - SPAN
    write_history(root / "history.om", start)
    backfill(root / "history.om", root / "data")
    with history_prometheus(root) as prom:
        yield History(prom=prom, start=start)


def clear_at(history: History, reason: str, case: str, at: float) -> bool:
    """Whether the reason's clear condition holds for the case's node at `at` seconds."""
    query = CLEAR_QUERIES[reason].replace(NODE_PLACEHOLDER, promql_string(node_name(reason, case)))
    return bool(prom_query(history.prom, query, time_s=history.start + at))


def test_every_tainting_reason_with_a_clear_condition_is_proven_here() -> None:
    assert set(CLEAR_QUERIES) == set(CONDITIONS)


REASONS = sorted(CONDITIONS)


@pytest.mark.parametrize("reason", REASONS)
def test_clear_once_the_condition_is_gone_for_the_hold_down(history: History, reason: str) -> None:
    assert not clear_at(history, reason, "recovered", FIX - STEP), "the condition still holds"
    assert not clear_at(history, reason, "recovered", FIX + HOLD_DOWN / 2), "within hold-down"
    assert clear_at(history, reason, "recovered", FIX + HOLD_DOWN + 3 * STEP)


@pytest.mark.parametrize("reason", REASONS)
def test_never_clear_while_a_part_of_the_condition_holds(history: History, reason: str) -> None:
    for i in range(len(CONDITIONS[reason][1])):
        assert not clear_at(history, reason, f"only-bad-{i}", FIX + HOLD_DOWN + 3 * STEP), i


@pytest.mark.parametrize("reason", REASONS)
@pytest.mark.parametrize("case", ["up-0", "collector-0"])
def test_never_clear_while_the_exporter_or_its_collector_is_down(
    history: History, reason: str, case: str
) -> None:
    # Healthy before, with the same values after: only `up` or the collector changed.
    assert clear_at(history, reason, case, FIX - STEP)
    assert not clear_at(history, reason, case, FIX + STEP)
    assert not clear_at(history, reason, case, FIX + HOLD_DOWN + 3 * STEP)


@pytest.mark.parametrize("reason", REASONS)
@pytest.mark.parametrize("case", ["vanished", "condition-vanished"])
def test_never_clear_when_the_series_vanish(history: History, reason: str, case: str) -> None:
    assert clear_at(history, reason, case, FIX - STEP)
    assert not clear_at(history, reason, case, FIX + GONE_FOR)


@pytest.mark.parametrize("reason", REASONS)
def test_an_exporter_that_returns_waits_out_the_hold_down(history: History, reason: str) -> None:
    back = FIX + 300
    assert not clear_at(history, reason, "returned", back + HOLD_DOWN / 2)
    assert clear_at(history, reason, "returned", back + HOLD_DOWN + 3 * STEP)


def test_the_tainter_reads_the_same_answers_at_the_present(history: History) -> None:
    async def ask() -> dict[tuple[str, str], bool]:
        async with aiohttp.ClientSession() as session:
            evidence = PrometheusEvidence(
                session=session,
                access=PrometheusAccess(PrometheusClientSettings(url=history.prom.url)),
                queries=CLEAR_QUERIES,
                metrics=TainterMetrics(),
            )
            return {
                (reason, case): (
                    await evidence.condition_clear(node=node_name(reason, case), reason=reason)
                ).clear
                for reason in REASONS
                for case in ("recovered", "vanished", "up-0", "only-bad-0")
            }

    answers = asyncio.run(ask())
    assert {key for key, clear in answers.items() if clear} == {
        (reason, "recovered") for reason in REASONS
    }
