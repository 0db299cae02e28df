"""The query table: one name per query, and every query read by a report section.

`Dataset` keeps a query's frame, problems and missing parts under its name, so two queries
of one name (from two area modules) would silently overwrite each other; a query no
section reads costs the store for nothing, and a section naming a query that does not exist
would never report its missing data."""

from __future__ import annotations

import asyncio
from collections import Counter

from fleetwatch.report.analysis import SECTION_QUERIES
from fleetwatch.report.dataset import LEFT_OUT, fetch
from fleetwatch.report.promapi import Answer, _NoProgress
from fleetwatch.report.query import AREAS, Window
from fleetwatch.report.query_table import BY_AREA, QUERIES


def test_query_names_are_unique() -> None:
    repeated = [name for name, count in Counter(q.name for q in QUERIES).items() if count > 1]
    assert repeated == []


def test_every_query_belongs_to_a_section_and_every_section_query_exists() -> None:
    names = {q.name for q in QUERIES}
    read = {name for section in SECTION_QUERIES.values() for name in section}
    assert names - read == set()
    assert read - names == set()


class _Store:
    """Answers every query with nothing and remembers each expression asked."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.asked: list[str] = []
        self.progress = _NoProgress()

    async def metric_names(self, **_: object) -> set[str]:
        return self.names

    async def label_values(self, *_: object, **__: object) -> set[str]:
        return {"gpu-0001"}

    async def query_range(self, expr: str, **_: object) -> Answer:
        self.asked.append(expr)
        return Answer(series=[], warnings=[])


def test_a_report_of_some_areas_asks_only_their_queries() -> None:
    every = {m for q in QUERIES for m in (*q.required, *q.optional)}
    store = _Store(every)
    window = Window(start=0, end=86_400, step=60, bucket=3_600, threshold_celsius=80)
    dataset = asyncio.run(fetch(store, window, areas=("goodput",)))  # type: ignore[arg-type]
    goodput = {q.name for q in BY_AREA["goodput"]}
    assert set(dataset.frames) == goodput
    left_out = {name for name, why in dataset.problems.items() if why == LEFT_OUT}
    assert left_out == {q.name for q in QUERIES} - goodput
    assert len(store.asked) >= len(goodput)
    assert tuple(BY_AREA) == AREAS
