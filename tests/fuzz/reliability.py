"""Writes docs/reliability.md's parser table from fuzz runs (`./dev.sh fuzz`).

The table is its own record: one row per parser, from the largest run of that parser's
property that passed (the examples per property it ran, the day, the inputs tried, the
crashes, the inputs counted as malformed and the properties that held). `record` puts in the
rows of the parsers one property ran, unless the table holds a larger run of that parser, and
keeps every other row, so the long run can be done in parts (`./dev.sh fuzz -k EXPR`, several
processes at once, or one property after another across interruptions): each part adds what
it finished, and a short run never hides a long one. The rest of the document is prose and
stays as written.
"""

from __future__ import annotations

import fcntl
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Final

BEGIN: Final = "<!-- parser table: written by ./dev.sh fuzz, do not edit -->"
END: Final = "<!-- end of parser table -->"
HEADER: Final = (
    "| parser | examples per property | run on | inputs tried | crashes "
    "| counted as malformed | properties held |"
)
_RULE: Final = "|---|---:|---|---:|---:|---:|---:|"
_ROW: Final = re.compile(
    r"\| (?P<parser>[^|]+?) \| (?P<examples>[\d,]+) \| (?P<day>\d{4}-\d\d-\d\d) "
    r"\| (?P<tried>[\d,]+) \| (?P<crashes>\d+) \| (?P<malformed>[\d,]+) \| (?P<held>[\d,]+) \|"
)


@dataclass(frozen=True)
class Row:
    """One parser's figures from one run of its property."""

    examples: int
    day: date
    tried: int
    crashes: int
    malformed: int
    held: int

    def line(self, parser: str) -> str:
        return (
            f"| {parser} | {self.examples:,} | {self.day.isoformat()} | {self.tried:,} "
            f"| {self.crashes} | {self.malformed:,} | {self.held:,} |"
        )


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def rows(document: str) -> dict[str, Row]:
    """The rows the document's table holds, by parser."""
    _, _, rest = document.partition(BEGIN)
    found: dict[str, Row] = {}
    for match in _ROW.finditer(rest.partition(END)[0]):
        found[match["parser"]] = Row(
            examples=_number(match["examples"]),
            day=date.fromisoformat(match["day"]),
            tried=_number(match["tried"]),
            crashes=int(match["crashes"]),
            malformed=_number(match["malformed"]),
            held=_number(match["held"]),
        )
    return found


def table(by_parser: Mapping[str, Row], *, cores: int | None) -> str:
    """The Markdown table of `by_parser`, and the lines saying how it was measured."""
    lines = [
        "Written by `./dev.sh fuzz --examples N` on "
        f"{platform.python_implementation()} {platform.python_version()}, {cores or '?'} cores. "
        "Each row comes from the largest run of its parser's property that passed: N examples, "
        "run on the day shown (a property may try several inputs per example, one per line or "
        "file).",
        "",
        HEADER,
        _RULE,
    ]
    lines += [by_parser[name].line(name) for name in sorted(by_parser, key=str.lower)]
    return "\n".join(lines)


def rewrite(document: str, new_table: str) -> str:
    """`document` with the text between the markers replaced by `new_table`."""
    head, begin, rest = document.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the document lacks the markers {BEGIN!r} and {END!r}")
    return f"{head}{BEGIN}\n{new_table}\n{END}{tail}"


def record(path: Path, new: Mapping[str, Row], *, cores: int | None) -> None:
    """Put `new`'s rows into the table of the document at `path`, except where it holds a run
    of more examples of that parser, keeping the others.

    Several fuzz processes may finish a property at the same moment: the read, merge and
    write happen under an exclusive lock on the document."""
    with path.open("r+", encoding="utf-8") as document:
        fcntl.flock(document, fcntl.LOCK_EX)
        text = document.read()
        merged = rows(text)
        merged |= {
            name: row
            for name, row in new.items()
            if name not in merged or row.examples >= merged[name].examples
        }
        document.seek(0)
        document.write(rewrite(text, table(merged, cores=cores)))
        document.truncate()
