"""Run every GPU collector against the real NVIDIA driver and print what it reads.

For a machine with an NVIDIA GPU: prints each family with its samples, the per-call NVML
latency (count, median, max per call name), the NVML calls that failed or were not
supported, and the families the hardware did not produce. Two cycles a few seconds
apart (GPM needs a pair of samples); finishes in well under 3 minutes. Record the output
in docs/hardware-validation.md.

Run: .venv/bin/python tests/hardware/check_nvml.py [--gap SECONDS]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pynvml
from fleetwatch.collectors.base import Collector
from fleetwatch.collectors.gpm import SPECS as GPM_SPECS
from fleetwatch.collectors.gpm import GpmCollector
from fleetwatch.collectors.gpu import SPECS as GPU_SPECS
from fleetwatch.collectors.gpu import GpuCollector
from fleetwatch.collectors.nvlink import PER_LINK_SPECS, NvLinkCollector
from fleetwatch.collectors.sources.nvml import NvmlSource, timed
from fleetwatch.collectors.xid import XidCollector, XidLedger
from fleetwatch.exporter.render import render_families


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gap", type=float, default=5.0, help="seconds between the two cycles")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    latencies: dict[str, list[float]] = defaultdict(list)
    source = NvmlSource(lib=timed(pynvml, lambda call, s: latencies[call].append(s)))
    if not source.gpus():
        print("no NVIDIA driver or no GPU: nothing to check")
        return 1
    for gpu in source.gpus():
        print(f"GPU {gpu.index}: {gpu.identity}")
    xid = XidCollector(source=source, kernel_log=None, ledger=XidLedger(window=10.0))
    collectors: list[Collector] = [
        GpuCollector(source=source, expected_count=None),
        GpmCollector(source=source),
        NvLinkCollector(source=source, nvlink5=True, per_gpu=False),
        xid,
    ]
    for collector in collectors:
        collector.collect()
    time.sleep(args.gap)
    emitted: set[str] = set()
    for collector in collectors:
        started = time.perf_counter()
        families = collector.collect()
        print(f"\n== {type(collector).__name__}: {(time.perf_counter() - started) * 1e3:.1f} ms")
        print(render_families(families).decode())
        emitted |= {f.name for f in families}
    xid.close()
    print("\n== NVML call latency (calls, median ms, max ms)")
    for call, times in sorted(latencies.items()):
        median, worst = statistics.median(times) * 1e3, max(times) * 1e3
        print(f"{call:45s} {len(times):6d} {median:8.3f} {worst:8.3f}")
    expected = {s.name.removesuffix("_total") for s in (*GPU_SPECS, *GPM_SPECS, *PER_LINK_SPECS)}
    print("\n== families this hardware did not produce (not supported, or nothing to count yet)")
    for name in sorted(expected - emitted):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
