"""Benchmark `fleetwatch report` on a simulated fleet history in VictoriaMetrics; prints figures.

Streams the fleet's history (sim/fleet.py, only the families the report reads, node chunk
by node chunk) into a real VictoriaMetrics through its `/api/v1/import` API, then runs
`fleetwatch report` on it as a child process and prints its wall time, its peak RSS (the
child's `ru_maxrss`, from `os.wait4`) and the bytes it read from the store (its own count,
logged as "read the store"), and what each query with a recorded form read (the bench
imports raw series only, so the raw expression). Import time is printed but is not part of
the report's figure.
The machine's load average is printed beside the figures: this machine is shared.

With `--store DIR` the imported store is kept in DIR and reused: the first run imports and
records the fleet it holds (DIR/fleet.json, written only once the import is flushed); a later
run with the same fleet starts VictoriaMetrics on DIR and runs the report without importing,
so before/after runs of a change cost one import (the 10,000-node history takes about ten
minutes to import on a quiet machine). A different fleet, or data without the record of a
finished import, is refused, naming what differs.

With `--record` the bench also writes the recorded series the report reads (the shipped
recording rules behind `Query.recorded`, evaluated by vmalert's replay mode over the
history at its step, into the same store; once per kept store, DIR/recorded.json), so the
report reads them instead of the raw expressions; the figures say which it read. Without
it the store holds raw series only, as a long-term store fed by remote-write of raw series.

    .venv/bin/python bench/bench_report.py --nodes 1000 --hours 24 --step 60
    .venv/bin/python bench/bench_report.py --goodput --nodes 2048 --hours 1296   # 54 days

With `--goodput` the history is the Goodput section's (sim/goodput_history.py: training
jobs of 4 nodes with interruptions, restarts, saves and node signals) instead of the fleet's
hardware series, shaped as a fleet running the shipped rules would keep it for the series
the section reads: the interruption rules' job-level records (each job's busiest GPU, GPUs,
GPUs per node, interruption runs), kube-state-metrics' pods, Slurm's job info and restart
counts, checkpoint records, alerts, Xids and each node's GPU count, and not every GPU's
series (`--gpu-series` adds them: the raw form the section falls back to); the report runs
with `--report.section=goodput`, so the figure is the Goodput section's. Beside the report's
wall time and peak RSS it prints VictoriaMetrics' own peak RSS (VmHWM) while it answered.
    .venv/bin/python bench/bench_report.py --nodes 10000 --step 300 --store /var/tmp/fleet10k
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetwatch.report.dataset import RAW
from fleetwatch.sim import goodput_history
from fleetwatch.sim.fleet import FleetSpec, write_victoria_import
from testbed.tool_servers import report_recording_rules
from testbed.victoria import force_flush, victoria_metrics, vmalert_replay

BLOCK = 1 << 20
# The record of a finished import in a kept store: the FleetSpec it holds, and whether
# its history carries the exporter's scrape job (the rules select on it; older stores lack it).
STORE_RECORD = "fleet.json"
SCRAPE_JOB = "scrape_job"
# The record of the recorded series replayed into a kept store.
RECORDED = "recorded.json"


History = FleetSpec | goodput_history.GoodputSpec


def stream_import(url: str, spec: History) -> int:
    """POST the fleet's history to VictoriaMetrics' import API as it is generated (a writer
    thread feeds a pipe the request body is read from); returns the bytes sent. A fleet the
    simulation refuses (or any failure of the writer) stops the bench with its error, rather
    than leaving a store that holds nothing."""
    read_fd, write_fd = os.pipe()
    failed: list[BaseException] = []

    def produce() -> None:
        with os.fdopen(write_fd, "wb", buffering=BLOCK) as out:
            try:
                if isinstance(spec, FleetSpec):
                    write_victoria_import(spec, out)
                else:
                    goodput_history.write_victoria_import(spec, out)
            except Exception as exc:  # handed to the main thread, which stops the bench
                failed.append(exc)

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    sent = 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        with os.fdopen(read_fd, "rb") as source:
            while block := source.read(BLOCK):
                sent += len(block)
                yield block

    target = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(target.netloc, timeout=3600)
    connection.request("POST", "/api/v1/import", body=body(), encode_chunked=True)
    response = connection.getresponse()
    if response.status not in (200, 204):
        raise SystemExit(f"import failed: HTTP {response.status}: {response.read()[:300]!r}")
    writer.join()
    if failed:
        raise SystemExit(f"the fleet's history could not be written: {failed[0]}")
    return sent


def run_report(url: str, spec: History, out: Path, extra: list[str]) -> tuple[float, int, str]:
    """`fleetwatch report` as a child: (wall seconds, peak RSS bytes, its stderr)."""
    command = [
        str(Path(sys.executable).parent / "fleetwatch"),
        "report",
        f"--prometheus.url={url}",
        f"--since={spec.hours:g}h",
        f"--until={spec.end}",
        f"--out={out}",
        *extra,
    ]
    started = time.monotonic()
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen(command, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - started
        err.seek(0)
        stderr = err.read().decode()
    if child.returncode:
        raise SystemExit(f"report exited {child.returncode}:\n{stderr[-2000:]}")
    return wall, usage.ru_maxrss * 1024, stderr


def bytes_read(stderr: str) -> int:
    """The report's own count of response bytes (its JSON log line "read the store")."""
    for line in stderr.splitlines():
        if '"read the store"' in line:
            return int(json.loads(line)["bytes"])
    raise SystemExit("the report logged no 'read the store' line")


def sources(stderr: str) -> list[str]:
    """What each query with a recorded form read, as the report logged it ("report: QUERY
    reads SOURCE"): a recording rule's series, or the raw expression (a store without
    recorded series, as this bench's: it imports raw series only)."""
    found = []
    for line in stderr.splitlines():
        if line.startswith("{") and " reads " in line:
            found.append(str(json.loads(line)["msg"]).removeprefix("report: "))
    return found


def record(vm_url: str, spec: History, workdir: Path) -> float:
    """Replay the recording rules the report reads over the history into the store at
    `vm_url`, evaluated at the history's step; returns the seconds it took."""
    rules = report_recording_rules(workdir / "report-rules.yaml", interval=f"{spec.step_seconds}s")
    started = time.monotonic()
    # From a step before the history, so the report's window is covered from its start.
    start, end = spec.start - spec.step_seconds, spec.end
    vmalert_replay(workdir / "vmalert", rule_files=[rules], url=vm_url, start=start, end=end)
    return time.monotonic() - started


def stored_rows(url: str) -> int:
    """Samples VictoriaMetrics has added to its storage (`vm_rows_added_to_storage_total`)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=60) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("vm_rows_added_to_storage_total"):
                return int(float(line.split()[-1]))
    raise SystemExit("VictoriaMetrics reports no vm_rows_added_to_storage_total")


def peak_rss(pid: int) -> int:
    """A running process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no VmHWM for process {pid}")


def kept_store(store: Path, spec: History) -> bool:
    """Whether `store` already holds `spec`'s imported history (True) or must be imported
    (False: it is empty or absent). Refuses a store that holds another fleet, or data without
    the record of a finished import (an import that was interrupted)."""
    record = store / STORE_RECORD
    if record.exists():
        held = json.loads(record.read_text())
        held.pop(SCRAPE_JOB, None)
        wanted = asdict(spec)
        if held != wanted:
            differs = {k: (held.get(k), v) for k, v in wanted.items() if held.get(k) != v}
            raise SystemExit(f"{store} holds another fleet (held, wanted): {differs}")
        return True
    if (store / "vm" / "data").exists():
        raise SystemExit(
            f"{store} holds VictoriaMetrics data but no {STORE_RECORD}: an import did not "
            "finish; remove the folder to import again"
        )
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--step", type=int, default=60, help="sample interval (s)")
    parser.add_argument("--ib-ports", type=int, default=8)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--store", type=Path, default=None, help="keep the imported store here and reuse it"
    )
    parser.add_argument(
        "--record", action="store_true", help="also write the recorded series the report reads"
    )
    parser.add_argument(
        "--goodput", action="store_true", help="the Goodput section's history (training jobs)"
    )
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument(
        "--gpu-series",
        action="store_true",
        help="--goodput: also every GPU's activity and job series (the raw form)",
    )
    parser.add_argument(
        "--hours-between",
        type=float,
        default=1584.0,
        help="--goodput: mean hours between a job's interruptions (default: Llama 3's rate, "
        "419 in 54 days over 2,048 nodes, for jobs of 4 nodes)",
    )
    parser.add_argument("report_flags", nargs="*", help="extra `fleetwatch report` flags")
    args = parser.parse_args()
    spec: History
    if args.goodput:
        spec = goodput_history.GoodputSpec(
            jobs=max(2, args.nodes // 4),
            nodes_per_job=4,
            gpus_per_node=args.gpus,
            hours=args.hours,
            step_seconds=args.step,
            node_per_1000_node_days=24_000 / (args.hours_between * 4),  # per node of 4
            records=True,
            gpu_series=args.gpu_series,
        )
        args.report_flags.append("--report.section=goodput")
        nodes = (spec.jobs - 1) * spec.nodes_per_job + 1
        print(
            f"goodput: {spec.jobs} jobs on {nodes} nodes x {spec.gpus_per_node} GPUs x "
            f"{spec.hours:g} h at {spec.step_seconds} s"
        )
    else:
        spec = FleetSpec(
            nodes=args.nodes,
            gpus_per_node=args.gpus,
            ib_ports_per_node=args.ib_ports,
            hours=args.hours,
            step_seconds=args.step,
        )
        print(
            f"fleet: {spec.nodes} nodes x {spec.gpus_per_node} GPUs x {spec.hours:g} h at "
            f"{spec.step_seconds} s, {spec.ib_ports_per_node} IB ports/node"
        )
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root = Path(tmp)
        store = args.store if args.store is not None else root
        kept = args.store is not None and kept_store(args.store, spec)
        vm_args = ["-search.maxQueryDuration=10m"]
        if kept:
            print(f"import: none, reusing the store in {store}")
        else:
            with victoria_metrics(store / "vm", extra_args=vm_args) as vm:
                t0 = time.monotonic()
                sent = stream_import(vm.url, spec)
                force_flush(vm)
                imported = time.monotonic() - t0
                print(f"samples stored: {stored_rows(vm.url):,}")
            if vm.process.returncode != 0:
                raise SystemExit(f"VictoriaMetrics exited {vm.process.returncode} after the import")
            print(f"import: {imported:.1f} s ({sent / 2**30:.2f} GiB JSON lines)")
            if args.store is not None:
                # Written once VictoriaMetrics has stopped, so its data is on disk whole.
                (store / STORE_RECORD).write_text(json.dumps(asdict(spec) | {SCRAPE_JOB: True}))
        if args.record and not (store / RECORDED).exists():
            held = store / STORE_RECORD
            if held.exists() and not json.loads(held.read_text()).get(SCRAPE_JOB, False):
                raise SystemExit(
                    f"{store}: its history has no scrape job for the rules to select (imported "
                    "by an older bench): import it again to --record"
                )
            with victoria_metrics(store / "vm", extra_args=vm_args) as vm:
                replayed = record(vm.url, spec, root)
                force_flush(vm)
            if vm.process.returncode != 0:
                raise SystemExit(f"VictoriaMetrics exited {vm.process.returncode} after replay")
            print(f"recorded series: {replayed:.1f} s (vmalert replay)")
            (store / RECORDED).write_text(json.dumps({"seconds": replayed}))
        # The report always reads a store started afresh, imported or kept alike.
        with victoria_metrics(store / "vm", extra_args=vm_args) as vm:
            load_before = os.getloadavg()[0]
            wall, rss, stderr = run_report(vm.url, spec, root / "out", args.report_flags)
            load_after = os.getloadavg()[0]
            vm_peak = peak_rss(vm.process.pid)
        actions = (root / "out" / "tables" / "actions.csv").read_text().count("\n") - 1
        if args.goodput:
            tables = root / "out" / "tables"
            found = (tables / "goodput_interruptions.csv").read_text().count("\n") - 1
            jobs = (tables / "goodput_jobs.csv").read_text().count("\n") - 1
            print(f"goodput: {found} interruptions found in {jobs} jobs")
        print(
            f"report: {wall:.1f} s wall; peak RSS {rss / 2**30:.2f} GiB; "
            f"{bytes_read(stderr) / 2**20:.1f} MiB read from the store; {actions} actions"
        )
        print(f"VictoriaMetrics peak RSS (started for the report): {vm_peak / 2**30:.2f} GiB")
        print(f"load average (1 min) before/after the report: {load_before:.1f}/{load_after:.1f}")
        read = sources(stderr)
        print(f"sources: {'; '.join(read) or 'no query with a recorded form ran'}")
        if args.record and any(line.endswith(RAW) for line in read):
            # The report's coverage check found the replayed series short of the raw ones.
            print("note: --record, but the recorded series do not cover the fleet: see vmalert")


if __name__ == "__main__":
    main()
