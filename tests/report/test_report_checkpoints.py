"""The report's checkpoint section against a real store holding a backfilled half hour: one
mount hangs for ten minutes, one fills up, a job saves twice, one node writes slowly. The
section finds exactly those; without the checkpoint records it says so. Each test runs on
both stores the report supports: Prometheus (backfilled with promtool) and VictoriaMetrics
(Debian's, through its import API), so its queries are proven on each engine."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from fleetwatch.catalog.gpu import GPUS_VISIBLE
from fleetwatch.catalog.storage import (
    STORAGE_AVAILABLE_BYTES,
    STORAGE_HUNG,
    STORAGE_READ_ONLY,
    STORAGE_SIZE_BYTES,
)
from fleetwatch.cli import main
from fleetwatch.report.analysis import analyse
from fleetwatch.report.checkpoints import TITLE
from fleetwatch.report.dataset import Dataset, load_snapshot
from fleetwatch.report.queries import (
    JOB_CHECKPOINT_BURST,
    JOB_CHECKPOINT_WRITE,
    NODE_CHECKPOINT_WRITE,
)
from fleetwatch.report.section import Section
from testbed.servers import history_store

pytestmark = pytest.mark.integration

END = 1_700_001_800  # a whole minute; the history is the half hour before it
MINUTES = 31  # samples at every minute from END - 30m to END
MOUNT = '{mountpoint="/ckpt",node="%s"}'
JOB = '{namespace="ml",training_job="llm"}'


def series(values: list[float]) -> list[float]:
    assert len(values) == MINUTES
    return values


def history() -> dict[str, dict[str, list[float]]]:
    """Family -> labels -> one value a minute."""
    saving = [1.0 if m in (5, 6, 7, 20, 21) else 0.0 for m in range(MINUTES)]
    return {
        GPUS_VISIBLE.name: {f'{{node="{n}"}}': series([8.0] * MINUTES) for n in ("n1", "n2", "n3")},
        STORAGE_HUNG.name: {
            MOUNT % "n1": series([1.0 if 10 <= m < 20 else 0.0 for m in range(MINUTES)]),
            MOUNT % "n2": series([0.0] * MINUTES),
        },
        STORAGE_READ_ONLY.name: {MOUNT % n: series([0.0] * MINUTES) for n in ("n1", "n2")},
        STORAGE_AVAILABLE_BYTES.name: {
            MOUNT % "n1": series([1e12 - 2e8 * m for m in range(MINUTES)]),
            MOUNT % "n2": series([5e11] * MINUTES),
        },
        STORAGE_SIZE_BYTES.name: {
            MOUNT % "n1": series([2e12] * MINUTES),
            MOUNT % "n2": series([1e12] * MINUTES),
        },
        JOB_CHECKPOINT_BURST: {JOB: series(saving)},
        JOB_CHECKPOINT_WRITE: {JOB: series([2.2e9 * s for s in saving])},
        NODE_CHECKPOINT_WRITE: {
            f'{{node="{n}"}}': series([rate * s for s in saving])
            for n, rate in (("n1", 1e9), ("n2", 1e9), ("n3", 2e8))
        },
    }


def write_openmetrics(path: Path, families: dict[str, dict[str, list[float]]]) -> None:
    lines: list[str] = []
    for name, rows in families.items():
        lines.append(f"# TYPE {name} gauge")
        for labels, values in rows.items():
            start = END - (MINUTES - 1) * 60
            lines += [f"{name}{labels} {v} {start + 60 * i}" for i, v in enumerate(values)]
    path.write_text("\n".join([*lines, "# EOF", ""]))


def victoria_lines(families: dict[str, dict[str, list[float]]]) -> Iterator[dict[str, object]]:
    """The same history as VictoriaMetrics' JSON-lines import (one item per series)."""
    start = END - (MINUTES - 1) * 60
    for name, rows in families.items():
        for labels, values in rows.items():
            yield {
                "metric": {"__name__": name, **dict(re.findall(r'(\w+)="([^"]*)"', labels))},
                "values": values,
                "timestamps": [(start + 60 * i) * 1000 for i in range(len(values))],
            }


def run_report(
    root: Path, families: dict[str, dict[str, list[float]]], engine: str = "prometheus"
) -> Dataset:
    with history_store(
        engine,
        root,
        openmetrics=lambda path: write_openmetrics(path, families),
        victoria=lambda: victoria_lines(families),
    ) as server:
        url = server.url
        status = main(
            [
                "report",
                f"--prometheus.url={url}",
                "--since=30m",
                f"--until={END}",
                "--step=60s",
                "--bucket=10m",
                f"--out={root / 'out'}",
                f"--snapshot.save={root / 'snapshot'}",
                "--log.format=text",
            ]
        )
    assert status in (0, 1), status
    return load_snapshot(root / "snapshot")


def section(dataset: Dataset) -> Section:
    return next(s for s in analyse(dataset).sections if s.title == TITLE)


ENGINES = ("prometheus", "victoriametrics")


@pytest.fixture(scope="module", params=ENGINES)
def found(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Section:
    engine: str = request.param
    return section(run_report(tmp_path_factory.mktemp(engine), history(), engine))


def rows(frame: pd.DataFrame, *columns: str) -> list[tuple[object, ...]]:
    return [tuple(row) for row in frame[list(columns)].itertuples(index=False)]


def test_the_hung_mount_and_its_minutes(found: Section) -> None:
    hung = found.tables["mounts_hung"]
    assert rows(hung, "node", "mountpoint") == [("n1", "/ckpt")]
    assert hung["minutes_hung"].iloc[0] == pytest.approx(10)
    assert found.tables["mounts_read_only"].empty


def test_the_filling_mount_and_when_it_is_full(found: Section) -> None:
    filling = found.tables["mounts_filling"]
    assert rows(filling, "node", "mountpoint") == [("n1", "/ckpt")]
    # 9.94e11 bytes left, falling 2e8 bytes a minute.
    assert filling["hours_to_full"].iloc[0] == pytest.approx(9.94e11 / (2e8 / 60) / 3600)
    assert filling["available_ratio"].iloc[0] == pytest.approx(9.94e11 / 2e12)


def test_the_jobs_saves_and_the_slow_node(found: Section) -> None:
    saves = found.tables["checkpoint_saves"]
    assert rows(saves, "namespace", "training_job", "saves") == [("ml", "llm", 2.0)]
    assert saves["mean_save_seconds"].iloc[0] == pytest.approx(150)
    assert saves["peak_bytes_per_second"].iloc[0] == pytest.approx(2.2e9)
    slow = found.tables["checkpoint_slow_nodes"]
    assert rows(slow, "node") == [("n3",)]
    assert slow["share_of_median"].iloc[0] == pytest.approx(0.2)
    assert found.notes == []


@pytest.mark.parametrize("engine", ENGINES)
def test_without_the_checkpoint_records_the_section_says_so(tmp_path: Path, engine: str) -> None:
    families = history()
    for record in (JOB_CHECKPOINT_BURST, JOB_CHECKPOINT_WRITE, NODE_CHECKPOINT_WRITE):
        del families[record]
    del families[STORAGE_HUNG.name]
    quiet = section(run_report(tmp_path, families, engine))
    assert "checkpoint_saves" not in quiet.tables
    assert "checkpoint_slow_nodes" not in quiet.tables
    assert "mounts_hung" not in quiet.tables
    notes = "\n".join(quiet.notes)
    assert f"{JOB_CHECKPOINT_BURST} has no samples in the window" in notes
    assert f"{NODE_CHECKPOINT_WRITE} has no samples in the window" in notes
    assert f"metric {STORAGE_HUNG.name} has no samples in the window" in notes
