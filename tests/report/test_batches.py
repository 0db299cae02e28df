"""Node batches: a query that names the batch's nodes in several selectors (the overheat
policy's time past it, one selector per model) is split until it fits the store's query
length limit, and no node is lost or repeated."""

from __future__ import annotations

from dataclasses import replace

from fleetwatch.report.dataset import MAX_QUERY_BYTES, batches, fitted
from fleetwatch.report.query import Window
from fleetwatch.report.query_table import QUERIES
from fleetwatch.report.thresholds import shipped_config

TEMP_ABOVE = next(q for q in QUERIES if q.name == "temp_above_seconds")
WINDOW = Window(
    start=0,
    end=86400,
    step=60,
    bucket=3600,
    threshold_celsius=78,
    overheat_policy=shipped_config().overheat_policy,
)
NODES = [f"dgx-h100-rack{rack:02d}-node-{n:03d}" for rack in range(10) for n in range(20)]


def test_a_long_query_is_split_until_each_part_fits() -> None:
    (whole,) = batches(NODES, 200)
    too_long = TEMP_ABOVE.build(replace(WINDOW, nodes=whole.regex))
    assert len(too_long.encode()) > MAX_QUERY_BYTES  # the shipped policy's 3 parts, 200 nodes
    parts = fitted(TEMP_ABOVE.build, WINDOW, whole)
    assert len(parts) > 1
    for part in parts:
        built = TEMP_ABOVE.build(replace(WINDOW, nodes=part.regex))
        assert len(built.encode()) <= MAX_QUERY_BYTES
    assert [node for part in parts for node in part.nodes] == NODES


def test_a_query_that_fits_keeps_its_batch() -> None:
    (whole,) = batches(NODES[:10], 200)
    assert fitted(TEMP_ABOVE.build, WINDOW, whole) == [whole]
