"""Cost of one InfiniBand collection against Debian's node_exporter on the same trees.

For trees of 8, 16 and 32 ports (simulated DGX-like nodes), starts node_exporter with only
its infiniband collector on the tree, scrapes it repeatedly and reads its own
`node_scrape_collector_duration_seconds{collector="infiniband"}`; in the same run, times
our collector's `collect()` (read + map, no rendering, as node_exporter's figure has no
encoding either) and prints medians and the ratio. Also prints what rendering the result
to exposition text adds, the cost of a re-discovery (what a hotplug event triggers), and
of the rediscover timer's check that finds nothing changed (what it costs every minute).

Rounds alternate one node_exporter scrape and one collection of ours. Ours comes a
millisecond or two after node_exporter read the same files, so it finds them warm: on the
2-core VM a `pread` of a small file costs 0.3 µs warm and 1.3-1.9 µs after 50 ms or more
idle, every file alike (the kernel's data of each file is what has gone cold), so these
rounds flatter ours; the as-run figure below is the one that counts. Before each round the
tree moves 10 simulated seconds on (untimed, files rewritten in place): traffic counters
advance on every port and one link keeps erroring, like a busy host with one bad cable.

Our collector reads the driver's hw_counters at most every
`--collector.infiniband.hw-stats.interval` (30 s) and the port counters every collection
(5 s by default), so one collection in six reads everything. The collector's clock moves
5 s a round, as in production, and the figures say both: the median of the collections
that read the port counters alone, of those that also read hw_counters, and the average
per collection over the 30 s cycle, which is what the ratio against node_exporter uses.

Then, as run: `fleetwatch export` with only its infiniband collector (every 1 s) and
node_exporter read the same moving 16-port tree; the bench scrapes both once a second and
compares what each reports about itself: our `fleetwatch_collector_duration_seconds
{collector="infiniband"}` (the run's wall time on its worker thread: collect and render)
against node_exporter's `node_scrape_collector_duration_seconds{collector="infiniband"}`.

Run: .venv/bin/python bench/bench_infiniband.py [--rounds N] [--as-run-seconds S]
[--sysfs /sys] (`--sysfs` measures a real host's tree instead of the simulated ones.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.collectors import COLLECTORS
from fleetwatch.collectors.families import series_count
from fleetwatch.collectors.infiniband import InfinibandCollector
from fleetwatch.collectors.sources.sysfs import InfinibandSysfs
from fleetwatch.collectors.sources.udev import DeviceEvents
from fleetwatch.exporter.render import Renderer
from fleetwatch.sim import loopback_servers as servers
from fleetwatch.sim.loopback_servers import http_get
from fleetwatch.sim.scenario import parse_scenario
from fleetwatch.sim.sysfs_tree import SimulatedSysfs
from fleetwatch.sim.world import SimulatedNode
from testbed.clock import FixedClock
from testbed.tool_servers import node_exporter

START: float = 600.0
STEP: float = 10.0
INTERVAL: float = 5.0  # `--collector.interval` default: the collector's clock per round
HW_STATS: float = 30.0  # `--collector.infiniband.hw-stats.interval` default
PER_HW: int = round(HW_STATS / INTERVAL)  # collections per hw_counters read


def _tree(root: Path, ports: int) -> SimulatedSysfs:
    """A DGX-like tree with `ports` ports: one per HCA up to 8, then dual-port HCAs."""
    per_hca = 1 if ports <= 8 else 2
    hcas = [{"device": f"mlx5_{n}", "ports": per_hca} for n in range(ports // per_hca)]
    bad_cable = {"at": 0, "kind": "ib_errors", "device": "mlx5_0", "port": 1,
                 "error": "symbol", "per_second": 0.5}  # fmt: skip
    data = {"gpus": 8, "gpu_model": "NVIDIA H100 80GB HBM3", "nvlinks_per_gpu": 18,
            "infiniband": hcas, "faults": [bad_cable]}  # fmt: skip
    node = SimulatedNode(
        scenario=parse_scenario(data, source="bench", name=f"{ports}-ports"),
        clock=FixedClock(START),
    )
    tree = SimulatedSysfs(node=node, root=root)
    tree.write()
    return tree


def _reported_ms(url: str, series: str) -> float:
    """One scrape; the exporter's own `series{collector="infiniband"}`, in ms."""
    for family in text_string_to_metric_families(http_get(url + "/metrics").decode()):
        for sample in family.samples:
            if sample.name == series and sample.labels.get("collector") == "infiniband":
                return sample.value * 1000
    raise RuntimeError(f"{url} reported no infiniband {series}")


def _node_exporter_ms(url: str) -> float:
    """One scrape; node_exporter's own duration of its infiniband collector, in ms."""
    return _reported_ms(url, "node_scrape_collector_duration_seconds")


class Result(NamedTuple):
    """Medians in ms, for one tree (`ours` is the average per collection over a
    hw_counters interval, from the medians of the two kinds of collection)."""

    ports: int
    series: int
    ours: float
    plain: float
    with_hw: float
    cpu: float
    render: float
    theirs: float
    discover: float
    check: float


def _measure(root: Path, tree: SimulatedSysfs | None, url: str, rounds: int) -> Result:
    """Medians of ours and node_exporter's cost, interleaved so load hits both alike."""
    clock = [0.0]
    collector = InfinibandCollector(
        sysfs=InfinibandSysfs(root=root), tools=None, events=DeviceEvents(monitor=None),
        rediscover_seconds=1e9, hw_stats_seconds=HW_STATS, monotonic=lambda: clock[0],
    )  # fmt: skip
    renderer = Renderer()
    series = series_count(collector.collect())
    plain: list[float] = []
    with_hw: list[float] = []
    cpu, render, theirs = [], [], []
    for n in range(1, rounds + 1):
        if tree is not None:  # a real tree moves by itself
            tree.write(START + STEP * n)
        clock[0] = n * INTERVAL
        theirs.append(_node_exporter_ms(url))
        start, start_cpu = time.perf_counter(), time.thread_time()
        families = collector.collect()
        (with_hw if n % PER_HW == 0 else plain).append((time.perf_counter() - start) * 1000)
        cpu.append((time.thread_time() - start_cpu) * 1000)
        start = time.perf_counter()
        renderer.render(families)
        render.append((time.perf_counter() - start) * 1000)
    collector.close()
    sysfs = InfinibandSysfs(root=root)
    discover = []
    for _ in range(max(3, rounds // 10)):
        start = time.perf_counter()
        sysfs.discover()
        discover.append((time.perf_counter() - start) * 1000)
    check = []  # the rediscover timer's check when nothing changed
    for _ in range(max(3, rounds // 10)):
        start = time.perf_counter()
        if not sysfs.unchanged():
            raise RuntimeError("the tree's shape changed under the bench")
        check.append((time.perf_counter() - start) * 1000)
    ports = sum(len(numbers) for numbers in sysfs.listing().values())
    sysfs.close()
    plain_ms, hw_ms = statistics.median(plain), statistics.median(with_hw)
    return Result(
        ports=ports,
        series=series,
        ours=((PER_HW - 1) * plain_ms + hw_ms) / PER_HW,
        plain=plain_ms,
        with_hw=hw_ms,
        cpu=statistics.median(cpu),
        render=statistics.median(render),
        theirs=statistics.median(theirs),
        discover=statistics.median(discover),
        check=statistics.median(check),
    )


def _as_run(root: Path, tree: SimulatedSysfs | None, seconds: float, workdir: Path) -> None:
    """Both exporters running on the same tree; medians of what each reports about itself."""
    only_infiniband = [
        f"--no-collector.{spec.name}" for spec in COLLECTORS if spec.name != "infiniband"
    ]
    # hw_counters every 6 collections, as the defaults give (5 s collections, 30 s).
    args = [f"--path.sysfs={root}", "--collector.interval=1s", *only_infiniband]
    args.append(f"--collector.infiniband.hw-stats.interval={HW_STATS / INTERVAL:g}s")
    ours, theirs = [], []
    with (
        node_exporter(workdir / "ne", sysfs=root, collectors=["infiniband"]) as ne,
        servers.fleetwatch_command(workdir / "fw", command="export", args=args) as fw,
    ):
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            n += 1
            if tree is not None:
                tree.write(START + STEP * n)
            theirs.append(_node_exporter_ms(ne.url))
            time.sleep(1.0)  # one of our collections (interval 1 s) reads the moved tree
            ours.append(_reported_ms(fw.url, "fleetwatch_collector_duration_seconds"))
    ours_ms, theirs_ms = statistics.median(ours), statistics.median(theirs)
    ours_mean, theirs_mean = statistics.fmean(ours), statistics.fmean(theirs)
    print(
        f"as run, {len(ours)} samples: fleetwatch_collector_duration_seconds median "
        f"{ours_ms:.3f} ms, mean {ours_mean:.3f} ms (hw_counters in one run of six); "
        f"node_exporter scrape duration median {theirs_ms:.3f} ms, mean {theirs_mean:.3f} ms; "
        f"ratio of means {ours_mean / theirs_mean:.2f}, of medians {ours_ms / theirs_ms:.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--as-run-seconds", type=float, default=60.0)
    parser.add_argument(
        "--sysfs",
        type=Path,
        help="measure on this sysfs instead of simulated trees (a real host: --sysfs /sys)",
    )
    args = parser.parse_args()
    if args.rounds < PER_HW:
        parser.error(
            f"--rounds must be at least {PER_HW}: one collection in {PER_HW} reads hw_counters"
        )
    print(f"{'ports':>5} {'series':>6} {'ours ms':>8} {'(ports':>7} {'+hw)':>6} "
          f"{'ours cpu ms':>11} {'render ms':>9} {'node_exporter ms':>16} {'ratio':>6} "
          f"{'rediscovery ms':>14} {'check ms':>8}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        trees: list[tuple[Path, SimulatedSysfs | None]] = (
            [(args.sysfs, None)]
            if args.sysfs
            else [(Path(tmp) / f"tree{n}", _tree(Path(tmp) / f"tree{n}", n)) for n in (8, 16, 32)]
        )
        for index, (root, tree) in enumerate(trees):
            with node_exporter(
                Path(tmp) / f"ne{index}", sysfs=root, collectors=["infiniband"]
            ) as ne:
                r = _measure(root, tree, ne.url, args.rounds)
            if tree is not None:
                tree.close()
            print(f"{r.ports:>5} {r.series:>6} {r.ours:>8.3f} {r.plain:>7.3f} {r.with_hw:>6.3f} "
                  f"{r.cpu:>11.3f} {r.render:>9.3f} "
                  f"{r.theirs:>16.3f} {r.ours / r.theirs:>6.2f} "
                  f"{r.discover:>14.3f} {r.check:>8.3f}")  # fmt: skip
        if args.sysfs:
            _as_run(args.sysfs, None, args.as_run_seconds, Path(tmp))
        else:
            root = Path(tmp) / "as-run"
            tree = _tree(root, 16)
            _as_run(root, tree, args.as_run_seconds, Path(tmp))
            tree.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
