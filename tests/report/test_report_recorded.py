"""The report reads the recording rules' series where the store holds them, raw series else.

One simulated history (sim/fleet.py) goes into a real Prometheus (backfilled with promtool).
The report runs on it as it is (no recorded series: the raw expressions), then promtool
evaluates, against that Prometheus, the recording rules whose series a report query can
read (`Query.recorded`, as the generator writes them) over the same window and writes them
as blocks (`promtool tsdb create-blocks-from rules`), and a second Prometheus, with the
rules loaded, serves the raw and the recorded history: the report must read the recorded
series there, say so, and find the same. A window that starts before the recorded series
do, and recorded series of only part of the fleet (one node's deleted), fall back to the
raw expression.
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest

from fleetwatch.cli import main
from fleetwatch.report.dataset import RAW
from fleetwatch.rules.config import PACKAGE, RECORDING_FILE
from fleetwatch.rules.definitions import TENSOR_ACTIVE_RECORD
from fleetwatch.sim.fleet import FleetSpec, Injected, node_name
from testbed.servers import backfill_fleet, history_prometheus, promtool, report_recording_rules

pytestmark = pytest.mark.integration

SPEC = FleetSpec(nodes=6, gpus_per_node=8, ib_ports_per_node=8, hours=4)


@dataclass
class Outputs:
    plan: Injected
    raw: Path
    recorded: Path
    early: Path
    partial: Path


def report(url: str, out: Path, *, hours: int = int(SPEC.hours)) -> Path:
    status = main(
        [
            "report",
            f"--prometheus.url={url}",
            f"--since={hours}h",
            f"--until={SPEC.end}",
            "--step=60s",
            f"--out={out / 'report'}",
            f"--snapshot.save={out / 'snapshot'}",
            "--log.format=text",
        ]
    )
    assert status == 0
    return out


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outputs]:
    root = tmp_path_factory.mktemp("recorded")
    plan = backfill_fleet(SPEC, root)
    with history_prometheus(root, name="raw") as raw:
        raw_out = report(raw.url, root / "raw-out")
        result = promtool(
            "tsdb",
            "create-blocks-from",
            "rules",
            f"--url={raw.url}",
            f"--start={SPEC.start}",
            f"--end={SPEC.end}",
            f"--eval-interval={SPEC.step_seconds}s",
            f"--output-dir={root / 'recorded-blocks'}",
            str(report_recording_rules(root / "report-rules.yaml")),
        )
        assert result.returncode == 0, result.stderr
    for block in (root / "recorded-blocks").iterdir():
        shutil.move(block, root / "data" / block.name)
    shipped = Path(str(resources.files(PACKAGE) / RECORDING_FILE.name))
    with history_prometheus(
        root, name="with-rules", rule_files=[shipped], extra_args=["--web.enable-admin-api"]
    ) as recorded:
        recorded_out = report(recorded.url, root / "recorded-out")
        early = report(recorded.url, root / "early-out", hours=int(SPEC.hours) + 1)
        # The recorded series of one node gone: the rules ran on only part of the fleet.
        one_node = urllib.parse.quote(f'{TENSOR_ACTIVE_RECORD}{{node="{node_name(SPEC, 0)}"}}')
        request = urllib.request.Request(
            f"{recorded.url}/api/v1/admin/tsdb/delete_series?match[]={one_node}", method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 204
        yield Outputs(
            plan=plan,
            raw=raw_out,
            recorded=recorded_out,
            early=early,
            partial=report(recorded.url, root / "partial-out"),
        )


def sources(out: Path) -> dict[str, str]:
    return dict(json.loads((out / "snapshot" / "manifest.json").read_text())["sources"])


def table(out: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(out / "report" / "tables" / f"{name}.csv", dtype=str, keep_default_na=False)


def test_without_recorded_series_the_raw_expression_is_read(outputs: Outputs) -> None:
    assert sources(outputs.raw) == {"tensor_active": RAW}


def test_with_recorded_series_over_the_window_they_are_read(outputs: Outputs) -> None:
    assert sources(outputs.recorded) == {"tensor_active": TENSOR_ACTIVE_RECORD}


def test_a_window_the_recorded_series_do_not_cover_falls_back(outputs: Outputs) -> None:
    # The window starts an hour before the history (and its recorded series) do.
    assert sources(outputs.early) == {"tensor_active": RAW}


def test_recorded_series_of_part_of_the_fleet_fall_back(outputs: Outputs) -> None:
    assert sources(outputs.partial) == {"tensor_active": RAW}


def actions(out: Path) -> set[tuple[str, str]]:
    frame = table(out, "actions")
    return set(zip(frame["action"], frame["target"], strict=True))


def test_recorded_and_raw_find_the_same(outputs: Outputs) -> None:
    raw, recorded = actions(outputs.raw), actions(outputs.recorded)
    assert len(raw) == 11
    # The recorded series are evaluated at the rule's own times, up to a sample off the
    # scrapes at each bucket's edges (the means differ by under 0.01, below): a GPU that
    # is by design exactly as busy as its job (node 2's hot GPU, thermally throttled, so a
    # straggler if at or above the job's median) may tip either way. Nothing else differs.
    hot = outputs.plan.hot_gpu
    assert recorded - raw <= {("investigate", f"{hot[0]} GPU {hot[1]}")}
    assert raw <= recorded


def test_recorded_activity_is_the_raw_activity(outputs: Outputs) -> None:
    keys = ["node", "gpu", "uuid", "timestamp"]
    raw = pd.read_parquet(outputs.raw / "snapshot" / "tensor_active.parquet")
    recorded = pd.read_parquet(outputs.recorded / "snapshot" / "tensor_active.parquet")
    both = raw.merge(recorded, on=keys, how="left", suffixes=("_raw", "_recorded"))
    assert len(both) == len(raw) > 0
    assert (both["value_recorded"] - both["value_raw"]).abs().max() < 0.01
