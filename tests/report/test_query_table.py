"""The query table: one name per query, and every query read by a report section.

`Dataset` keeps a query's frame, problems and missing parts under its name, so two queries
of one name (from two area modules) would silently overwrite each other; a query no
section reads costs the store for nothing, and a section naming a query that does not exist
would never report its missing data."""

from __future__ import annotations

from collections import Counter

from fleetwatch.report.analysis import SECTION_QUERIES
from fleetwatch.report.query_table import QUERIES


def test_query_names_are_unique() -> None:
    repeated = [name for name, count in Counter(q.name for q in QUERIES).items() if count > 1]
    assert repeated == []


def test_every_query_belongs_to_a_section_and_every_section_query_exists() -> None:
    names = {q.name for q in QUERIES}
    read = {name for section in SECTION_QUERIES.values() for name in section}
    assert names - read == set()
    assert read - names == set()
