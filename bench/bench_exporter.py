"""Exporter overhead: series, CPU per cycle, render cost, scrape latency under 50 concurrent
scrapers (also while a collector hangs), whole-process CPU per exported series against
node_exporter's in the same run, and RSS over time with and without checkpoint mounts.

Prints figures; asserts nothing. Run: `.venv/bin/python bench/bench_exporter.py`
(`--rss-minutes 60` for the full RSS figure; the default keeps it short; `--only cpu`
and the like run one section). The `cpu` and `rss` sections run the exporter on NVIDIA's
mock NVML (`FLEETWATCH_NVML_MOCK`) with a real-shaped sysfs tree (`bench/exporter_setups.py`),
or under `--simulate dgx-h100` with `--simulate`; `--baseline DIR` runs another tree's code
beside it in the same window. The cycle, render and latency sections use the simulated
dgx-h100. The scrape load comes from Debian's `wrk` (a C load generator, so the client does
not compete with the exporter for the GIL-bound CPU it measures).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import platform
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import yaml
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector as RegistryCollector
from prometheus_client.registry import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.exporter_setups import (
    NAMED_THREADS,
    exporter_argv,
    moving_tree,
    python_threads,
    thread_cpu,
    wrapped_exporter,
)
from fleetwatch.cli import build_parser
from fleetwatch.collectors import COLLECTORS
from fleetwatch.collectors.families import SeriesFamily, series_count
from fleetwatch.exporter.export import close_collectors, create_collectors
from fleetwatch.exporter.render import Renderer
from fleetwatch.exporter.settings import ExportSettings
from fleetwatch.sim import loopback_servers as servers
from fleetwatch.sim.exporter_hardware import simulated_hardware
from fleetwatch.sim.scenario import load_scenario
from fleetwatch.sim.sysfs_tree import SimulatedSysfs
from fleetwatch.sim.world import SimulatedNode, WallClock
from testbed.mounts import nfs_node, write_procfs
from testbed.nvml_timing import timed
from testbed.tool_servers import node_exporter


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class SimulationCost(NamedTuple):
    """What simulating the hardware costs the exporter's process (medians, CPU seconds)."""

    refresh: float  # one rewrite of the simulated sysfs tree (the exporter does one a second)
    fake_nvml: float  # the time inside the simulated NVML during one collection cycle


def cycle_costs(cycles: int) -> SimulationCost:
    """CPU per full collection cycle (all default collectors) and render cost per series;
    returns what the simulation itself costs, for the whole-process figure."""
    node = SimulatedNode(scenario=load_scenario("dgx-h100"), clock=WallClock())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        in_fake = [0.0]

        def record(_call: str, seconds: float) -> None:
            in_fake[0] += seconds

        args = build_parser().parse_args(["export", "--simulate=dgx-h100"])
        hardware = simulated_hardware(node, root, ExportSettings.from_args(args, COLLECTORS))
        context = replace(hardware.context, nvml=timed(hardware.context.nvml, record))
        collectors = create_collectors(context, hardware.settings)
        refresh = hardware.refresh
        assert refresh is not None
        renderers = {name: Renderer() for name in collectors}
        per_collector: dict[str, list[float]] = {name: [] for name in collectors}
        totals: list[float] = []
        without_fake: list[float] = []
        fake: list[float] = []
        series = 0
        families: list[SeriesFamily] = []
        try:
            for _ in range(cycles):
                refresh()
                total = 0.0
                in_fake[0] = 0.0
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
                without_fake.append(total - in_fake[0])
                fake.append(in_fake[0])
                series = series_count(families)
        finally:
            close_collectors(collectors)
        refresh_cost = _refresh_cost(node, root / "refresh")

    class Fixed(RegistryCollector):
        def collect(self):  # type: ignore[no-untyped-def]
            return [family.to_metric() for family in families]

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
        f"p90 {percentile(totals, 0.9) * 1e3:.2f} ms over {cycles} cycles; without the "
        f"time inside the simulated NVML (an upper bound: the timing wrapper stays in): "
        f"median {statistics.median(without_fake) * 1e3:.2f} ms"
    )
    for name, values in per_collector.items():
        print(f"  {name:<14} median {statistics.median(values) * 1e3:.2f} ms")
    print(
        f"render per series: fleetwatch Renderer {ours_us:.2f} us, "
        f"prometheus_client generate_latest {reference_us:.2f} us (identical output)"
    )
    print(f"simulated sysfs tree rewrite: median {refresh_cost * 1e3:.2f} ms")
    return SimulationCost(refresh=refresh_cost, fake_nvml=statistics.median(fake))


def _refresh_cost(node: SimulatedNode, root: Path) -> float:
    """Median CPU of one rewrite of the simulated tree, rewrites one collection interval
    apart as the exporter does them."""
    sysfs = SimulatedSysfs(node=node, root=root)
    start_t = node.now()
    sysfs.write(start_t)
    costs = []
    for n in range(1, 21):
        start = time.thread_time()
        sysfs.write(start_t + n * DEFAULT_INTERVAL_SECONDS)
        costs.append(time.thread_time() - start)
    sysfs.close()
    return statistics.median(costs)


WRK = "/usr/bin/wrk"
DEFAULT_INTERVAL_SECONDS = 5.0  # `fleetwatch export --collector.interval` default
# Each wrk connection is one scraper; `delay` paces it (ms between its scrapes).
SCRAPER_LUA = """
wrk.headers["Accept-Encoding"] = "gzip"
function delay()
  return {delay_ms}
end
"""


def wrk_latency(url: str, *, scrapers: int, seconds: float, delay_ms: int, workdir: Path) -> str:
    """p50/p99 and request rate from wrk, scrapers paced `delay_ms` apart (0: back to back)."""
    script = workdir / f"scraper-{delay_ms}.lua"
    script.write_text(SCRAPER_LUA.format(delay_ms=delay_ms))
    output = subprocess.run(
        [WRK, "-t2", f"-c{scrapers}", f"-d{seconds:g}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    ).stdout
    found = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", output, re.MULTILINE))
    rate = re.search(r"^Requests/sec:\s+(\S+)$", output, re.MULTILINE)
    return f"p50 {found['50']}, p99 {found['99']}, {rate.group(1) if rate else '?'} scrapes/s"


def scrape_latency(label: str, simulate: str, workdir: Path, seconds: float) -> None:
    if not Path(WRK).exists():
        print(f"/metrics latency: skipped, {WRK} missing (apt-get install wrk)")
        return
    workdir.mkdir(parents=True, exist_ok=True)
    with servers.fleetwatch_export(workdir, simulate=simulate) as exporter:
        url = exporter.url + "/metrics"
        paced = wrk_latency(url, scrapers=50, seconds=seconds, delay_ms=100, workdir=workdir)
        saturated = wrk_latency(url, scrapers=50, seconds=seconds, delay_ms=0, workdir=workdir)
    print(f"/metrics, 50 concurrent scrapers, {label}:")
    print(f"  each scraping every 100 ms: {paced}")
    print(f"  back to back (saturation):  {saturated}")


def hung_scenario(workdir: Path) -> str:
    data = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "sim/scenarios/dgx-h100.yaml").read_text()
    )
    data["faults"] = [
        {"at": 0, "kind": "hang", "call": "nvmlDeviceGetFieldValues", "seconds": 3600}
    ]
    path = workdir / "hung.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def rss_over_time(
    workdir: Path,
    minutes: float,
    *,
    simulate: bool,
    baseline: Path | None = None,
    driver: bool = False,
) -> None:
    """Resident size of the exporter, and of its mount helper, after `minutes` of scrapes
    every 5 s: on a GPU node without checkpoint mounts and on one with 50 NFS mounts
    (`testbed.mounts.nfs_node` as `--path.procfs`; the mount points do not exist here, so
    each statvfs fails fast, counted), all running side by side (with `baseline`, that
    code's two as well). Prints every minute, so a long run shows growth."""
    mountinfo, mountstats = nfs_node(50)
    procfs = write_procfs(workdir / "proc", mountinfo=mountinfo, mountstats=mountstats)
    codes: dict[str, Path | None] = {"": None}
    if baseline is not None:
        codes["baseline "] = baseline
    with contextlib.ExitStack() as stack:
        tree = stack.enter_context(moving_tree(workdir / "sys", enabled=not simulate))
        running: dict[str, servers.Server] = {}
        for label, code in codes.items():
            for mounts, fixture in (("no checkpoint mounts", None), ("50 NFS mounts", procfs)):
                name = f"{label}{mounts}"
                running[name] = stack.enter_context(
                    _exporter(
                        workdir / name.replace(" ", "-"),
                        simulate=simulate,
                        sysfs=tree,
                        code=code,
                        procfs=fixture,
                        driver=driver,
                    )
                )
        start = time.monotonic()
        next_print = 60.0
        while (elapsed := time.monotonic() - start) < minutes * 60:
            for server in running.values():
                servers.http_get(server.url + "/metrics")
            if elapsed >= next_print or elapsed + 5 >= minutes * 60:
                next_print += 60
                figures = ", ".join(
                    _rss_figure(name, server.process.pid) for name, server in running.items()
                )
                print(
                    f"RSS after {elapsed / 60:.0f} min (load {os.getloadavg()[0]:.1f}): {figures}",
                    flush=True,
                )
            time.sleep(5)


def _rss_figure(name: str, pid: int) -> str:
    """`name: RSS` of the exporter, and with its helper `+ helper RSS` and the two together
    counting each physical page once (`_distinct_mib`: the helper maps the same libpython
    and shared libraries as the exporter, which an RSS sum counts twice and the container's
    memory cgroup charges once)."""
    children = _children(pid)
    figure = f"{name}: {_rss_mib(pid):.1f} MiB"
    figure += "".join(f" + helper {_rss_mib(child):.1f} MiB" for child in children)
    if children:
        figure += f" (together, each page once: {_distinct_mib([pid, *children]):.1f} MiB)"
    return figure


PAGE = os.sysconf("SC_PAGE_SIZE")


def _distinct_mib(pids: list[int]) -> float:
    """Resident memory of `pids` together, each physical page counted once: the page frames
    of every present page in `/proc/PID/pagemap` (frame numbers need root; as a user every
    frame reads 0 and this is not a measure)."""
    frames: set[int] = set()
    for pid in pids:
        with (
            Path(f"/proc/{pid}/maps").open() as maps,
            Path(f"/proc/{pid}/pagemap").open("rb") as pagemap,
        ):
            for line in maps:
                start, end = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
                if start >= 1 << 47:  # [vsyscall]: not in the pagemap
                    continue
                pagemap.seek(start // PAGE * 8)
                for (entry,) in struct.iter_unpack("<Q", pagemap.read((end - start) // PAGE * 8)):
                    if entry >> 63:  # present
                        frames.add(entry & ((1 << 55) - 1))
    return len(frames) * PAGE / 2**20


def _children(pid: int) -> list[int]:
    """The process's child processes (the mount helper), from /proc."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _series(url: str, prefix: str, *, gzipped: bool = False) -> int:
    """Samples in one scrape whose family name starts with `prefix`; with `gzipped`, asked
    with `Accept-Encoding: gzip` as Prometheus asks, so the exporter compresses it."""
    asked = {"Accept-Encoding": "gzip"} if gzipped else None
    body = servers.http_get(url + "/metrics", headers=asked)
    text = (gzip.decompress(body) if gzipped else body).decode()
    return sum(
        len(family.samples)
        for family in text_string_to_metric_families(text)
        if family.name.startswith(prefix)
    )


def cpu_per_series(
    workdir: Path,
    seconds: float,
    simulation: SimulationCost | None,
    *,
    simulate: bool,
    baseline: Path | None = None,
    driver: bool = False,
    gzipped: bool = False,
) -> None:
    """Whole-process CPU per exported series: the exporter (every default collector) against
    node_exporter (its default collectors on this machine's /proc and /sys), both running and
    scraped every 5 s in the same window.

    Without `simulate` the exporter runs on NVIDIA's mock NVML with a real-shaped sysfs tree
    that this process moves on (`exporter_setups`): its process runs only the exporter. With
    `simulate` it runs `--simulate dgx-h100`, whose process also runs the simulation (a tree
    rewrite an interval, a Python NVML); their cost, measured in `cycle_costs`, is printed and
    subtracted for a second figure, an estimate of the exporter on hardware.

    `baseline` (a folder holding another tree's `fleetwatch` package) runs that code as a
    third process in the same window and under the same wrapper, on a tree of its own moved
    the same way, so a change is measured before and after under the same load and the same
    harness.

    With `driver` (a GPU machine) the exporter reads this machine's NVIDIA driver instead of
    the mock, with the same tree. With `gzipped` every scrape asks for gzip, as Prometheus
    does, so each exporter also pays for compressing what it serves.

    The exporter runs under `NAMED_THREADS`, so the CPU of the threads Python did not start
    (on the mock, its Go runtime, which polls while a call blocks in it) is printed apart,
    with the ratio without it."""
    with contextlib.ExitStack() as stack:
        tree = stack.enter_context(moving_tree(workdir / "sys", enabled=not simulate))
        names = workdir / "fw-threads.json"
        fw = stack.enter_context(
            _exporter(
                workdir / "fw", simulate=simulate, sysfs=tree, thread_names=names, driver=driver
            )
        )
        ne = stack.enter_context(node_exporter(workdir / "ne", sysfs=Path("/sys"), collectors=None))
        procs = {"fleetwatch": (fw, "fleetwatch_"), "node_exporter": (ne, "node_")}
        named = {"fleetwatch": names}
        if baseline is not None:  # under the same wrapper: the same harness cost in both
            named["baseline"] = workdir / "base-threads.json"
            # A tree of its own, moved the same way: sharing one, whichever exporter read
            # it first after each rewrite paid more (its InfiniBand thread 13-23 % more
            # than the same code's in the other place).
            base_tree = moving_tree(workdir / "base-sys", enabled=not simulate)
            base = _exporter(
                workdir / "base",
                simulate=simulate,
                sysfs=stack.enter_context(base_tree),
                code=baseline,
                thread_names=named["baseline"],
                driver=driver,
            )
            procs["baseline"] = (stack.enter_context(base), "fleetwatch_")
        load = os.getloadavg()[0]
        threads_before = {name: thread_cpu(procs[name][0].process.pid) for name in named}
        start = {name: _cpu_seconds(server.process.pid) for name, (server, _) in procs.items()}
        end_time = time.monotonic() + seconds
        while time.monotonic() < end_time:
            series = {
                name: _series(server.url, p, gzipped=gzipped) for name, (server, p) in procs.items()
            }
            time.sleep(5)
        spent = {
            name: _cpu_seconds(server.process.pid) - start[name]
            for name, (server, _) in procs.items()
        }
        threads = {name: thread_cpu(procs[name][0].process.pid) for name in named}
        pythons = {
            name: python_threads(file, procs[name][0].process.pid) for name, file in named.items()
        }
        foreign = {
            name: sum(
                cpu - threads_before[name].get(tid, 0.0)
                for tid, cpu in threads[name].items()
                if tid not in pythons[name]
            )
            for name in named
        }
        rss = {name: _rss_mib(server.process.pid) for name, (server, _) in procs.items()}
    per_series = {name: spent[name] / series[name] * 1e6 / seconds for name in procs}
    nvml = "this machine's NVIDIA driver" if driver else "the mock NVML (h100)"
    print(
        f"exporter on {'--simulate dgx-h100' if simulate else nvml}, "
        f"scraped {'with gzip' if gzipped else 'plain'}, load "
        f"average {load:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    for name, (_, prefix) in procs.items():
        print(
            f"{name}: {spent[name]:.2f} CPU s in {seconds:g} s for {series[name]} "
            f"`{prefix}` series = {per_series[name]:.2f} CPU µs per series per second, "
            f"RSS at the end {rss[name]:.1f} MiB"
        )
    if baseline is not None:
        print(
            f"baseline per series {per_series['baseline'] / per_series['node_exporter']:.2f} "
            "of node_exporter's"
        )
    print(
        f"CPU ratio {spent['fleetwatch'] / spent['node_exporter']:.2f}, series ratio "
        f"{series['fleetwatch'] / series['node_exporter']:.2f}, per series "
        f"{per_series['fleetwatch'] / per_series['node_exporter']:.2f}"
    )
    if not simulate:
        for name in named:
            net = (spent[name] - foreign[name]) / series[name] * 1e6 / seconds
            print(
                f"{name}: of which threads Python did not start (the NVML library's own; the "
                f"mock's Go runtime): {foreign[name]:.3f} CPU s; without them per series "
                f"{net / per_series['node_exporter']:.2f} of node_exporter's"
            )
            by_thread = sorted(
                (
                    (cpu - threads_before[name].get(tid, 0.0), pythons[name][tid])
                    for tid, cpu in threads[name].items()
                    if tid in pythons[name]
                ),
                reverse=True,
            )
            print(f"{name}'s threads: " + ", ".join(f"{t} {cpu:.3f}" for cpu, t in by_thread))
    if not simulate or simulation is None:
        return
    simulated = seconds / DEFAULT_INTERVAL_SECONDS * simulation.refresh + (
        seconds / DEFAULT_INTERVAL_SECONDS * simulation.fake_nvml
    )
    net = (spent["fleetwatch"] - simulated) / series["fleetwatch"] * 1e6 / seconds
    print(
        f"of which simulation (tree rewrites and fake NVML, estimated): {simulated:.2f} CPU s; "
        f"without it {net:.2f} CPU µs per series per second, per series "
        f"{net / per_series['node_exporter']:.2f} of node_exporter's"
    )


@contextlib.contextmanager
def _exporter(
    workdir: Path,
    *,
    simulate: bool,
    sysfs: Path,
    code: Path | None = None,
    procfs: Path | None = None,
    thread_names: Path | None = None,
    driver: bool = False,
) -> Iterator[servers.Server]:
    """`fleetwatch export` in one of the two set-ups; with `thread_names`, run through
    `NAMED_THREADS`, which records there which threads are Python's."""
    env, args = exporter_argv(simulate=simulate, sysfs=sysfs, driver=driver)
    if procfs is not None:
        args.append(f"--path.procfs={procfs}")
    if code is not None:
        env["PYTHONPATH"] = str(code)  # ahead of the editable install's package
    if thread_names is None:
        with servers.fleetwatch_command(
            workdir, command="export", args=args, ready_path="/readyz", env=env
        ) as server:
            yield server
        return
    prefix = [sys.executable, "-c", NAMED_THREADS, str(thread_names)]
    with wrapped_exporter(prefix, args, workdir=workdir, env=env) as server:
        yield server


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return (
        int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
        / 1024
    )


SECTIONS = ("cycles", "latency", "cpu", "rss")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--load-seconds", type=float, default=10.0)
    parser.add_argument("--rss-minutes", type=float, default=1.0)
    parser.add_argument("--cpu-seconds", type=float, default=90.0)
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        action="append",
        help="run these sections (cpu under --simulate runs cycles)",
    )
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="cpu section: the exporter under --simulate dgx-h100 instead of on the mock NVML "
        "(FLEETWATCH_NVML_MOCK) with a real-shaped tree",
    )
    parser.add_argument(
        "--driver",
        action="store_true",
        help="cpu and rss sections: the exporter on this machine's NVIDIA driver (a GPU "
        "machine) instead of the mock NVML, with the same real-shaped tree",
    )
    parser.add_argument(
        "--gzip",
        action="store_true",
        help="cpu section: scrape with `Accept-Encoding: gzip`, as Prometheus does (each "
        "exporter then compresses what it serves)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="cpu section: also run the fleetwatch package in this folder (another tree's "
        "code, e.g. the commit before a change) side by side",
    )
    args = parser.parse_args()
    sections = set(args.only or SECTIONS)
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {len(os.sched_getaffinity(0))} cores"
    )
    wants_costs = "cycles" in sections or ("cpu" in sections and args.simulate)
    simulation = cycle_costs(args.cycles) if wants_costs else None
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if "latency" in sections:
            scrape_latency("healthy", "dgx-h100", workdir / "healthy", args.load_seconds)
            scrape_latency(
                "gpu collector hung in nvmlDeviceGetFieldValues",
                hung_scenario(workdir),
                workdir / "hung",
                args.load_seconds,
            )
        if "cpu" in sections:
            cpu_per_series(
                workdir / "cpu",
                args.cpu_seconds,
                simulation,
                simulate=args.simulate,
                baseline=args.baseline,
                driver=args.driver,
                gzipped=args.gzip,
            )
        if "rss" in sections:
            rss_over_time(
                workdir / "rss",
                args.rss_minutes,
                simulate=args.simulate,
                baseline=args.baseline,
                driver=args.driver,
            )


if __name__ == "__main__":
    main()
