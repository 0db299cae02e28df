"""Exporter overhead on a simulated DGX H100: series, CPU per cycle, render cost, scrape
latency under 50 concurrent scrapers (also while a collector hangs), and RSS over time.

Prints figures; asserts nothing. Run: `.venv/bin/python bench/bench_exporter.py`
(`--rss-minutes 10` for the full RSS figure; the default keeps it short).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector as RegistryCollector
from prometheus_client.registry import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors import COLLECTORS
from collectors.base import CollectorContext
from collectors.sim.fake_nvml import FakeNvml
from collectors.sim.scenario import load_scenario
from collectors.sim.sysfs_tree import SimulatedSysfs
from collectors.sim.world import SimulatedNode, WallClock
from exporter.cli import build_parser
from exporter.export import SIM_BIN, close_collectors, create_collectors
from exporter.render import Renderer
from exporter.settings import ExportSettings
from tests import servers


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cycle_costs(cycles: int) -> None:
    """CPU per full collection cycle (all default collectors) and render cost per series."""
    node = SimulatedNode(scenario=load_scenario("dgx-h100"), clock=WallClock())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sysfs = SimulatedSysfs(node=node, root=root)
        sysfs.write()
        context = CollectorContext(
            sysfs_root=root, nvml=FakeNvml(node=node), simulation=node, tool_path=str(SIM_BIN)
        )
        args = build_parser().parse_args(["export", "--simulate=dgx-h100"])
        settings = ExportSettings.from_args(args, tuple(s.name for s in COLLECTORS))
        collectors = create_collectors(context, settings, args)
        renderers = {name: Renderer() for name in collectors}
        per_collector: dict[str, list[float]] = {name: [] for name in collectors}
        totals: list[float] = []
        series = 0
        families = []
        try:
            for _ in range(cycles):
                sysfs.write()
                total = 0.0
                families = []
                for name, collector in collectors.items():
                    start = time.thread_time()
                    got = list(collector.collect())
                    renderers[name].render(got)
                    spent = time.thread_time() - start
                    per_collector[name].append(spent)
                    total += spent
                    families.extend(got)
                totals.append(total)
                series = sum(len(f.samples) for f in families)
        finally:
            close_collectors(collectors)

    class Fixed(RegistryCollector):
        def collect(self):  # type: ignore[no-untyped-def]
            return families

    registry = CollectorRegistry()
    registry.register(Fixed())
    renderer = Renderer()
    renderer.render(families)
    rounds = 50
    start = time.perf_counter()
    for _ in range(rounds):
        ours = renderer.render(families)
    ours_us = (time.perf_counter() - start) / rounds / series * 1e6
    start = time.perf_counter()
    for _ in range(rounds):
        reference = generate_latest(registry)
    reference_us = (time.perf_counter() - start) / rounds / series * 1e6
    assert ours == reference, "renderer output differs from generate_latest"

    print(f"series (dgx-h100, default collectors): {series}")
    print(
        f"CPU per collection cycle: median {statistics.median(totals) * 1e3:.2f} ms, "
        f"p90 {percentile(totals, 0.9) * 1e3:.2f} ms over {cycles} cycles"
    )
    for name, values in per_collector.items():
        print(f"  {name:<14} median {statistics.median(values) * 1e3:.2f} ms")
    print(
        f"render per series: fleetwatch Renderer {ours_us:.2f} us, "
        f"prometheus_client generate_latest {reference_us:.2f} us (identical output)"
    )


async def scrape_load(url: str, *, scrapers: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    headers = {"Accept-Encoding": "gzip"}
    async with aiohttp.ClientSession() as session:

        async def scraper() -> None:
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                async with session.get(url, headers=headers) as response:
                    await response.read()
                    assert response.status == 200
                latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(scraper() for _ in range(scrapers)))
    return latencies


def scrape_latency(label: str, simulate: str, workdir: Path, seconds: float) -> None:
    with servers.fleetwatch_export(workdir, simulate=simulate) as exporter:
        latencies = asyncio.run(
            scrape_load(exporter.url + "/metrics", scrapers=50, seconds=seconds)
        )
        print(
            f"/metrics latency, 50 concurrent scrapers, {label}: "
            f"p50 {percentile(latencies, 0.5) * 1e3:.2f} ms, "
            f"p99 {percentile(latencies, 0.99) * 1e3:.2f} ms ({len(latencies)} scrapes "
            f"in {seconds:g}s)"
        )


def hung_scenario(workdir: Path) -> str:
    data = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "collectors/sim/scenarios/dgx-h100.yaml").read_text()
    )
    data["faults"] = [
        {"at": 0, "kind": "hang", "call": "nvmlDeviceGetFieldValues", "seconds": 3600}
    ]
    path = workdir / "hung.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def rss_over_time(workdir: Path, minutes: float) -> None:
    with servers.fleetwatch_export(workdir, simulate="dgx-h100") as exporter:
        pid = exporter.process.pid
        end = time.monotonic() + minutes * 60
        while time.monotonic() < end:
            servers.http_get(exporter.url + "/metrics")
            time.sleep(5)
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = int(
            next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]
        )
        print(f"RSS after {minutes:g} min (scraped every 5 s): {rss_kb / 1024:.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--load-seconds", type=float, default=10.0)
    parser.add_argument("--rss-minutes", type=float, default=1.0)
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {len(__import__('os').sched_getaffinity(0))} cores"
    )
    cycle_costs(args.cycles)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        scrape_latency("healthy", "dgx-h100", workdir / "healthy", args.load_seconds)
        scrape_latency(
            "gpu collector hung in nvmlDeviceGetFieldValues",
            hung_scenario(workdir),
            workdir / "hung",
            args.load_seconds,
        )
        rss_over_time(workdir / "rss", args.rss_minutes)


if __name__ == "__main__":
    main()
