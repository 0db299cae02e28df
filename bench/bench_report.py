"""Benchmark `fleetwatch report` on a backfilled simulated fleet; prints figures.

Generates the fleet's history (sim/fleet.py) in a child process, backfills it with
`promtool tsdb create-blocks-from openmetrics`, starts a real Prometheus on the blocks,
then times in this process: the query phase (fetch over the HTTP API) and the analysis
phase (findings + HTML/Markdown/CSV). Peak memory is this process's max RSS, which
covers both phases (generation runs in a child and is not counted). Backfill time is
printed but is not part of the report's figure.

    .venv/bin/python bench/bench_report.py --nodes 1000 --hours 24
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetwatch.report import render
from fleetwatch.report.analysis import analyse
from fleetwatch.report.dataset import Window, fetch
from fleetwatch.report.policy import shipped_policy
from fleetwatch.report.promapi import PrometheusClient
from fleetwatch.sim.fleet import FleetSpec, write_openmetrics
from fleetwatch.sim.servers import prometheus

from testbed.servers import PROMTOOL


def spec_from(args: argparse.Namespace) -> FleetSpec:
    return FleetSpec(
        nodes=args.nodes,
        gpus_per_node=8,
        ib_ports_per_node=args.ib_ports,
        hours=args.hours,
        step_seconds=args.step,
    )


def generate(args: argparse.Namespace) -> None:
    write_openmetrics(spec_from(args), Path(args.file))


async def pull(url: str, window: Window) -> object:
    async with PrometheusClient(url=url, concurrency=4, timeout_s=600) as client:
        return await fetch(client, window)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--step", type=int, default=60)
    parser.add_argument("--ib-ports", type=int, default=8)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--generate-only-to", dest="file", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.file:
        generate(args)
        return
    spec = spec_from(args)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root = Path(tmp)
        t0 = time.monotonic()
        subprocess.run(
            [
                sys.executable,
                __file__,
                f"--nodes={args.nodes}",
                f"--hours={args.hours}",
                f"--step={args.step}",
                f"--ib-ports={args.ib_ports}",
                f"--generate-only-to={root / 'fleet.om'}",
            ],
            check=True,
        )
        size = (root / "fleet.om").stat().st_size
        t1 = time.monotonic()
        result = subprocess.run(
            [
                PROMTOOL,
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "--max-block-duration=24h",
                str(root / "fleet.om"),
                str(root / "data"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode:
            raise SystemExit(f"backfill failed: {result.stderr}")
        (root / "fleet.om").unlink()
        t2 = time.monotonic()
        print(
            f"fleet: {spec.nodes} nodes x {spec.gpus_per_node} GPUs x {spec.hours:g} h at "
            f"{spec.step_seconds} s, {spec.ib_ports_per_node} IB ports/node"
        )
        print(
            f"generate: {t1 - t0:.1f} s ({size / 2**30:.2f} GiB OpenMetrics); "
            f"backfill: {t2 - t1:.1f} s"
        )
        with prometheus(
            root / "prom",
            scrape_configs=[],
            storage=root / "data",
            extra_args=["--storage.tsdb.retention.time=100y", "--query.timeout=10m"],
        ) as prom:
            window = Window(
                start=spec.end - spec.hours * 3600,
                end=spec.end,
                step=spec.step_seconds,
                bucket=3600,
                threshold_celsius=shipped_policy().temperature_celsius,
            )
            t3 = time.monotonic()
            dataset = asyncio.run(pull(prom.url, window))
            t4 = time.monotonic()
            report = analyse(dataset)  # type: ignore[arg-type]
            render.write(report, root / "out")
            t5 = time.monotonic()
        points = sum(len(f) for f in report.dataset.frames.values())
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"query: {t4 - t3:.1f} s ({points} points in {len(report.dataset.frames)} frames)")
        print(f"analysis+render: {t5 - t4:.1f} s; actions: {len(report.actions)}")
        print(f"report total: {t5 - t3:.1f} s; peak RSS: {peak:.2f} GiB")


if __name__ == "__main__":
    main()
