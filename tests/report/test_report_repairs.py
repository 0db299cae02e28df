"""The report's Remediation section shows the tainter's repairs, read from a real Prometheus:
repairs by kind and result, the most in flight, the repairs that did not hold, and the time
from taken out to back in service per reason. Two hours of the tainter's own series
(`fleetwatch_tainter_repair*`, as `--repair.mode=on` exports them) are backfilled with promtool;
the report must find exactly what they hold, and every panel of the stack health dashboard's
Repair row (which reads the same families) must have data on the same Prometheus."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from dashboards.write_dashboards import panel_queries
from fleetwatch.catalog.tainter import (
    TAINTER_REPAIR_BACK_IN_SERVICE_SECONDS,
    TAINTER_REPAIRS_IN_FLIGHT,
    TAINTER_REPAIRS_NOT_HELD_TOTAL,
    TAINTER_REPAIRS_TOTAL,
    TAINTER_TAINT_OPERATIONS_TOTAL,
)
from fleetwatch.cli import main
from testbed.tool_servers import backfill, history_prometheus, prom_query

pytestmark = pytest.mark.integration

END = 1_800_000_000
STEP = 60
HOURS = 2
LABELS = 'job="fleetwatch-tainter",instance="10.0.0.7:8443"'
# What the tainter did in the window: three reboots asked, two back, a GPU reset failed;
# one reboot did not hold; two back in service after 15 min each for xid-critical, one
# after an hour for gpu-lost; up to two repairs in flight at once.
COUNTERS = {
    (TAINTER_REPAIRS_TOTAL.name, 'repair="reboot",result="started"'): 3,
    (TAINTER_REPAIRS_TOTAL.name, 'repair="reboot",result="returned"'): 2,
    (TAINTER_REPAIRS_TOTAL.name, 'repair="gpu-reset",result="failed"'): 1,
    (TAINTER_REPAIRS_NOT_HELD_TOTAL.name, 'reason="xid-critical",repair="reboot"'): 1,
}
BACK = {"xid-critical": (2, 1800.0), "gpu-lost": (1, 3600.0)}
BUCKET = 1800  # the one finite bucket written: each xid-critical repair in it, gpu-lost's not
STACK_HEALTH = (
    Path(__file__).parents[2] / "helm" / "fleetwatch" / "dashboards" / "stack-health.json"
)


def openmetrics() -> str:
    """The tainter's repair series over the window, each counter growing linearly from 0."""
    stamps = list(range(END - HOURS * 3600, END + 1, STEP))
    last = len(stamps) - 1
    lines: list[str] = []
    families: dict[str, list[tuple[str, int]]] = {}
    for (name, labels), total in COUNTERS.items():
        families.setdefault(name, []).append((labels, total))
    for name, series in families.items():
        family = name.removesuffix("_total")
        lines.append(f"# TYPE {family} counter")
        for labels, total in series:
            lines += [
                f"{name}{{{LABELS},{labels}}} {total * i // last} {t}" for i, t in enumerate(stamps)
            ]
    lines.append(f"# TYPE {TAINTER_REPAIRS_IN_FLIGHT.name} gauge")
    lines += [
        f"{TAINTER_REPAIRS_IN_FLIGHT.name}{{{LABELS}}} {2 if last // 3 <= i < last // 2 else 0} {t}"
        for i, t in enumerate(stamps)
    ]
    histogram = TAINTER_REPAIR_BACK_IN_SERVICE_SECONDS.name
    lines.append(f"# TYPE {histogram} histogram")
    for reason, (count, seconds) in BACK.items():
        for i, t in enumerate(stamps):
            n = count * i // last
            labels = f'{LABELS},reason="{reason}"'
            below = n if seconds / count <= BUCKET else 0
            lines += [
                f'{histogram}_bucket{{{labels},le="{BUCKET}.0"}} {below} {t}',
                f'{histogram}_bucket{{{labels},le="+Inf"}} {n} {t}',
                f"{histogram}_count{{{labels}}} {n} {t}",
                f"{histogram}_sum{{{labels}}} {seconds * n / count} {t}",
            ]
    # The taint operations the section read before repairs: unchanged by them.
    ops = TAINTER_TAINT_OPERATIONS_TOTAL.name
    lines.append(f"# TYPE {ops.removesuffix('_total')} counter")
    lines += [
        f'{ops}{{{LABELS},op="add",result="ok"}} {4 * i // last} {t}' for i, t in enumerate(stamps)
    ]
    return "\n".join([*lines, "# EOF", ""])


def report(url: str, out: Path) -> Path:
    status = main(
        [
            "report",
            f"--prometheus.url={url}",
            f"--since={HOURS}h",
            f"--until={END}",
            f"--step={STEP}s",
            f"--out={out}",
            "--log.format=text",
        ]
    )
    assert status == 0
    return out / "tables"


def table(tables: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(tables / f"{name}.csv", keep_default_na=False)


@dataclass(frozen=True)
class Served:
    """The report's tables, and the repair-row panels' answers at the window's end."""

    tables: Path
    panels: dict[str, list[dict[str, object]]]


def repair_row(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(title, expr) of the panels under the dashboard's "Repair" row."""
    titles: list[str] = []
    inside = False
    for panel in board["panels"]:
        if panel["type"] == "row":
            inside = panel["title"] == "Repair"
        elif inside:
            titles.append(panel["title"])
    return [(t, e) for t, e in panel_queries(board) if t in titles]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("repairs")
    (root / "tainter.om").write_text(openmetrics())
    backfill(root / "tainter.om", root / "data")
    board = json.loads(STACK_HEALTH.read_text())
    with history_prometheus(root) as prom:
        panels = {
            f"{title} #{i}": prom_query(prom, expr.replace("$__rate_interval", "5m"), time_s=END)
            for i, (title, expr) in enumerate(repair_row(board))
        }
        yield Served(tables=report(prom.url, root / "out"), panels=panels)


@pytest.fixture(scope="module")
def tables(served: Served) -> Path:
    return served.tables


def test_every_repair_panel_of_the_stack_dashboard_has_data(served: Served) -> None:
    assert len(served.panels) == 5, sorted(served.panels)
    empty = [name for name, answer in served.panels.items() if not answer]
    assert empty == []


def test_repairs_by_kind_and_result_and_in_flight(tables: Path) -> None:
    summary = dict(table(tables, "tainter_summary")[["what", "value"]].itertuples(index=False))
    assert summary["repair reboot (started)"] == 3
    assert summary["repair reboot (returned)"] == 2
    assert summary["repair gpu-reset (failed)"] == 1
    assert summary["max repairs in flight"] == 2
    assert summary["taint add (ok)"] == 4


def test_repairs_that_did_not_hold(tables: Path) -> None:
    rows = table(tables, "repairs_not_held").to_dict("records")
    assert rows == [{"reason": "xid-critical", "repair": "reboot", "repairs": 1}]


def test_time_back_in_service_per_reason(tables: Path) -> None:
    back = table(tables, "repair_back_in_service").set_index("reason")
    assert back.loc["xid-critical", "repairs"] == 2
    assert back.loc["xid-critical", "mean_minutes"] == pytest.approx(15.0)
    assert back.loc["gpu-lost", "repairs"] == 1
    assert back.loc["gpu-lost", "mean_minutes"] == pytest.approx(60.0)
