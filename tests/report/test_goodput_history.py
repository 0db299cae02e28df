"""The Goodput section on simulated long runs with known truth, on a real Prometheus and a
real VictoriaMetrics (sim/goodput_history.py): the injected interruptions are found, none
is invented for a checkpoint save, a planned stop or a job's end, causes and nodes are
right, each job's ETTR is within 2 points; and bad input is named while the rest is
computed."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from fleetwatch.cli import main
from fleetwatch.report.dataset import RAW
from fleetwatch.rules.interruptions import (
    JOB_GPUS_RECORD,
    JOB_NODE_GPUS_RECORD,
    JOB_TENSOR_MAX_RECORD,
)
from fleetwatch.sim.goodput_history import (
    GoodputSpec,
    TrueInterruption,
    Truth,
    victoria_lines,
    write_openmetrics,
)
from testbed.tool_servers import history_store

pytestmark = pytest.mark.integration

# Nodes that fail far more often than a real fleet's (one a day each, ~250 times Llama 3's
# rate) and two lemons at one every 3 hours: enough interruptions in 48 hours to check,
# and a fleet whose every node would pass the lemon floor.
SPEC = GoodputSpec(
    jobs=6,
    nodes_per_job=3,
    hours=48,
    gpus_per_node=2,
    node_per_1000_node_days=1000.0,
    lemon_per_1000_node_days=8000.0,
)
ENGINES = ("prometheus", "victoriametrics")
MATCH_SECONDS = 600


FALLBACK_NOTE = "do not cover the window (rules not loaded, or loaded after its start)"


@dataclass
class Found:
    truth: Truth
    out: Path
    status: int
    engine: str

    def table(self, name: str) -> pd.DataFrame:
        return pd.read_csv(self.out / "tables" / f"{name}.csv", keep_default_na=False)

    def sources(self) -> dict[str, str]:
        manifest = json.loads((self.out.parent / "snapshot" / "manifest.json").read_text())
        return {k: v for k, v in manifest["sources"].items() if k.startswith("goodput_")}

    def summary(self) -> str:
        return (self.out / "summary.md").read_text()


def run(spec: GoodputSpec, root: Path, engine: str, *extra: str) -> Found:
    truths: list[Truth] = []

    def openmetrics(path: Path) -> None:
        truths.append(write_openmetrics(spec, path))

    def victoria() -> list[dict[str, object]]:
        items, truth = victoria_lines(spec)
        truths.append(truth)
        return items

    with history_store(engine, root, openmetrics=openmetrics, victoria=victoria) as store:
        status = main(
            [
                "report",
                f"--prometheus.url={store.url}",
                f"--since={spec.hours:g}h",
                f"--until={spec.end}",
                "--step=60s",
                f"--out={root / 'out'}",
                "--log.format=text",
                f"--snapshot.save={root / 'snapshot'}",
                *extra,
            ]
        )
    return Found(truth=truths[0], out=root / "out", status=status, engine=engine)


@pytest.fixture(scope="module", params=ENGINES)
def found(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Found:
    engine: str = request.param
    return run(SPEC, tmp_path_factory.mktemp(engine), engine)


def matched(truth: list[TrueInterruption], rows: pd.DataFrame) -> dict[int, int]:
    """Each injected interruption's row in the table (same job, nearest in time, within
    MATCH_SECONDS), each row used once."""
    used: set[int] = set()
    out = {}
    for k, t in enumerate(truth):
        mine = rows[
            (rows["namespace"] == t.job[0]) & (rows["training_job"].astype(str) == t.job[1])
        ]
        near = [(abs(r.timestamp - t.time), i) for i, r in mine.iterrows() if i not in used]
        near = [n for n in near if n[0] <= MATCH_SECONDS]
        if near:
            used.add(min(near)[1])
            out[k] = min(near)[1]
    return out


def test_the_injected_interruptions_are_found_and_none_invented(found: Found) -> None:
    assert found.status == 0
    rows = found.table("goodput_interruptions")
    truth = found.truth.interruptions
    hits = matched(truth, rows)
    assert len(hits) >= 0.95 * len(truth), f"found {len(hits)} of {len(truth)}"
    invented = rows.drop(index=list(hits.values()))
    assert invented.empty, invented.to_string()


def test_in_place_restarts_are_found(found: Found) -> None:
    rows = found.table("goodput_interruptions")
    truth = found.truth.interruptions
    hits = matched(truth, rows)
    in_place = [k for k, t in enumerate(truth) if t.kind == "in_place"]
    assert in_place
    assert all(k in hits and "in_place" in rows.loc[hits[k], "kinds"] for k in in_place)


def test_causes_and_nodes_are_right(found: Found) -> None:
    rows = found.table("goodput_interruptions")
    truth = found.truth.interruptions
    hits = matched(truth, rows)
    right = [
        k
        for k, i in hits.items()
        if (rows.loc[i, "cause"], str(rows.loc[i, "node"])) == (truth[k].cause, truth[k].node)
    ]
    assert len(right) >= 0.9 * len(truth), [
        (truth[k], rows.loc[i, ["cause", "node", "evidence"]].tolist())
        for k, i in hits.items()
        if k not in right
    ]


def test_measured_ettr_is_within_two_points(found: Found) -> None:
    jobs = found.table("goodput_jobs")
    measured = {(r.namespace, str(r.training_job)): r.ettr for r in jobs.itertuples()}
    assert set(measured) == set(found.truth.ettr)
    for job, ettr in found.truth.ettr.items():
        # The issue asks for 2 points; the model is exact up to a step at the window's
        # edges (an interruption right after a save once put it 1.2 points low).
        assert measured[job] == pytest.approx(ettr, abs=0.002), job


def test_exactly_the_injected_lemons_are_listed_and_the_fleet_figures_are_there(
    found: Found,
) -> None:
    lemons = found.table("goodput_lemons")
    flagged = set(lemons[lemons["lemon"]]["node"])
    assert flagged == set(found.truth.lemons)
    # Every other node that interrupted jobs passed the floor, not the fleet's rate.
    floor = lemons[~lemons["lemon"] & (lemons["multi_node_interruptions"] >= 2)]
    assert not floor.empty
    assert all("within the fleet" in e for e in floor["evidence"])
    causes = found.table("goodput_causes")
    assert causes["interruptions"].sum() == len(found.table("goodput_interruptions"))
    assert causes["cumulative_share"].iloc[-1] == pytest.approx(1.0)
    mttf = found.table("goodput_projected_mttf")
    assert list(mttf["gpus"]) == [8, 1024, 16384]
    assert mttf["mttf_hours"].is_monotonic_decreasing
    page = (found.out / "report.html").read_text()
    assert "alt='plot_goodput'" in page


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_input_is_named_and_the_rest_computed(tmp_path: Path, engine: str) -> None:
    spec = GoodputSpec(
        jobs=4,
        gpus_per_node=2,
        hours=12,
        rename_job=True,
        nodeless_pod=True,
        slurm_without_restart_count=True,
        node_per_1000_node_days=3000.0,
        lemon_per_1000_node_days=8000.0,
    )
    # A window of 10 minutes: shorter than the attribution window.
    short = run(spec, tmp_path / "short", engine, "--since=10m", "--bucket=5m")
    assert short.status == 0
    summary = (short.out / "summary.md").read_text()
    assert "  - note: the window (10m) is shorter than the attribution window" in summary
    assert "not computed: the window" not in summary
    assert not short.table("goodput_jobs").empty  # the jobs of those 10 minutes, computed
    # The renamed job's pods are replaced 27 minutes after the rename: each pod's job is read
    # at --bucket resolution (docs/goodput.md, Limits), so the buckets are shorter than that.
    result = run(spec, tmp_path / "whole", engine, "--bucket=10m")
    assert result.status == 0
    summary = (result.out / "summary.md").read_text()
    for caveat in (
        "a job label changed mid-run (training/run-0 → run-0-v2)",
        "pods without a node in kube_pod_info: training/run-2-",
        "Slurm jobs without a restart count (1003)",
    ):
        assert f"  - note: {caveat}" in summary
    assert "not computed" not in summary.split("**Goodput**")[1].split("\n- **")[0]
    jobs = result.table("goodput_jobs")
    names = set(jobs["training_job"].astype(str))
    assert "run-0-v2" in names
    assert "run-0" not in names
    assert {"run-2", "1001", "1003"} <= names
    # The rest is computed: the fleet's tables, every interruption of the nodeless pod's
    # job, and the uncounted Slurm job's requeues as gaps in its activity (in-place).
    for table in ("goodput_interruptions", "goodput_causes", "goodput_lemons"):
        assert not result.table(table).empty, table
    counted = dict(zip(jobs["training_job"].astype(str), jobs["interruptions"], strict=True))
    nodeless = sum(1 for t in result.truth.interruptions if t.job[1] == "run-2")
    assert counted["run-2"] == nodeless > 0
    rows = result.table("goodput_interruptions")
    gaps = rows[rows["training_job"].astype(str) == "1003"]
    assert len(gaps) == counted["1003"] > 0
    assert all("in_place" in kinds for kinds in gaps["kinds"]), gaps.to_string()


RECORDS = {
    "goodput_job_activity": JOB_TENSOR_MAX_RECORD,
    "goodput_job_gpus": JOB_GPUS_RECORD,
    "goodput_job_nodes": JOB_NODE_GPUS_RECORD,
}


@pytest.fixture(scope="module")
def recorded(found: Found, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Found]:
    """The same history with the live rules' job-level and interruption records: beside
    every GPU's series, alone (a store that kept only them), and from 12 hours in (the
    rules loaded after the window's start)."""
    root = tmp_path_factory.mktemp(f"recorded-{found.engine}")
    specs = {
        "beside": dataclasses.replace(SPEC, records=True),
        "alone": dataclasses.replace(SPEC, records=True, gpu_series=False),
        "late": dataclasses.replace(SPEC, records=True, records_from_hours=12),
    }
    return {name: run(spec, root / name, found.engine) for name, spec in specs.items()}


def findings(found: Found) -> tuple[list[tuple[str, ...]], dict[tuple[str, str], float]]:
    rows = found.table("goodput_interruptions")
    columns = ["namespace", "training_job", "timestamp", "kinds", "cause", "node"]
    interruptions = sorted(tuple(map(str, r)) for r in rows[columns].itertuples(index=False))
    jobs = found.table("goodput_jobs")
    return interruptions, {(r.namespace, str(r.training_job)): r.ettr for r in jobs.itertuples()}


def test_the_records_are_read_where_they_cover_the_window_and_find_the_same(
    found: Found, recorded: dict[str, Found]
) -> None:
    assert found.sources() == dict.fromkeys(RECORDS, RAW)
    assert FALLBACK_NOTE in found.summary()
    interruptions, ettr = findings(found)
    for name in ("beside", "alone"):
        got = recorded[name]
        assert got.status == 0
        assert got.sources() == RECORDS, name
        assert FALLBACK_NOTE not in got.summary(), name
        assert findings(got)[0] == interruptions, name
        assert findings(got)[1] == pytest.approx(ettr, abs=1e-9), name


def test_a_window_before_the_records_falls_back_and_says_so(
    found: Found, recorded: dict[str, Found]
) -> None:
    late = recorded["late"]
    assert late.sources() == dict.fromkeys(RECORDS, RAW)
    assert FALLBACK_NOTE in late.summary()
    assert findings(late)[0] == findings(found)[0]
    assert findings(late)[1] == pytest.approx(findings(found)[1], abs=1e-9)
