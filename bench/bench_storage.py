"""Cost of the storage collector on a node with 50 NFS mounts (issue 26, part 9).

A fixture procfs (`testbed.mounts.nfs_node`: 50 NFSv4.1 mounts, 20 per-operation lines
each) read by:
1. `StorageCollector.collect()` in this process: CPU per cycle (process time, which leaves
   out the mount helper's statvfs calls: those are in 2) and series, full and lean;
2. the real exporter (`fleetwatch export --path.procfs=FIXTURE`, storage only, every 1 s):
   its own `fleetwatch_collector_duration_seconds{collector="storage"}`, and the CPU the
   exporter and its mount helper process used per cycle over the run, and their RSS.
The mount points do not exist here, so each statvfs fails fast with ENOENT (counted): the
figures are the exporter's own cost, not a server's latency.

Run: .venv/bin/python bench/bench_storage.py [--mounts 50] [--cycles 200] [--seconds 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.collectors.storage import StorageCollector, StorageSettings
from fleetwatch.exporter.render import Renderer
from fleetwatch.sim.servers import fleetwatch_command, http_get, wait_until
from testbed.mounts import nfs_node, write_procfs

OTHER_COLLECTORS = ("gpu", "pci", "gpm", "nvlink", "xid", "podresources", "infiniband")


def _series(body: bytes) -> int:
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


def in_process(procfs: Path, cycles: int, *, lean: bool) -> None:
    settings = StorageSettings(all_operations=not lean)
    collector = StorageCollector(procfs=procfs, settings=settings, wait=30.0)
    renderer = Renderer()
    try:
        collector.collect()  # starts the helper and the lanes
        costs, renders = [], []
        body = b""
        for _ in range(cycles):
            start = time.process_time()
            families = collector.collect()
            costs.append(time.process_time() - start)
            start = time.process_time()
            body = renderer.render(families)
            renders.append(time.process_time() - start)
    finally:
        collector.close()
    print(
        f"{'lean' if lean else 'full'}: {_series(body)} series; collect() CPU median "
        f"{statistics.median(costs) * 1000:.2f} ms, p95 "
        f"{sorted(costs)[int(0.95 * len(costs))] * 1000:.2f} ms; render "
        f"{statistics.median(renders) * 1000:.2f} ms"
    )


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, clock ticks


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _helpers(pid: int) -> list[int]:
    """The exporter's mount helper process (a child running `mount_helper`)."""
    # A child is listed under the thread that started it (a lane thread, here).
    tasks = Path(f"/proc/{pid}/task").glob("*/children")
    children = [int(child) for path in tasks for child in path.read_text().split()]
    return [c for c in children if b"mount_helper" in Path(f"/proc/{c}/cmdline").read_bytes()]


def as_run(procfs: Path, workdir: Path, seconds: float) -> None:
    args = [
        f"--path.procfs={procfs}",
        "--collector.interval=1s",
        *(f"--no-collector.{name}" for name in OTHER_COLLECTORS),
    ]
    with fleetwatch_command(workdir, command="export", args=args, ready_path="/readyz") as server:
        pid = server.process.pid
        helpers = wait_until(lambda: _helpers(pid), timeout=30, what="the mount helper")
        durations = []
        start_cpu = _cpu_seconds(pid) + sum(_cpu_seconds(h) for h in helpers)
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            text = http_get(server.url + "/metrics").decode()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == "fleetwatch_collector_duration_seconds":
                        durations.append(sample.value)
            time.sleep(1.0)
        elapsed = time.monotonic() - start
        cpu = _cpu_seconds(pid) + sum(_cpu_seconds(h) for h in helpers) - start_cpu
        rss = _rss_mib(pid), sum(_rss_mib(h) for h in helpers)
    print(
        f"as run ({elapsed:.0f} s, 1 s interval): collector duration median "
        f"{statistics.median(durations) * 1000:.2f} ms; exporter + helper CPU "
        f"{cpu / elapsed * 1000:.1f} ms per cycle (idle HTTP server and engine included); "
        f"RSS exporter {rss[0]:.0f} MiB, helper {rss[1]:.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mounts", type=int, default=50)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mountinfo, mountstats = nfs_node(args.mounts)
        procfs = write_procfs(Path(tmp) / "proc", mountinfo=mountinfo, mountstats=mountstats)
        print(f"{args.mounts} NFS mounts, 20 operations each")
        in_process(procfs, args.cycles, lean=False)
        in_process(procfs, args.cycles, lean=True)
        as_run(procfs, Path(tmp) / "exporter", args.seconds)


if __name__ == "__main__":
    main()
