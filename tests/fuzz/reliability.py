"""Writes docs/reliability.md's parser table from a fuzz run's tally (`./dev.sh fuzz`).

`python -m tests.fuzz.reliability TALLY.json docs/reliability.md` replaces what stands
between the table's markers with the tally's figures: per parser, the inputs tried, the
crashes (0, or the run failed), the inputs it counted as malformed and the properties that
held. The rest of the document is prose and stays as written.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

BEGIN: Final = "<!-- parser table: written by ./dev.sh fuzz, do not edit -->"
END: Final = "<!-- end of parser table -->"


def table(report: dict[str, Any], *, when: datetime, cores: int | None) -> str:
    """The Markdown table (and the line saying how it was measured) of one tally."""
    parsers: dict[str, dict[str, int]] = report["parsers"]
    lines = [
        f"Measured {when:%Y-%m-%d} with `./dev.sh fuzz --examples {report['examples']}` "
        f"({report['examples']} examples per property; a property may try several inputs per "
        f"example, one per line or file) on {platform.python_implementation()} "
        f"{platform.python_version()}, {cores or '?'} cores.",
        "",
        "| parser | inputs tried | crashes | counted as malformed | properties held |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in sorted(parsers, key=str.lower):
        tally = parsers[name]
        lines.append(
            f"| {name} | {tally['tried']:,} | {tally['crashes']} | {tally['malformed']:,} "
            f"| {tally['held']:,} |"
        )
    return "\n".join(lines)


def rewrite(document: str, new_table: str) -> str:
    """`document` with the text between the markers replaced by `new_table`."""
    head, begin, rest = document.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"the document lacks the markers {BEGIN!r} and {END!r}")
    return f"{head}{BEGIN}\n{new_table}\n{END}{tail}"


def main(argv: list[str]) -> int:
    tally_path, document_path = (Path(arg) for arg in argv)
    report = json.loads(tally_path.read_text())
    new = table(report, when=datetime.now(UTC), cores=os.cpu_count())
    document_path.write_text(rewrite(document_path.read_text(), new))
    print(f"wrote the parser table of {document_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
