"""Where the running exporter's time goes: per collector, per function, per NVML call.

Starts a real `fleetwatch export` (on NVIDIA's mock NVML when `FLEETWATCH_NVML_MOCK` names
it, with a real-shaped InfiniBand tree that this script moves on every collection interval;
or `--simulate dgx-h100`), lets it run and serve scrapes for `--seconds`, then stops it and
prints what each collector's worker spent in its runs after the first (the first discovers
devices and opens files once: start-up, not the steady cost).

The profile is cProfile around each collector's runs, inside the exporter's own process:
the child is this script, which wraps the engine's worker run
(`fleetwatch.exporter.engine._Worker._run`) in one `cProfile.Profile` per collector and
then runs `fleetwatch.cli.main` unchanged. The event loop (scheduling, the HTTP server,
assembling the exposition) is profiled apart as `event-loop`: each of its iterations
(`asyncio.BaseEventLoop._run_once`) after the first 10 s, "a run" there being one
iteration. The simulation's tree rewrites run unprofiled. cProfile roughly doubles the
cost of each Python call: compare proportions, not absolute times, with bench_exporter's
whole-process CPU.

Run: `.venv/bin/python bench/profile_exporter.py [--seconds 60] [--simulate] [--top 15]`.
Prints, per collector: runs, time a run under the profiler, the last run's duration as the
exporter reports it, the top functions by own time, and the NVML calls (pynvml's `nvml*`
functions, or the fake's under --simulate) with calls a run and time a call.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.exporter_setups import exporter_argv, moving_tree, wrapped_exporter
from fleetwatch.sim import loopback_servers as servers

NVML_FILES = ("pynvml.py", "fake_nvml.py")


def _child(out: Path, argv: Sequence[str]) -> int:
    """In the exporter's process: profile every worker run, per collector, then export."""
    from fleetwatch.cli import main
    from fleetwatch.exporter import engine

    profiles: dict[str, cProfile.Profile] = {}
    original = engine._Worker._run
    started: set[str] = set()

    def profiled(worker: engine._Worker) -> object:
        name = worker._state.name
        if name not in started:  # the first run discovers devices, opens files: not a cycle
            started.add(name)
            return original(worker)
        profile = profiles.setdefault(name, cProfile.Profile())
        profile.enable()
        try:
            return original(worker)
        finally:
            profile.disable()

    engine._Worker._run = profiled  # type: ignore[method-assign,assignment]
    _profile_event_loop(profiles, warm_up=10.0)
    code = main(argv)
    for name, profile in profiles.items():
        profile.dump_stats(out / f"{name}.prof")
    return code


def _profile_event_loop(profiles: dict[str, cProfile.Profile], *, warm_up: float) -> None:
    """Profile every event-loop iteration once `warm_up` seconds have passed (start-up and
    the first cycle are not the steady cost)."""
    import asyncio.base_events

    loop_class: Any = asyncio.base_events.BaseEventLoop  # _run_once is not in the stubs
    original = loop_class._run_once
    after = time.monotonic() + warm_up
    profile = profiles.setdefault("event-loop", cProfile.Profile())

    def profiled(loop: asyncio.base_events.BaseEventLoop) -> None:
        if time.monotonic() < after:
            original(loop)
            return
        profile.enable()
        try:
            original(loop)
        finally:
            profile.disable()

    loop_class._run_once = profiled


def _report(out: Path, metrics: str, top: int) -> None:
    runs = _self_metric(metrics, "fleetwatch_collector_duration_seconds")
    for path in sorted(out.glob("*.prof")):
        name = path.stem
        stats = pstats.Stats(str(path))
        raw = stats.stats  # type: ignore[attr-defined]
        total = sum(entry[2] for entry in raw.values())
        unit = "_run_once" if name == "event-loop" else "_run"
        worker_runs = max(
            (entry[0] for (_, _, func), entry in raw.items() if func == unit), default=1
        )
        last = runs.get(name, float("nan")) * 1e3
        print(
            f"\n== {name}: {worker_runs} runs, {total / worker_runs * 1e3:.2f} ms a run under "
            f"cProfile; last run {last:.2f} ms wall as the exporter reports it"
        )
        rows = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[:top]
        for (file, line, func), (_, calls, own, cumulative, _) in rows:
            where = f"{Path(file).name}:{line}({func})"
            print(
                f"  {own / worker_runs * 1e3:7.3f} ms own {cumulative / worker_runs * 1e3:7.3f} "
                f"ms cum {calls / worker_runs:8.1f} calls/run  {where}"
            )
        nvml = [
            (func, entry)
            for (file, _, func), entry in raw.items()
            if Path(file).name in NVML_FILES and func.startswith("nvml")
        ]
        if nvml:
            calls_total = sum(entry[1] for _, entry in nvml) / worker_runs
            time_total = sum(entry[3] for _, entry in nvml) / worker_runs
            print(f"  NVML: {calls_total:.0f} calls a run, {time_total * 1e3:.2f} ms a run inside")
            for func, (_, calls, _, cumulative, _) in sorted(
                nvml, key=lambda item: item[1][3], reverse=True
            )[:top]:
                print(
                    f"    {calls / worker_runs:7.1f}/run {cumulative / max(calls, 1) * 1e6:7.1f} "
                    f"us/call {cumulative / worker_runs * 1e3:7.3f} ms/run  {func}"
                )


def _self_metric(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('collector="', 1)[1].split('"', 1)[0]] = float(value)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--simulate", action="store_true", help="--simulate dgx-h100, no mock")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        out = workdir / "profiles"
        out.mkdir()
        with moving_tree(workdir / "sys", enabled=not args.simulate) as tree:
            env, fw_args = exporter_argv(simulate=args.simulate, sysfs=tree)
            prefix = [sys.executable, str(Path(__file__).resolve()), "--child", str(out)]
            with wrapped_exporter(prefix, fw_args, workdir=workdir, env=env) as server:
                end = time.monotonic() + args.seconds
                while time.monotonic() < end:
                    metrics = servers.http_get(server.url + "/metrics").decode()
                    time.sleep(5)
                server.process.send_signal(signal.SIGTERM)
                server.process.wait(timeout=30)
        print(
            f"fleetwatch export {' '.join(fw_args)}, {args.seconds:g} s, scraped every 5 s; "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        _report(out, metrics, args.top)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        threading.current_thread().name = "exporter"
        sys.exit(_child(Path(sys.argv[2]), sys.argv[3:]))
    main()
