"""A section's notes are rendered as what they are: "Not computed" for a table the store
could not give, "Note" for a caveat about what was computed (an estimate, a short window,
bad input worked around), in the HTML page and the Markdown summary alike."""

from __future__ import annotations

import pandas as pd

from fleetwatch.report import render
from fleetwatch.report.analysis import Report
from fleetwatch.report.dataset import Dataset
from fleetwatch.report.query import Window
from fleetwatch.report.section import Section

NOT_COMPUTED = "goodput_job_activity: metric has no samples in the window"
CAVEAT = "lemon scores cover the report's window (2d), shorter than lemon_window (28d)"


def report() -> Report:
    window = Window(start=0.0, end=3600.0, step=60.0, bucket=600.0, threshold_celsius=78.0)
    section = Section("Goodput", notes=[NOT_COMPUTED], caveats=[CAVEAT])
    return Report(dataset=Dataset(window=window), actions=pd.DataFrame(), sections=[section])


def test_the_html_page_says_not_computed_and_note_apart() -> None:
    page = render.to_html(report())
    assert f"<p class='note'>Not computed: {NOT_COMPUTED}</p>" in page
    assert "<p class='caveat'>Note: lemon scores cover the report&#x27;s window" in page
    assert f"Not computed: {CAVEAT[:20]}" not in page


def test_the_summary_says_not_computed_and_note_apart() -> None:
    summary = render.to_markdown(report())
    assert f"  - not computed: {NOT_COMPUTED}\n" in summary
    assert f"  - note: {CAVEAT}\n" in summary
    assert f"not computed: {CAVEAT}" not in summary
