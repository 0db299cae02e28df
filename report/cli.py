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
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetwatch.durations import format_duration
from fleetwatch.flags import (
    bounded_duration,
    bounded_number,
    existing_dir,
    http_url,
    readable_file,
)

# pandas, pyarrow and matplotlib are imported where the report runs, not here: every
# `fleetwatch` process (the exporter too) builds this parser and must stay small.
if TYPE_CHECKING:
    from fleetwatch.report.dataset import Dataset
    from fleetwatch.report.queries import Window

log = logging.getLogger(__name__)

# Bounds of the report's flags: a window of at most a year at a step of one second to a
# day, and query settings no Prometheus needs more of.
_window_duration = bounded_duration(60.0, 366 * 86400.0)
_step_duration = bounded_duration(1.0, 86400.0)
_bucket_duration = bounded_duration(60.0, 31 * 86400.0)
_timeout_duration = bounded_duration(1.0, 3600.0)


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


def add_subcommands(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register `fleetwatch report`."""
    p = subparsers.add_parser("report", help="ranked fleet report from Prometheus history")
    p.add_argument(
        "--prometheus-url",
        type=http_url,
        help="Prometheus-compatible API base URL (Prometheus, Thanos, Mimir, ...)",
    )
    p.add_argument(
        "--prometheus.bearer-token-file",
        dest="bearer_token_file",
        type=readable_file,
        help="file holding a bearer token for the API",
    )
    p.add_argument(
        "--since",
        type=_window_duration,
        metavar="DURATION",
        default=86400.0,
        help="window length before --until (default 24h)",
    )
    p.add_argument(
        "--until",
        type=timestamp,
        default=None,
        help="window end, epoch seconds or RFC 3339 (default now)",
    )
    p.add_argument(
        "--step",
        type=_step_duration,
        metavar="DURATION",
        default=60.0,
        help="resolution Prometheus evaluates at (default 60s)",
    )
    p.add_argument(
        "--bucket",
        type=_bucket_duration,
        metavar="DURATION",
        default=3600.0,
        help="width of activity buckets (default 1h)",
    )
    p.add_argument(
        "--node-selector",
        type=selector,
        default="",
        help='PromQL label matchers limiting the nodes, e.g. node=~"rack1-.*"',
    )
    p.add_argument(
        "--thermal.threshold-celsius",
        dest="threshold_celsius",
        type=bounded_number(1.0, 150.0, unit="°C"),
        metavar="NUMBER",
        default=None,
        help="the taint threshold (default: the rules config's gpu_temperature_celsius)",
    )
    p.add_argument(
        "--query.concurrency",
        dest="concurrency",
        type=bounded_number(1, 64, integer=True),
        metavar="N",
        default=4,
        help="HTTP requests in flight at once (default 4)",
    )
    p.add_argument(
        "--query.batch-nodes",
        dest="batch_nodes",
        type=bounded_number(1, 5000, integer=True),
        metavar="N",
        default=200,
        help="nodes per request of the per-node queries (default 200)",
    )
    p.add_argument(
        "--query.retries",
        dest="retries",
        type=bounded_number(0, 20, integer=True),
        metavar="N",
        default=3,
        help="retries on 5xx, 429 and timeouts (default 3)",
    )
    p.add_argument(
        "--query.timeout",
        dest="query_timeout",
        type=_timeout_duration,
        metavar="DURATION",
        default=120.0,
        help="per-request timeout (default 120s)",
    )
    p.add_argument("--save-snapshot", type=Path, help="also write the pulled data (Parquet)")
    p.add_argument(
        "--from-snapshot",
        type=existing_dir,
        help="analyse a saved snapshot instead of querying Prometheus",
    )
    p.add_argument("--out", type=Path, required=True, help="directory the report is written to")
    p.set_defaults(run=run)


EDGE_OFFSET_SECONDS = 0.001


def _window(args: argparse.Namespace) -> Window:
    from fleetwatch.report.policy import shipped_policy
    from fleetwatch.report.queries import Window

    if args.since < args.bucket:
        raise ValueError(
            f"--since ({format_duration(args.since)}) is shorter than one --bucket "
            f"({format_duration(args.bucket)}): give a longer --since or a shorter --bucket"
        )
    # Prometheus reads a range as (t - d, t], VictoriaMetrics as [t - d, t]: a sample exactly
    # on a bucket's edge would count on one engine only. Ending 1 ms after the given time
    # puts no edge on a sample scraped on a whole second (and a sample at the given time
    # still counts).
    end = (args.until if args.until is not None else time.time()) + EDGE_OFFSET_SECONDS
    threshold = args.threshold_celsius
    return Window(
        start=end - args.since,
        end=end,
        step=args.step,
        bucket=args.bucket,
        threshold_celsius=shipped_policy().temperature_celsius if threshold is None else threshold,
        selector=args.node_selector,
    )


async def _pull(args: argparse.Namespace, window: Window) -> Dataset:
    from fleetwatch.report.dataset import fetch
    from fleetwatch.report.promapi import PrometheusClient
    from tqdm import tqdm

    token = args.bearer_token_file.read_text().strip() if args.bearer_token_file else None
    with tqdm(
        desc="querying",
        unit="req",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
    ) as bar:
        async with PrometheusClient(
            url=args.prometheus_url,
            bearer_token=token,
            concurrency=args.concurrency,
            retries=args.retries,
            timeout_s=args.query_timeout,
            progress=bar,
        ) as client:
            dataset = await fetch(client, window, batch_nodes=args.batch_nodes)
            log.info("read the store", extra={"bytes": client.bytes_fetched})
            return dataset


def run(args: argparse.Namespace) -> int:
    """Pull (or load) the data, analyse it, write the report."""
    from fleetwatch.report import render
    from fleetwatch.report.analysis import analyse
    from fleetwatch.report.dataset import load_snapshot, save_snapshot
    from fleetwatch.report.promapi import PrometheusAuthError, PrometheusUnreachable, QueryError

    try:
        if args.from_snapshot:
            dataset = load_snapshot(args.from_snapshot)
        elif not args.prometheus_url:
            log.error("report: give --prometheus-url or --from-snapshot")
            return 1
        else:
            started = time.monotonic()
            dataset = asyncio.run(_pull(args, _window(args)))
            log.info("queried Prometheus", extra={"seconds": round(time.monotonic() - started, 2)})
    except (PrometheusUnreachable, PrometheusAuthError, QueryError, ValueError) as exc:
        log.error("report: %s", exc)
        return 1
    if args.save_snapshot:
        save_snapshot(dataset, args.save_snapshot)
    for name, problem in sorted(dataset.problems.items()):
        log.warning("report: %s not computed: %s", name, problem, extra={"query": name})
    for name, parts in sorted(dataset.missing.items()):
        for part in parts:
            log.warning("report: %s missing data: %s", name, part, extra={"query": name})
    report = analyse(dataset)
    render.write(report, args.out)
    log.info("report written", extra={"out": str(args.out), "actions": len(report.actions)})
    if not dataset.frames:
        log.error("report: nothing could be computed for the window; see the report's notes")
        return 1
    return 0
