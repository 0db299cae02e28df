"""The report against a real Prometheus holding a backfilled, simulated fleet history.

The history (sim/fleet.py) has known anomalies; the report must find exactly
those, rank them first, and flag nothing else. One Prometheus and one report run serve
the whole module.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fleetwatch.cli import main
from fleetwatch.report.analysis import analyse
from fleetwatch.report.dataset import Dataset, load_snapshot
from fleetwatch.sim.fleet import (
    DCGM_NODE,
    FleetSpec,
    Injected,
    node_name,
    uuid,
)
from fleetwatch.sim.loopback_servers import Server, require_binary
from testbed.tool_servers import backfill_fleet, history_prometheus

pytestmark = pytest.mark.integration

SPEC = FleetSpec(nodes=6, gpus_per_node=8, ib_ports_per_node=8, hours=4)
CHROMIUM = "/usr/bin/chromium"


@dataclass
class Run:
    prom: Server
    plan: Injected
    out: Path
    snapshot: Path
    status: int


def report(prom: Server, out: Path, *extra: str) -> int:
    return main(
        [
            "report",
            f"--prometheus.url={prom.url}",
            f"--since={int(SPEC.hours)}h",
            f"--until={SPEC.end}",
            "--step=60s",
            f"--out={out}",
            "--log.format=text",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("report")
    plan = backfill_fleet(SPEC, root)
    with history_prometheus(root) as prom:
        status = report(prom, root / "out", f"--snapshot.save={root / 'snapshot'}")
        yield Run(prom=prom, plan=plan, out=root / "out", snapshot=root / "snapshot", status=status)


def table(run: Run, name: str) -> pd.DataFrame:
    return pd.read_csv(run.out / "tables" / f"{name}.csv", dtype=str)


def keys(frame: pd.DataFrame, *columns: str) -> list[tuple[str, ...]]:
    return [tuple(row) for row in frame[list(columns)].itertuples(index=False)]


def test_report_succeeds_and_writes_every_output(run: Run) -> None:
    assert run.status == 0
    assert (run.out / "report.html").stat().st_size > 10_000
    page = (run.out / "report.html").read_text()
    jobs = page.index("<h2>Training jobs</h2>")
    # The training-jobs section opens with its own two plots.
    assert page.index("alt='plot_straggler'") > jobs
    assert page.index("alt='plot_jobs'") > jobs
    assert "## Actions" in (run.out / "summary.md").read_text()


def test_actions_are_exactly_the_injected_anomalies_in_priority_order(run: Run) -> None:
    p = run.plan
    actions = table(run, "actions")
    assert keys(actions, "action", "target") == [
        ("drain", p.hot_gpu[0]),
        ("drain", p.xid79_gpu[0]),
        ("drain", p.xid79_returned_gpu[0]),
        ("reseat", f"{p.outlier_gpu[0]} GPU {p.outlier_gpu[1]}"),
        ("recable", f"{p.flapping_port[0]} {p.flapping_port[1]}/{p.flapping_port[2]}"),
        ("recable", f"{p.downed_port[0]} {p.downed_port[1]}/{p.downed_port[2]}"),
        ("recable", f"{p.saturated_port[0]} {p.saturated_port[1]}/{p.saturated_port[2]}"),
        ("investigate", f"{p.straggler_gpu[0]} GPU {p.straggler_gpu[1]}"),
        ("investigate", f"{p.idle_in_job_gpu[0]} GPU {p.idle_in_job_gpu[1]}"),
        ("investigate", "/".join(p.slowed_job)),
        ("reclaim", f"{p.idle_allocated_gpu[0]} GPU {p.idle_allocated_gpu[1]}"),
    ]
    reasons = list(actions["reason"])
    assert "Xid 79" in reasons[1]
    # Xid 79 on a GPU that came back is an action although no GPU went missing.
    assert reasons[2].startswith(f"GPU {p.xid79_returned_gpu[1]} fell off the bus (Xid 79")
    assert "came back" in reasons[2]
    assert reasons[5].startswith("3 link flaps")
    assert "straggler of training/llm" in reasons[7]
    assert "idle in training/llm" in reasons[8]
    # The slowed job's suspects name the flapping port on its node.
    flapping = f"IB {p.flapping_port[0]} {p.flapping_port[1]}/{p.flapping_port[2]} link_downed"
    assert flapping in reasons[9]


def test_job_findings_name_the_right_gpus(run: Run) -> None:
    p = run.plan
    stragglers = table(run, "stragglers")
    assert keys(stragglers, "node", "gpu", "namespace", "training_job") == [
        (*p.straggler_gpu, *p.straggler_job)
    ]
    straggler = stragglers.iloc[0]
    assert float(straggler["tensor_mean"]) > float(straggler["job_median_tensor"])
    assert float(straggler["sm_clock_mhz"]) == pytest.approx(1410, abs=1)
    assert float(straggler["job_median_sm_clock_mhz"]) == pytest.approx(1980, abs=5)
    assert float(straggler["straggling_hours"]) == SPEC.hours
    # Below half the job's median, or below the idle ratio whatever the job does (the
    # notebook GPU, which also gets a reclaim action rather than a second row).
    assert keys(table(run, "idle_in_job"), "node", "gpu", "training_job") == [
        (*p.idle_in_job_gpu, "llm"),
        (*p.idle_allocated_gpu, "jupyter-alice"),
    ]
    slowdowns = table(run, "job_slowdowns")
    assert keys(slowdowns, "namespace", "training_job") == [p.slowed_job]
    assert float(slowdowns.iloc[0]["drop"]) == pytest.approx(0.55, abs=0.03)


def test_job_identity_follows_the_configured_pod_label_order(run: Run) -> None:
    jobs = table(run, "jobs")
    identities = set(keys(jobs, "namespace", "training_job"))
    # JobSet label before the Helm instance label; a pod without job labels is its own job.
    assert identities == {
        ("training", "llm"),
        ("research", "bert-ft-0"),
        ("notebooks", "jupyter-alice"),
    }
    llm = jobs[jobs["training_job"] == "llm"].iloc[0]
    assert (int(llm["gpus"]), int(llm["nodes"])) == (32, 4)


@pytest.mark.parametrize(
    ("name", "columns", "expected"),
    [
        ("thermal_hot_gpus", ("node", "gpu"), lambda p: [p.hot_gpu]),
        ("thermal_outliers", ("node", "gpu"), lambda p: [p.outlier_gpu]),
        ("idle_allocated_gpus", ("node", "gpu"), lambda p: [p.idle_allocated_gpu]),
        ("stragglers", ("node", "gpu"), lambda p: [p.straggler_gpu]),
        ("idle_in_job", ("node", "gpu"), lambda p: [p.idle_in_job_gpu, p.idle_allocated_gpu]),
        ("job_slowdowns", ("namespace", "training_job"), lambda p: [p.slowed_job]),
        ("ib_flaps", ("node", "device", "port"), lambda p: [p.flapping_port, p.downed_port]),
        ("ib_saturated_counters", ("node", "device", "port"), lambda p: [p.saturated_port]),
        (
            "ib_port_errors",
            ("node", "device", "port"),
            lambda p: [p.saturated_port, p.flapping_port, p.downed_port],
        ),
        ("xid_events", ("node", "gpu"), lambda p: [p.xid79_returned_gpu, p.xid79_gpu]),
        ("gpus_lost", ("node", "gpu"), lambda p: [p.xid79_gpu]),
        ("node_tainted_time", ("node",), lambda p: [(p.tainted_node,)]),
        ("ib_degraded_ports", ("node",), lambda p: []),
        ("ecc_errors", ("node",), lambda p: []),
    ],
)
def test_finding_tables_hold_only_the_injected_rows(
    run: Run, name: str, columns: tuple[str, ...], expected: object
) -> None:
    assert keys(table(run, name), *columns) == expected(run.plan)  # type: ignore[operator]


def test_evidence_matches_what_was_injected(run: Run) -> None:
    hot = table(run, "thermal_hot_gpus").iloc[0]
    assert float(hot["minutes_above"]) == pytest.approx(40, abs=1)
    assert float(hot["max_celsius"]) > 82
    flaps = table(run, "ib_flaps").iloc[0]
    assert float(flaps["flaps"]) == run.plan.flaps
    outlier = table(run, "thermal_outliers").iloc[0]
    assert float(outlier["median_celsius"]) < 78 < float(outlier["median_celsius"]) + 12
    taint = table(run, "taint_windows").iloc[0]
    assert int(taint["start"]) == run.plan.hot_start
    # Backfilled data carries no staleness markers: the alert lingers for the 5m lookback.
    assert float(taint["minutes"]) == pytest.approx(40, abs=6)
    frame = table(run, "tainter_summary")
    summary = dict(zip(frame["what"], frame["value"], strict=True))
    assert summary["taint add (success)"] == "1.0"
    assert summary["taint remove (success)"] == "1.0"
    assert summary["breaker trips"] == "0.0"
    activity = table(run, "activity_by_node")
    assert set(activity["node"]) == {f"gpu-node-{i:04d}" for i in range(SPEC.nodes)}


def test_missing_collector_is_named_and_other_sections_still_render(run: Run) -> None:
    summary = (run.out / "summary.md").read_text()
    assert (
        "not computed: nvlink_errors: metric fleetwatch_nvlink_errors_total has no samples"
        in summary
    )
    assert "Not computed: nvlink_errors" in (run.out / "report.html").read_text()
    assert not (run.out / "tables" / "nvlink_errors.csv").exists()


def test_snapshot_round_trip_gives_identical_tables(run: Run, tmp_path: Path) -> None:
    assert main(["report", f"--snapshot.load={run.snapshot}", f"--out={tmp_path}"]) == 0
    live = sorted((run.out / "tables").iterdir())
    assert [p.name for p in live] == sorted(p.name for p in (tmp_path / "tables").iterdir())
    for path in live:
        assert path.read_bytes() == (tmp_path / "tables" / path.name).read_bytes(), path.name
    offline = analyse(load_snapshot(run.snapshot)).tables()
    again = analyse(load_snapshot(run.snapshot)).tables()
    for name, frame in offline.items():
        pd.testing.assert_frame_equal(frame, again[name])


def test_node_selector_limits_the_report(run: Run, tmp_path: Path) -> None:
    node = run.plan.hot_gpu[0]
    assert report(run.prom, tmp_path, f'--query.node-selector=node="{node}"') == 0
    assert set(
        table(Run(run.prom, run.plan, tmp_path, tmp_path, 0), "gpu_temperatures")["node"]
    ) == {node}
    actions = pd.read_csv(tmp_path / "tables" / "actions.csv", dtype=str)
    assert keys(actions, "action", "target") == [
        ("drain", node),
        ("investigate", f"{node} GPU {run.plan.hot_gpu[1]}"),
    ]


def test_empty_window_says_so_and_exits_nonzero(
    run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            "report",
            f"--prometheus.url={run.prom.url}",
            "--since=1h",
            f"--until={SPEC.start - 86400}",
            f"--out={tmp_path}",
        ]
    )
    assert status == 1
    assert "no samples at all in the window" in (tmp_path / "summary.md").read_text()
    assert "nothing could be computed" in capsys.readouterr().err


def test_html_opens_in_headless_chromium_and_shows_the_plots(run: Run, tmp_path: Path) -> None:
    require_binary(CHROMIUM)
    shot = tmp_path / "shot.png"
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1280,1400",
            (run.out / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    plots = pixels[400:1100]
    assert plots.std() > 20, "the plot area is blank"
    # Bars, markers, the heat map and the taint span are saturated colours; text and
    # tables are grey.
    colourful = (plots.max(axis=2) - plots.min(axis=2)) > 80
    assert colourful.sum() > 5000, "no plotted data visible"


def without(run: Run, *names: str) -> Dataset:
    """The run's snapshot as if the named queries had found no metric."""
    dataset = load_snapshot(run.snapshot)
    for name in names:
        del dataset.frames[name]
        dataset.problems[name] = f"metric for {name} has no samples in the window"
    return dataset


def test_without_kube_pod_labels_each_pod_is_its_own_job_and_says_why(run: Run) -> None:
    report = analyse(without(run, "pod_jobs"))
    jobs = report.tables()["jobs"]
    assert "llm" not in set(jobs["training_job"])
    assert {"llm-workers-0-0", "llm-workers-0-3"} <= set(jobs["training_job"])
    section = next(s for s in report.sections if s.title == "Training jobs")
    assert any("each pod counts as its own training job" in note for note in section.caveats)
    # Within its own pod the throttled GPU is still the one the others wait for.
    stragglers = report.tables()["stragglers"]
    assert keys(stragglers, "node", "gpu") == [run.plan.straggler_gpu, run.plan.hot_gpu]


def test_link_downed_alone_counts_flaps(run: Run) -> None:
    report = analyse(without(run, "ib_state_changes", "ib_down_seconds"))
    flaps = report.tables()["ib_flaps"]
    p = run.plan
    assert keys(flaps, "node", "device", "port") == [p.flapping_port, p.downed_port]
    assert list(flaps["flaps"]) == [p.flaps, 3]
    recable = report.actions[report.actions["action"] == "recable"]
    assert f"{p.downed_port[0]} {p.downed_port[1]}/{p.downed_port[2]}" in set(recable["target"])


def test_dcgm_exporter_activity_stands_in_where_there_is_no_gpm(run: Run) -> None:
    activity = table(run, "gpu_activity")
    node = node_name(SPEC, DCGM_NODE)
    gpus = activity[activity["node"] == node]
    # dcgm-exporter's UUID and Hostname became uuid and node.
    assert list(gpus["uuid"]) == [uuid(DCGM_NODE, gpu) for gpu in range(SPEC.gpus_per_node)]
    assert float(gpus["tensor"].max()) < 0.05  # unallocated: idle


def test_kube_pod_labels_from_another_scrape_job_is_named(run: Run) -> None:
    dataset = load_snapshot(run.snapshot)
    dataset.frames["pod_jobs"] = dataset.frames["pod_jobs"].iloc[0:0]
    report = analyse(dataset)
    section = next(s for s in report.sections if s.title == "Training jobs")
    assert any("configured kube-state-metrics job" in note for note in section.caveats)
    assert "llm" not in set(report.tables()["jobs"]["training_job"])
