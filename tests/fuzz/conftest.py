"""The fuzz tests' tally goes to a file when `./dev.sh fuzz` asks for it
(`FLEETWATCH_FUZZ_REPORT`), for docs/reliability.md's parser table."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fuzz.harness import REPORT_VARIABLE, write_report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the tally of the whole run (hook: every fuzz module has run by now)."""
    target = os.environ.get(REPORT_VARIABLE)
    if target:
        write_report(Path(target))
