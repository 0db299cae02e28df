"""`fleetwatch report`: read Prometheus history, write the ranked fleet report.

Exit status: 0 when the report was written with at least one section computed; 1 when
Prometheus could not be read at all (unreachable, refused credentials, bad snapshot) or
nothing in the window could be computed (the report is still written, saying why).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final

from fleetwatch import promclient
from fleetwatch.durations import format_duration
from fleetwatch.flags import (
    REQUIRED,
    Flags,
    Subcommand,
    duration_setting,
    existing_dir,
    number_setting,
    setting,
)
from fleetwatch.promclient import PrometheusClientSettings
from fleetwatch.report.query import AREAS
from fleetwatch.rules.override import RULES_CONFIG, RulesConfigFile

# pandas, pyarrow and matplotlib are imported where the report runs, not here: every
# `fleetwatch` process (the exporter too) builds this parser and must stay small.
if TYPE_CHECKING:
    from fleetwatch.report.dataset import Dataset
    from fleetwatch.report.query import Window

log = logging.getLogger(__name__)

_MATCHER = r'\s*[A-Za-z_]\w*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
_SELECTOR = re.compile(rf"{_MATCHER}(?:,{_MATCHER})*")


def node_selector(text: str) -> str:
    """Validate a PromQL label-matcher list (`node=~"rack1-.*"`) and return it braceless."""
    inner = text.strip().removeprefix("{").removesuffix("}").strip()
    if inner and not _SELECTOR.fullmatch(inner):
        raise ValueError(
            f"invalid node selector {text!r}: expected PromQL label matchers such as "
            'node=~"rack1-.*" or node!="gpu-7"'
        )
    return inner


def timestamp(text: str) -> float:
    """Epoch seconds or an RFC 3339 time (`2024-05-01T12:00:00Z`)."""
    try:
        return float(text)
    except ValueError:
        pass  # not a number: try RFC 3339 below
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: use epoch seconds or RFC 3339, e.g. 2024-05-01T12:00:00Z"
        ) from exc


def selector(text: str) -> str:
    """argparse wrapper around `node_selector`."""
    try:
        return node_selector(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


@dataclass(frozen=True, kw_only=True)
class ReportSettings:
    """Everything `fleetwatch report` runs with: where the history is, which window, how to
    query it, where the report goes. The bounds: a window of at most a year at a step of one
    second to a day, and query settings no Prometheus needs more of. `prometheus` is the
    `--prometheus.*` client group (`fleetwatch.promclient`)."""

    prometheus: PrometheusClientSettings = field(default_factory=PrometheusClientSettings)
    since: float = duration_setting(
        86400.0, minimum=60.0, maximum=366 * 86400.0, help="window length before --until"
    )
    until: float | None = setting(
        None,
        parse=timestamp,
        metavar="TIME",
        help="window end, epoch seconds or RFC 3339 (default now)",
    )
    step: float = duration_setting(
        60.0, minimum=1.0, maximum=86400.0, help="resolution Prometheus evaluates at"
    )
    bucket: float = duration_setting(
        3600.0, minimum=60.0, maximum=31 * 86400.0, help="width of activity buckets"
    )
    node_selector: str = setting(
        "",
        parse=selector,
        metavar="SELECTOR",
        flag="query.node-selector",
        deprecated=("node-selector",),
        help='PromQL label matchers limiting the nodes, e.g. node=~"rack1-.*"',
    )
    threshold_celsius: float | None = number_setting(
        None,
        minimum=1.0,
        maximum=150.0,
        unit="°C",
        flag="thermal.threshold-celsius",
        help=(
            "the overheat policy's default temperature (default: the rules config's "
            "gpu_temperature_celsius); models listed in its overheat_policy keep their own"
        ),
    )
    concurrency: int = number_setting(
        4,
        minimum=1,
        maximum=64,
        integer=True,
        flag="query.concurrency",
        help="HTTP requests in flight at once",
    )
    batch_nodes: int = number_setting(
        200,
        minimum=1,
        maximum=5000,
        integer=True,
        flag="query.batch-nodes",
        help="nodes per request of the per-node queries",
    )
    retries: int = number_setting(
        3,
        minimum=0,
        maximum=20,
        integer=True,
        flag="query.retries",
        help="retries on 5xx, 429 and timeouts",
    )
    query_timeout: float = duration_setting(
        120.0, minimum=1.0, maximum=3600.0, flag="query.timeout", help="per-request timeout"
    )
    save_snapshot: Path | None = setting(
        None,
        parse=Path,
        metavar="DIR",
        flag="snapshot.save",
        deprecated=("save-snapshot",),
        help="also write the pulled data (Parquet)",
    )
    from_snapshot: Path | None = setting(
        None,
        parse=existing_dir,
        metavar="DIR",
        flag="snapshot.load",
        deprecated=("from-snapshot",),
        help="analyse a saved snapshot instead of querying Prometheus",
    )
    out: Path = setting(
        REQUIRED, parse=Path, metavar="DIR", help="directory the report is written to"
    )
    sections: tuple[str, ...] = setting(
        (),
        repeatable=True,
        choices=AREAS,
        flag="report.section",
        metavar="AREA",
        help="compute only this area's sections (repeat for several; default: every one)",
    )


REPORT_FLAGS: Final = Flags(settings=ReportSettings)


def subcommands() -> tuple[Subcommand, ...]:
    """`fleetwatch report`."""
    return (
        Subcommand(
            name="report",
            help="ranked fleet report from Prometheus history",
            flags=(REPORT_FLAGS, promclient.FLAGS, RULES_CONFIG),
            run=run,
        ),
    )


EDGE_OFFSET_SECONDS = 0.001


def _window(settings: ReportSettings) -> Window:
    from fleetwatch.report.query import Window
    from fleetwatch.report.thresholds import shipped_config, shipped_policy

    if settings.since < settings.bucket:
        raise ValueError(
            f"--since ({format_duration(settings.since)}) is shorter than one --bucket "
            f"({format_duration(settings.bucket)}): give a longer --since or a shorter --bucket"
        )
    # Prometheus reads a range as (t - d, t], VictoriaMetrics as [t - d, t]: a sample exactly
    # on a bucket's edge would count on one engine only. Ending 1 ms after the given time
    # puts no edge on a sample scraped on a whole second (and a sample at the given time
    # still counts).
    end = (settings.until if settings.until is not None else time.time()) + EDGE_OFFSET_SECONDS
    threshold = settings.threshold_celsius
    return Window(
        start=end - settings.since,
        end=end,
        step=settings.step,
        bucket=settings.bucket,
        threshold_celsius=shipped_policy().temperature_celsius if threshold is None else threshold,
        overheat_policy=shipped_config().overheat_policy,
        selector=settings.node_selector,
    )


async def _pull(settings: ReportSettings, window: Window) -> Dataset:
    from tqdm import tqdm

    from fleetwatch.report.dataset import fetch
    from fleetwatch.report.promapi import PrometheusClient

    with tqdm(
        desc="querying",
        unit="req",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
    ) as bar:
        async with PrometheusClient(
            access=promclient.PrometheusAccess(settings.prometheus),
            concurrency=settings.concurrency,
            retries=settings.retries,
            timeout_s=settings.query_timeout,
            progress=bar,
        ) as client:
            dataset = await fetch(
                client, window, batch_nodes=settings.batch_nodes, areas=settings.sections
            )
            log.info("read the store", extra={"bytes": client.bytes_fetched})
            return dataset


def run(args: argparse.Namespace) -> int:
    """Write the report, judged by the rules config (with `--rules.config-file` over it)."""
    from fleetwatch.report.thresholds import judged_by
    from fleetwatch.rules.config import ConfigError

    rules: RulesConfigFile = RULES_CONFIG.read(args)
    try:
        with judged_by(rules.config_file):
            return _report(REPORT_FLAGS.read(args, prometheus=promclient.FLAGS.read(args)))
    except ConfigError as exc:
        log.error("report: %s", exc)
        return 1


def _report(settings: ReportSettings) -> int:
    """Pull (or load) the data, analyse it, write the report."""
    from fleetwatch.report import render
    from fleetwatch.report.analysis import analyse
    from fleetwatch.report.dataset import load_snapshot, save_snapshot
    from fleetwatch.report.promapi import PrometheusAuthError, PrometheusUnreachable, QueryError

    problem = settings.prometheus.problem()
    if problem is not None:
        log.error("report: %s", problem)
        return 1
    try:
        if settings.from_snapshot:
            dataset = load_snapshot(settings.from_snapshot)
        elif not settings.prometheus.url:
            log.error("report: give --prometheus.url or --snapshot.load")
            return 1
        else:
            started = time.monotonic()
            dataset = asyncio.run(_pull(settings, _window(settings)))
            log.info("queried Prometheus", extra={"seconds": round(time.monotonic() - started, 2)})
    except (PrometheusUnreachable, PrometheusAuthError, QueryError, ValueError) as exc:
        log.error("report: %s", exc)
        return 1
    if settings.save_snapshot:
        save_snapshot(dataset, settings.save_snapshot)
    for name, problem in sorted(dataset.problems.items()):
        log.warning("report: %s not computed: %s", name, problem, extra={"query": name})
    for name, parts in sorted(dataset.missing.items()):
        for part in parts:
            log.warning("report: %s missing data: %s", name, part, extra={"query": name})
    report = analyse(dataset)
    render.write(report, settings.out)
    log.info("report written", extra={"out": str(settings.out), "actions": len(report.actions)})
    if not dataset.frames:
        log.error("report: nothing could be computed for the window; see the report's notes")
        return 1
    return 0
