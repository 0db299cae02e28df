"""The ways the exporter benches run `fleetwatch export`, shared by bench_exporter and
profile_exporter so both measure the same thing.

- On NVIDIA's mock NVML (`FLEETWATCH_NVML_MOCK`, H100 profile: the real pynvml through ctypes)
  with `--path.sysfs` on a real-shaped tree (the dgx-h100 scenario's: 8 NDR HCAs and 2 RoCE
  ports, 21 `counters/` and 26 `hw_counters/` files a port, the GPUs' and HCAs' PCI
  functions) that the bench moves on every collection interval from its own process: the
  exporter's process then runs only the exporter.
- The same on a GPU machine's own NVIDIA driver (`--driver`): what the NVML calls cost on
  hardware, with the same tree for the rest.
- `--simulate dgx-h100`: the simulation inside the exporter's process (pure-Python NVML, the
  tree rewritten by the exporter once an interval), for comparison with earlier figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from fleetwatch.sim import loopback_servers as servers
from fleetwatch.sim.scenario import load_scenario
from fleetwatch.sim.sysfs_tree import SimulatedSysfs
from fleetwatch.sim.world import SimulatedNode, WallClock
from testbed.nvmlmock import LIBRARY, NvmlMock

INTERVAL_SECONDS = 5.0  # `fleetwatch export --collector.interval` default


@contextlib.contextmanager
def moving_tree(root: Path, *, enabled: bool = True) -> Iterator[Path]:
    """The dgx-h100 scenario's sysfs tree under `root`, its counters moved on every
    interval by a thread of this process until the context exits (nothing when not
    `enabled`)."""
    if not enabled:
        yield root
        return
    node = SimulatedNode(scenario=load_scenario("dgx-h100"), clock=WallClock())
    tree = SimulatedSysfs(node=node, root=root)
    tree.write()
    stop = threading.Event()

    def move() -> None:
        while not stop.wait(INTERVAL_SECONDS):
            tree.write()

    mover = threading.Thread(target=move, name="tree-mover", daemon=True)
    mover.start()
    try:
        yield root
    finally:
        stop.set()
        mover.join()
        tree.close()


def exporter_argv(
    *, simulate: bool, sysfs: Path, driver: bool = False
) -> tuple[dict[str, str], list[str]]:
    """(environment, `fleetwatch export` arguments) for one of the two set-ups; with `driver`,
    the first set-up on this machine's NVIDIA driver instead of the mock (a GPU machine)."""
    if simulate:
        return {}, ["--simulate=dgx-h100"]
    if driver:
        return {}, [f"--path.sysfs={sysfs}"]
    mock = NvmlMock.from_environment()
    env = {
        "LD_LIBRARY_PATH": str(mock.root / LIBRARY.parent),
        "MOCK_NVML_CONFIG": str(mock.profile("h100")),
        # An empty overrides file: the mock must not pick one up beside its profile.
        "MOCK_NVML_OVERRIDES": str(_empty_overrides(sysfs.parent)),
    }
    return env, [f"--path.sysfs={sysfs}"]


def _empty_overrides(folder: Path) -> Path:
    path = folder / "nvml-overrides.yaml"
    path.write_text("version: 1\n")
    return path


@contextlib.contextmanager
def wrapped_exporter(
    prefix: Sequence[str], args: Sequence[str], *, workdir: Path, env: dict[str, str]
) -> Iterator[servers.Server]:
    """`fleetwatch export ARGS` run by a wrapper in the exporter's own process (`prefix`:
    the wrapper's command line, e.g. a profiler or `NAMED_THREADS`), ready at /readyz."""
    port = servers.free_port()
    argv = [*prefix, "export", f"--web.listen-address=127.0.0.1:{port}", "--log.format=json"]
    with servers.running(
        [*argv, *args],
        url=f"http://127.0.0.1:{port}",
        ready_path="/readyz",
        workdir=workdir,
        name="fleetwatch-export",
        env=env,
    ) as server:
        yield server


# Run as `python -c NAMED_THREADS FILE export ...`: `fleetwatch export` that writes the native
# id and name of each thread Python runs to FILE when sent SIGUSR1 (`python_threads` sends it),
# so that a bench can tell the exporter's threads from those a library started (the mock
# NVML's Go runtime). No thread of its own: one that looked every second cost 0.016-0.020 CPU
# s in 90 s, 2-3 % of the exporter's, charged to the exporter and to the baseline alike.
NAMED_THREADS = """
import json, os, signal, sys, threading
from fleetwatch.cli import main

def record(_signum, _frame):
    names = {t.native_id: t.name for t in threading.enumerate()}
    with open(sys.argv[1] + ".new", "w") as out:
        json.dump(names, out)
    os.replace(sys.argv[1] + ".new", sys.argv[1])

signal.signal(signal.SIGUSR1, record)
sys.exit(main(sys.argv[2:]))
"""


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of a process so far, by native id: the scheduler's own
    run time in nanoseconds (`/proc/PID/task/TID/schedstat`), where the kernel has it; else
    user + system from `stat`, whose 10 ms ticks are coarse for a thread that runs a few
    milliseconds a second (their per-thread sum missed a sixth of the process's CPU here)."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            try:
                found[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
            except FileNotFoundError:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                found[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def python_threads(names_file: Path, pid: int, *, timeout: float = 10.0) -> dict[int, str]:
    """Native ids and names of the threads Python runs in the process `pid`, which runs
    `NAMED_THREADS` writing them to `names_file` (asked for by SIGUSR1, awaited until
    `timeout`); {} when no answer came."""
    names_file.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return {int(tid): str(name) for tid, name in json.loads(names_file.read_text()).items()}
        time.sleep(0.05)
    return {}
