"""The parser table is its own record: a run of some properties replaces their rows and
keeps the others, so `./dev.sh fuzz` can be run in parts."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from tests.fuzz.reliability import BEGIN, END, Row, record, rows

_DAY = date(2026, 12, 3)


def _row(examples: int, tried: int) -> Row:
    return Row(examples=examples, day=_DAY, tried=tried, crashes=0, malformed=1, held=tried - 1)


def test_a_run_in_parts_replaces_its_rows_and_keeps_the_others(tmp_path: Path) -> None:
    document = tmp_path / "reliability.md"
    document.write_text(f"# Prose\n\n{BEGIN}\nold\n{END}\n\nMore prose.\n")
    record(document, {"mountinfo": _row(100, 100), "diskstats": _row(100, 120)}, cores=2)
    record(document, {"mountinfo": _row(100000, 100001)}, cores=2)
    text = document.read_text()
    assert rows(text) == {"mountinfo": _row(100000, 100001), "diskstats": _row(100, 120)}
    assert "| mountinfo | 100,000 | 2026-12-03 | 100,001 | 0 | 1 | 100,000 |" in text
    assert text.startswith("# Prose\n\n")
    assert text.endswith(f"{END}\n\nMore prose.\n")
    assert "old" not in text


def test_a_shorter_run_leaves_a_longer_runs_row(tmp_path: Path) -> None:
    document = tmp_path / "reliability.md"
    document.write_text(f"{BEGIN}\n{END}\n")
    record(document, {"mountinfo": _row(10000, 10000)}, cores=2)
    record(document, {"mountinfo": _row(1000, 1000), "diskstats": _row(1000, 1000)}, cores=2)
    record(document, {"diskstats": _row(1000, 1100)}, cores=2)
    assert rows(document.read_text()) == {
        "mountinfo": _row(10000, 10000),
        "diskstats": _row(1000, 1100),
    }


def test_a_document_without_the_markers_is_refused(tmp_path: Path) -> None:
    document = tmp_path / "reliability.md"
    document.write_text("# Prose only\n")
    with pytest.raises(ValueError, match="lacks the markers"):
        record(document, {"mountinfo": _row(1, 1)}, cores=2)
    assert document.read_text() == "# Prose only\n"


def test_the_docs_table_reads_back_whole() -> None:
    text = Path(__file__).parents[2].joinpath("docs", "reliability.md").read_text()
    table = text.partition(BEGIN)[2].partition(END)[0]
    assert len(rows(text)) == table.count("\n| ") - 1  # every row but the header's
