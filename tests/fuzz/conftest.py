"""`./dev.sh fuzz` asks for docs/reliability.md's parser table to be written
(`FLEETWATCH_FUZZ_TABLE`): each property that passes puts its parsers' rows there as it
ends, so a run cut short keeps what it finished and a run split in parts adds up."""

from __future__ import annotations

import os
from collections.abc import Generator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.fuzz.harness import FUZZ, TABLE_VARIABLE, TALLIES, Tally
from tests.fuzz.reliability import Row, record


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None]:
    """After a property passed, its parsers' rows: what this property added to the tally.
    A property that failed (a crash, a property that did not hold) writes nothing: the
    table keeps the row of the last run that passed."""
    before = {name: replace(tally) for name, tally in TALLIES.items()}
    result = yield
    target = os.environ.get(TABLE_VARIABLE)
    if target:
        day = datetime.now(UTC).date()
        rows = {}
        for name, after in TALLIES.items():
            was = before.get(name, Tally())
            if after.tried == was.tried:
                continue
            rows[name] = Row(
                examples=FUZZ.max_examples,
                day=day,
                tried=after.tried - was.tried,
                crashes=after.crashes - was.crashes,
                malformed=after.malformed - was.malformed,
                held=after.held - was.held,
            )
        if rows:
            record(Path(target), rows, cores=os.cpu_count())
    return result
