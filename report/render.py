"""Write a Report as a self-contained HTML page, a Markdown summary and one CSV per table.

Plots are drawn with matplotlib's Agg canvas on `Figure` objects (no pyplot global
state) and embedded as PNG data URIs, so the HTML opens anywhere without Grafana or a
network. Tables are escaped by pandas; no script runs in the page.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fleetwatch.report.analysis import Report

HTML_ROWS = 25
JOB_LINES = 6  # jobs drawn in the job-activity plot
_STYLE = """body{font-family:sans-serif;margin:2em;max-width:80em;color:#222}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}td,th{border:1px solid #ccc;
padding:.2em .5em;text-align:left}th{background:#eee}.note{color:#a40}img{max-width:100%}
.caveat{color:#555}
.plots{display:grid;grid-template-columns:1fr 1fr;gap:1em}
.missing{color:#fff;background:#b00;padding:.3em .6em}"""


def _png(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _empty(ax: object, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)  # type: ignore[attr-defined]


def plot_temperatures(report: Report) -> str:
    """Histogram of per-GPU median and p99 temperature with the taint threshold."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    gpus = report.tables().get("gpu_temperatures")
    threshold = report.dataset.window.threshold_celsius
    if gpus is None or gpus.empty:
        _empty(ax, "no temperature data")
    else:
        bins = np.arange(
            np.floor(gpus["median_celsius"].min()) - 1,
            max(threshold, gpus["max_celsius"].max()) + 2,
            1.0,
        ).tolist()
        ax.hist(gpus["median_celsius"].dropna(), bins=bins, alpha=0.6, label="median")
        ax.hist(gpus["p99_celsius"].dropna(), bins=bins, alpha=0.6, label="p99")
        ax.axvline(threshold, color="red", linestyle="--", label=f"taint {threshold:g} °C")
        ax.legend()
    ax.set(title="GPU temperature distribution", xlabel="°C", ylabel="GPUs")
    return _png(fig)


def plot_outliers(report: Report) -> str:
    """Median power vs median temperature per GPU, outliers marked."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    tables = report.tables()
    gpus, outliers = tables.get("gpu_temperatures"), tables.get("thermal_outliers")
    if gpus is None or gpus.empty:
        _empty(ax, "no temperature/power data")
    else:
        ax.scatter(gpus["median_watts"], gpus["median_celsius"], s=8, label="GPU")
        if outliers is not None and not outliers.empty:
            ax.scatter(
                outliers["median_watts"],
                outliers["median_celsius"],
                s=40,
                color="red",
                label="outlier",
            )
            for row in outliers.itertuples():
                ax.annotate(f"{row.node}/{row.gpu}", (row.median_watts, row.median_celsius))
        ax.legend()
    ax.set(title="Thermal outliers at similar power", xlabel="median W", ylabel="median °C")
    return _png(fig)


def plot_activity(report: Report) -> str:
    """Tensor-core activity vs NVML "GPU utilization" per GPU."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    gpus = report.tables().get("gpu_activity")
    if gpus is None or gpus.empty:
        _empty(ax, "no activity data")
    else:
        ax.scatter(gpus["utilization"], gpus["tensor"], s=8, color="tab:green")
        ax.plot([0, 1], [0, 1], color="grey", linewidth=0.5)
    ax.set(
        title='Tensor activity vs "GPU utilization"',
        xlabel="GPU utilization (NVML)",
        ylabel="tensor active",
        xlim=(0, 1.02),
        ylim=(0, 1.02),
    )
    return _png(fig)


def plot_fabric(report: Report) -> str:
    """Heat map of InfiniBand error counts, node by error type."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    errors = report.tables().get("ib_port_errors")
    if errors is None or errors.empty:
        _empty(ax, "no InfiniBand errors in the window")
    else:
        grid = errors.pivot_table(
            index="node",
            columns="error",
            values="errors",
            aggfunc="sum",
            fill_value=0,
            observed=True,
        )
        image = ax.imshow(np.log10(grid.to_numpy() + 1), aspect="auto", cmap="Reds")
        ax.set_xticks(range(len(grid.columns)), list(grid.columns), rotation=30)
        ax.set_yticks(range(len(grid.index)), list(grid.index))
        fig.colorbar(image, ax=ax, label="log10(errors + 1)")
    ax.set_title("InfiniBand errors by node and type")
    return _png(fig)


def plot_taints(report: Report) -> str:
    """Timeline of taint windows per node."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    windows = report.tables().get("taint_windows")
    if windows is None or windows.empty:
        _empty(ax, "no taints in the window")
    else:
        nodes = sorted(windows["node"].unique())
        start = report.dataset.window.start
        for i, node in enumerate(nodes):
            rows = windows[windows["node"] == node]
            spans = [
                ((r.start - start) / 3600, (r.end - r.start) / 3600) for r in rows.itertuples()
            ]
            ax.broken_barh(spans, (i - 0.4, 0.8), color="tab:orange")
        ax.set_yticks(range(len(nodes)), nodes)
        ax.set_xlim(0, report.dataset.window.seconds / 3600)
    ax.set(title="Taint timeline", xlabel="hours since window start")
    return _png(fig)


def plot_straggler(report: Report) -> str:
    """The top straggler's job: each GPU's tensor activity against its SM clock."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    tables = report.tables()
    stragglers, members = tables.get("stragglers"), tables.get("job_gpus")
    if stragglers is None or stragglers.empty or members is None:
        _empty(ax, "no straggler in the window")
        ax.set_title("Straggler")
        return _png(fig)
    top = stragglers.iloc[0]
    job = members[
        (members["namespace"] == top["namespace"])
        & (members["training_job"] == top["training_job"])
    ]
    ax.scatter(job["sm_clock_mhz"], job["tensor_mean"], s=12, label="GPU of the job")
    ax.scatter(
        [top["sm_clock_mhz"]],
        [top["tensor_mean"]],
        s=60,
        color="red",
        label=f"straggler {top['node']} GPU {top['gpu']}",
    )
    ax.axhline(
        top["job_median_tensor"], color="grey", linestyle="--", linewidth=0.8, label="job median"
    )
    ax.legend(loc="lower left")
    ax.set(
        title=f"Straggler of {top['namespace']}/{top['training_job']}",
        xlabel="mean SM clock (MHz)",
        ylabel="mean tensor active",
    )
    return _png(fig)


def plot_jobs(report: Report) -> str:
    """Median tensor activity over time of the slowed jobs (else the largest jobs)."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    tables = report.tables()
    timeline, jobs = tables.get("job_timeline"), tables.get("jobs")
    slowed = tables.get("job_slowdowns")
    if timeline is None or timeline.empty or jobs is None:
        _empty(ax, "no training jobs in the window")
        ax.set_title("Training jobs")
        return _png(fig)
    chosen = slowed if slowed is not None and not slowed.empty else jobs
    start = report.dataset.window.start
    for row in chosen.head(JOB_LINES).itertuples():
        points = timeline[
            (timeline["namespace"] == row.namespace)
            & (timeline["training_job"] == row.training_job)
        ]
        ax.plot(
            (points["timestamp"] - start) / 3600,
            points["median_tensor"],
            marker="o",
            label=f"{row.namespace}/{row.training_job}",
        )
    ax.legend(loc="lower left", fontsize="small")
    ax.set(
        title="Job median tensor activity"
        + (" (slowed jobs)" if chosen is slowed else " (largest jobs)"),
        xlabel="hours since window start (bucket end)",
        ylabel="median tensor active",
        ylim=(0, 1.02),
    )
    return _png(fig)


def plot_goodput(report: Report) -> str:
    """The job that lost the most GPU-hours: when it made progress (green), each
    interruption (a red line, labelled with its cause) and its ETTR."""
    fig = Figure(figsize=(12, 3))
    ax = fig.subplots()
    tables = report.tables()
    jobs, spans = tables.get("goodput_jobs"), tables.get("goodput_activity")
    found = tables.get("goodput_interruptions")
    if jobs is None or jobs.empty or spans is None or found is None:
        _empty(ax, "no training job in the window")
        ax.set_title("Goodput")
        return _png(fig)
    top = jobs.iloc[0]
    job = (spans["namespace"] == top["namespace"]) & (spans["training_job"] == top["training_job"])
    start = report.dataset.window.start
    bars = [((r.start - start) / 3600, (r.end - r.start) / 3600) for r in spans[job].itertuples()]
    ax.broken_barh(bars, (0.2, 0.6), color="tab:green", label="making progress")
    mine = found[
        (found["namespace"] == top["namespace"]) & (found["training_job"] == top["training_job"])
    ]
    for row in mine.itertuples():
        hours = (row.timestamp - start) / 3600
        ax.axvline(hours, color="red", linewidth=0.8)
        ax.text(hours, 0.9, str(row.cause), rotation=90, fontsize=6, va="top", ha="right")
    ax.set_yticks([])
    ax.set_xlim(0, report.dataset.window.seconds / 3600)
    ax.set(
        title=(
            f"{top['namespace']}/{top['training_job']}: {len(mine)} interruptions, "
            f"ETTR {top['ettr']:.2f}"
        ),
        xlabel="hours since window start",
    )
    return _png(fig)


PLOTS = (plot_temperatures, plot_outliers, plot_activity, plot_fabric, plot_taints)
# Plots shown at the top of their own section rather than in the overview grid.
SECTION_PLOTS = {"Training jobs": (plot_straggler, plot_jobs), "Goodput": (plot_goodput,)}


def _img(plot: Callable[[Report], str], report: Report) -> str:
    return f"<img alt='{plot.__name__}' src='data:image/png;base64,{plot(report)}'>"


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def _table_html(name: str, frame: pd.DataFrame) -> str:
    more = (
        f" (first {HTML_ROWS} of {len(frame)}; all in tables/{name}.csv)"
        if len(frame) > HTML_ROWS
        else ""
    )
    body = (
        frame.head(HTML_ROWS).to_html(
            index=False, escape=True, border=0, float_format=lambda v: f"{v:.4g}"
        )
        if not frame.empty
        else "<p>none</p>"
    )
    return f"<h3>{html.escape(name)}{html.escape(more)}</h3>\n{body}"


def to_html(report: Report) -> str:
    """The whole report as one HTML document."""
    w = report.dataset.window
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>fleetwatch report</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>Fleet report</h1><p>{_when(w.start)} to {_when(w.end)}, step {w.step:g}s, "
        f"buckets {w.bucket:g}s{html.escape(f', nodes {w.selector}' if w.selector else '')}</p>",
        *_incomplete_html(report),
        "<h2>Actions</h2>",
        _table_html("actions", report.actions),
        "<div class='plots'>",
        *(_img(p, report) for p in PLOTS),
        "</div>",
    ]
    for section in report.sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        plots = SECTION_PLOTS.get(section.title, ())
        if plots:
            parts += ["<div class='plots'>", *(_img(p, report) for p in plots), "</div>"]
        parts += [f"<p class='missing'>Missing data: {html.escape(m)}</p>" for m in section.missing]
        parts += [f"<p class='note'>Not computed: {html.escape(n)}</p>" for n in section.notes]
        parts += [f"<p class='caveat'>Note: {html.escape(n)}</p>" for n in section.caveats]
        parts += [_table_html(name, frame) for name, frame in section.tables.items()]
    parts.append("</body></html>")
    return "\n".join(parts)


def incomplete(report: Report) -> list[str]:
    """Titles of the sections whose data the store returned only in part."""
    return [s.title for s in report.sections if s.missing]


def _incomplete_html(report: Report) -> list[str]:
    titles = incomplete(report)
    if not titles:
        return []
    return [
        f"<p class='missing'>Incomplete data in {html.escape(', '.join(titles))}: the store "
        "did not return every part; a finding may be absent (see each section)</p>"
    ]


def _md_cell(value: object) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table."""
    if frame.empty:
        return "none\n"
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += [
        "| " + " | ".join(_md_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)
    ]
    return "\n".join(lines) + "\n"


def to_markdown(report: Report) -> str:
    """The action list, a count of findings per table, what could not be computed and
    what was computed with a caveat."""
    w = report.dataset.window
    lines = [
        f"# Fleet report {_when(w.start)} to {_when(w.end)}",
        "",
        "## Actions",
        "",
        *(
            [f"**Incomplete data** in {', '.join(incomplete(report))}: see below.", ""]
            if incomplete(report)
            else []
        ),
        markdown_table(report.actions),
        "## Findings",
        "",
    ]
    for section in report.sections:
        counts = ", ".join(f"{name}: {len(frame)}" for name, frame in section.tables.items())
        lines.append(f"- **{section.title}**: {counts or 'nothing computed'}")
        lines += [f"  - missing data: {part}" for part in section.missing]
        lines += [f"  - not computed: {note}" for note in section.notes]
        lines += [f"  - note: {caveat}" for caveat in section.caveats]
    return "\n".join(lines) + "\n"


def write(report: Report, out: Path) -> list[Path]:
    """Write report.html, summary.md and tables/*.csv under `out`; return the paths."""
    tables_dir = out / "tables"
    tables_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in report.tables().items():
        path = tables_dir / f"{name}.csv"
        frame.to_csv(path, index=False)
        written.append(path)
    for name, text in (("report.html", to_html(report)), ("summary.md", to_markdown(report))):
        (out / name).write_text(text)
        written.append(out / name)
    return written
