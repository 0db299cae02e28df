"""The checkpoint-storage panels: a storage row on node detail, the job's checkpoint
throughput and saves on the training-job dashboard, read through the storage families and
the checkpoint recording rules."""

from __future__ import annotations

import json
from typing import Any

from fleetwatch.catalog.storage import (
    STORAGE_AVAILABLE_BYTES,
    STORAGE_HUNG,
    STORAGE_READ_ONLY,
    STORAGE_WRITTEN_BYTES_TOTAL,
)
from fleetwatch.report.storage_queries import (
    JOB_CHECKPOINT_BURST,
    JOB_CHECKPOINT_WRITE,
    NODE_CHECKPOINT_WRITE,
)
from tests.rules.promql import dashboards_generator

gen = dashboards_generator()


def panels(stem: str) -> dict[str, list[str]]:
    """Panel title -> its queries, of the committed dashboard `stem` (rows as titles too)."""
    data: dict[str, Any] = json.loads((gen.DASHBOARDS_DIR / f"{stem}.json").read_text())
    out: dict[str, list[str]] = {p["title"]: [] for p in data["panels"]}
    for title, expr in gen.panel_queries(data):
        out[title].append(expr)
    return out


def test_node_detail_has_a_checkpoint_storage_row() -> None:
    found = panels("node-detail")
    assert "Checkpoint storage" in found
    mounts = found["Checkpoint mounts: hung, read-only"]
    assert any(STORAGE_HUNG.name in q for q in mounts)
    assert any(STORAGE_READ_ONLY.name in q for q in mounts)
    assert any(STORAGE_WRITTEN_BYTES_TOTAL.name in q for q in found["Checkpoint mount throughput"])
    space = found["Checkpoint mount space available"]
    assert any(STORAGE_AVAILABLE_BYTES.name in q for q in space)
    assert all('node=~"$node"' in q for q in mounts + space)


def test_training_job_shows_checkpoint_throughput_saves_and_the_straggler() -> None:
    found = panels("training-job")
    assert "Checkpoints: does a save stall on one node?" in found
    job = found["Checkpoint write throughput and saves"]
    selector = 'namespace="$namespace", training_job="$training_job"'
    assert job[0].startswith(f"{JOB_CHECKPOINT_WRITE}{{{selector}}}")
    assert job[1].startswith(f"{JOB_CHECKPOINT_BURST}{{{selector}}}")
    per_node = found["Checkpoint write rate per node of the job"]
    assert per_node[0].startswith(f"{NODE_CHECKPOINT_WRITE} and on (node) ")
    alerts = found["Checkpoint alerts on the job's nodes"][0]
    assert "CheckpointStraggler" in alerts
    assert "CheckpointMountHung" in alerts
