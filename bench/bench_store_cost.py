"""What one simulated node's fleetwatch series cost a real Prometheus (Debian 2.42).

Starts `fleetwatch export --simulate SCENARIO` (the full profile, and the lean one with
`fleetwatch.exporter.settings.LEAN_PROFILE_FLAGS`) and, for each, a Prometheus that scrapes
it every 5 s (the shipped interval) as `--copies` nodes (one target per `node` label, so
the head holds that many nodes' series and the per-series figure stands clear of the Go
runtime's noise), plus a baseline Prometheus that scrapes only itself. Every Prometheus also
scrapes itself, so the figures come from its own metrics, read through its query API:

- head series (`prometheus_tsdb_head_series`) and samples appended per second
  (`rate(prometheus_tsdb_head_samples_appended_total[1m])`), per node after the baseline's
  are taken away;
- memory: `process_resident_memory_bytes` and `go_memstats_heap_inuse_bytes`, and bytes
  per series = (heap in use - the baseline's) / (head series - the baseline's);
- scrape size: `scrape_samples_scraped` of one node and the `/metrics` body, plain and gzip.

The head chunk of a series holds 120 samples (10 minutes at 5 s) before it is cut and
memory-mapped; the head block spans 2 h before compaction. A run shorter than 10 minutes
measures a head whose chunks are all still open; the figures printed each minute show how
the heap moves as chunks are cut. Prints figures; asserts nothing.

Run: .venv/bin/python bench/bench_store_cost.py [--minutes 12] [--copies 10]
[--scenario dgx-h100]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetwatch.exporter.settings import LEAN_PROFILE_FLAGS
from fleetwatch.sim import loopback_servers as servers

SCRAPE_INTERVAL = "5s"
MIB = 1024 * 1024


def query(prom: servers.Server, expr: str) -> float:
    """The single value of an instant query against Prometheus' own series (NaN if none)."""
    url = f"{prom.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    result = json.loads(servers.http_get(url))["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


@contextlib.contextmanager
def store(workdir: Path, exporter: str | None, copies: int) -> Iterator[servers.Server]:
    """A Prometheus scraping itself and, when given, `exporter` as `copies` nodes."""
    port = servers.free_port()
    configs: list[dict[str, Any]] = [
        {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
    ]
    if exporter is not None:
        configs.append(
            {
                "job_name": "fleetwatch",
                "static_configs": [
                    {"targets": [exporter], "labels": {"node": f"node-{i:03d}"}}
                    for i in range(copies)
                ],
            }
        )
    with servers.prometheus(
        workdir, scrape_configs=configs, scrape_interval=SCRAPE_INTERVAL, port=port
    ) as prom:
        yield prom


def figures(prom: servers.Server) -> dict[str, float]:
    """Prometheus' own figures, from its self-scrape."""
    own = 'job="prometheus"'
    return {
        "series": query(prom, f"prometheus_tsdb_head_series{{{own}}}"),
        "samples_s": query(prom, f"rate(prometheus_tsdb_head_samples_appended_total{{{own}}}[1m])"),
        "rss": query(prom, f"process_resident_memory_bytes{{{own}}}"),
        "heap": query(prom, f"go_memstats_heap_inuse_bytes{{{own}}}"),
        "chunks": query(prom, f"prometheus_tsdb_head_chunks{{{own}}}"),
        "scraped": query(prom, 'max(scrape_samples_scraped{job="fleetwatch"})'),
    }


def body_sizes(exporter: servers.Server) -> tuple[int, int]:
    """The `/metrics` body in bytes, plain and as served gzip."""
    plain = servers.http_get(f"{exporter.url}/metrics")
    zipped = servers.http_get(f"{exporter.url}/metrics", headers={"Accept-Encoding": "gzip"})
    if zipped[:2] != b"\x1f\x8b":  # served plain: say what gzip would make of it
        zipped = gzip.compress(zipped)
    return len(plain), len(zipped)


def run(scenario: str, minutes: float, copies: int, profiles: Sequence[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        base = stack.enter_context(store(root / "baseline", None, copies))
        stores: dict[str, servers.Server] = {}
        sizes: dict[str, tuple[int, int]] = {}
        for profile in profiles:
            args = LEAN_PROFILE_FLAGS if profile == "lean" else ()
            exporter = stack.enter_context(
                servers.fleetwatch_export(root / f"export-{profile}", simulate=scenario, args=args)
            )
            sizes[profile] = body_sizes(exporter)
            stores[profile] = stack.enter_context(
                store(root / f"prom-{profile}", exporter.address, copies)
            )
        print(
            f"{scenario}: {copies} simulated nodes per Prometheus, scrape every "
            f"{SCRAPE_INTERVAL}, {minutes:g} min; Prometheus 2.42 (Debian)"
        )
        deadline = time.monotonic() + minutes * 60
        minute = 0
        while True:
            # One row a minute shows the head growing; the last one at the deadline.
            time.sleep(max(0.0, min(deadline, time.monotonic() + 60) - time.monotonic()))
            minute += 1
            rows = {"baseline": figures(base)} | {p: figures(s) for p, s in stores.items()}
            print(
                f"  t={minute:>3} min  "
                + "  ".join(
                    f"{name}: {f['series']:.0f} series, heap {f['heap'] / MIB:.1f} MiB, "
                    f"rss {f['rss'] / MIB:.1f} MiB"
                    for name, f in rows.items()
                ),
                flush=True,
            )
            if time.monotonic() >= deadline:
                break
        b = rows["baseline"]
        print(f"baseline (itself only): {b['series']:.0f} series, "
              f"{b['samples_s']:.0f} samples/s, heap {b['heap'] / MIB:.1f} MiB, "
              f"rss {b['rss'] / MIB:.1f} MiB")  # fmt: skip
        for profile in profiles:
            f = rows[profile]
            series = (f["series"] - b["series"]) / copies
            samples = (f["samples_s"] - b["samples_s"]) / copies
            heap = (f["heap"] - b["heap"]) / copies
            rss = (f["rss"] - b["rss"]) / copies
            plain, zipped = sizes[profile]
            print(
                f"{profile}: per node {series:.0f} head series ({f['scraped']:.0f} samples "
                f"a scrape), {samples:.0f} samples/s, heap {heap / 1024:.0f} KiB "
                f"({heap / series:.0f} bytes/series), rss {rss / 1024:.0f} KiB "
                f"({rss / series:.0f} bytes/series); /metrics {plain / 1024:.1f} KiB plain, "
                f"{zipped / 1024:.1f} KiB gzip; head chunks {f['chunks']:.0f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="dgx-h100")
    parser.add_argument("--minutes", type=float, default=12.0)
    parser.add_argument("--copies", type=int, default=10, help="nodes each Prometheus scrapes")
    parser.add_argument(
        "--profile", action="append", choices=("full", "lean"), help="default: both"
    )
    args = parser.parse_args()
    run(args.scenario, args.minutes, args.copies, args.profile or ("full", "lean"))


if __name__ == "__main__":
    main()
