"""Golden files: compare text against `tests/golden/NAME`, or rewrite it on request.

Run with `FLEETWATCH_UPDATE_GOLDEN=1` to write the current output as the new golden file,
then review the diff in git like any other change.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE_ENV = "FLEETWATCH_UPDATE_GOLDEN"


def assert_golden(name: str, actual: str) -> None:
    """Fail with a unified diff when `actual` differs from the golden file `name`."""
    path = GOLDEN_DIR / name
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        return
    if not path.exists():
        raise AssertionError(f"golden file {path} is missing: run with {UPDATE_ENV}=1 to create it")
    expected = path.read_text()
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=f"golden/{name}",
                tofile="actual",
                n=2,
            )
        )
        raise AssertionError(
            f"output differs from golden/{name} ({UPDATE_ENV}=1 rewrites it):\n" + diff[:20000]
        )
