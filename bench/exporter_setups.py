"""The two ways the exporter benches run `fleetwatch export`, shared by bench_exporter and
profile_exporter so both measure the same thing.

- On NVIDIA's mock NVML (`FLEETWATCH_NVML_MOCK`, H100 profile: the real pynvml through ctypes)
  with `--path.sysfs` on a real-shaped tree (the dgx-h100 scenario's: 8 NDR HCAs and 2 RoCE
  ports, 21 `counters/` and 26 `hw_counters/` files a port, the GPUs' and HCAs' PCI
  functions) that the bench moves on every collection interval from its own process: the
  exporter's process then runs only the exporter.
- `--simulate dgx-h100`: the simulation inside the exporter's process (pure-Python NVML, the
  tree rewritten by the exporter once an interval), for comparison with earlier figures.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

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


def exporter_argv(*, simulate: bool, sysfs: Path) -> tuple[dict[str, str], list[str]]:
    """(environment, `fleetwatch export` arguments) for one of the two set-ups."""
    if simulate:
        return {}, ["--simulate=dgx-h100"]
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
