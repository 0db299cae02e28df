"""A report section (named tables and notes) and the frame helpers every finding uses."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from fleetwatch.report.dataset import Dataset


@dataclass
class Section:
    """One report section: named tables in display order, what could not be computed
    (`notes`), what was computed with a caveat its reader must know (`caveats`: an
    estimate, a window shorter than a definition's, bad input worked around), and what its
    tables lack because the store did not return it (`missing`)."""

    title: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def frame_values(ds: Dataset, name: str, keys: tuple[str, ...], column: str) -> pd.DataFrame | None:
    """A summary frame as `keys + [column]`, or None when its query did not run."""
    frame = ds.frame(name)
    if frame is None:
        return None
    out = frame[[*keys, "value"]].rename(columns={"value": column})
    return out.astype(dict.fromkeys(keys, "string"))


def require(section: Section, ds: Dataset, *names: str) -> bool:
    """True when every named query ran; otherwise note why and return False."""
    missing = [n for n in names if ds.frame(n) is None]
    for name in missing:
        section.notes.append(f"{name}: {ds.problems.get(name, 'not available')}")
    return not missing


def ranked(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """`frame` sorted by `by`, largest first (ties keep their order)."""
    return frame.sort_values(by, ascending=False, kind="stable", ignore_index=True)
