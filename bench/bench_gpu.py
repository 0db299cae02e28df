"""Cost of the GPU collectors (gpu + gpm + nvlink) per cycle on simulated DGX H100 and GB200.

For each scenario: series count, CPU time per full collection cycle, and the same minus
the time spent inside the fake NVML's calls (every call is timed and its time subtracted,
so the figure is what the collectors themselves cost; the timing wrapper's own overhead
stays in it, so it is an upper bound). Also prints the render time of the cycle.
Target (issue 3): under 10 ms CPU per cycle for 8 GPUs, under 1,500 series on dgx-h100.

Run: .venv/bin/python bench/bench_gpu.py [--cycles N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetwatch.collectors.base import Collector
from fleetwatch.collectors.gpm import GpmCollector
from fleetwatch.collectors.gpu import GpuCollector
from fleetwatch.collectors.nvlink import NvLinkCollector
from fleetwatch.collectors.sources.nvml import NvmlSource
from fleetwatch.exporter.render import Renderer
from fleetwatch.sim.fake_nvml import FakeNvml
from fleetwatch.sim.scenario import load_scenario
from fleetwatch.sim.world import SimulatedNode
from testbed.clock import FixedClock
from testbed.nvml_timing import timed


def measure(scenario_name: str, cycles: int) -> None:
    in_calls: list[float] = []
    node = SimulatedNode(scenario=load_scenario(scenario_name), clock=FixedClock(120.0))
    lib = timed(FakeNvml(node=node), lambda call, seconds: in_calls.append(seconds))
    source = NvmlSource(lib=lib)
    collectors: list[Collector] = [
        GpuCollector(source=source, expected_count=None),
        GpmCollector(source=source),
        NvLinkCollector(source=source, nvlink5=True, per_gpu=False),
    ]
    renderer = Renderer()
    for collector in collectors:  # warm up: discovery, first GPM sample
        collector.collect()
    totals, nvml, renders = [], [], []
    series = 0
    for _ in range(cycles):
        in_calls.clear()
        start = time.process_time()
        families = [f for c in collectors for f in c.collect()]
        totals.append(time.process_time() - start)
        nvml.append(sum(in_calls))
        start = time.process_time()
        body = renderer.render(families)
        renders.append(time.process_time() - start)
        series = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
    calls = len(in_calls)
    total, fake = statistics.median(totals) * 1e3, statistics.median(nvml) * 1e3
    render = statistics.median(renders) * 1e3
    print(
        f"{scenario_name:10s} GPUs {len(source.gpus()):2d}  series {series:5d}  NVML calls/cycle "
        f"{calls:5d}  CPU/cycle {total:6.2f} ms  in fake NVML {fake:6.2f} ms  "
        f"collectors alone {total - fake:6.2f} ms  render {render:5.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50)
    args = parser.parse_args()
    for scenario in ("dgx-h100", "gb200"):
        measure(scenario, args.cycles)


if __name__ == "__main__":
    main()
