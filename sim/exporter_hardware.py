"""A simulated node as the exporter's hardware, for `fleetwatch export --simulate`.

Collectors never branch on simulation. This module builds what they read, the
`CollectorContext`, from a scenario: the fake NVML, a generated sysfs tree, the fake
`perfquery`/`ibstat`, the simulated kernel log (or, when `--collector.xid.kmsg-path` names
another file, that file); the mounts and probe directories `--collector.storage.*` names are
the real ones, and no other host mount is discovered. A scenario's `mounts:` are simulated
(`fleetwatch.sim.storage`): procfs mount files written beside the sysfs tree, with the host's
lines and theirs, and their calls answered by the node. A scenario also stands in for what an
operator would configure on a real node of that shape (the expected InfiniBand link rates, the
checkpoint mounts to watch), as settings the collectors receive the usual way.

`fleetwatch.exporter.hardware` imports this module only when `--simulate` is given, so the
exporter on a real node never loads the simulator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fleetwatch.collectors.base import CollectorContext, open_kmsg
from fleetwatch.collectors.infiniband import InfinibandSettings
from fleetwatch.collectors.infiniband_layout import ExpectedRate
from fleetwatch.collectors.sources.kmsg import DEFAULT_PATH, KernelLog
from fleetwatch.collectors.storage import StorageSettings
from fleetwatch.exporter.machine import Hardware, Refresh
from fleetwatch.exporter.settings import ExportSettings
from fleetwatch.sim import tool_dir
from fleetwatch.sim.fake_nvml import FakeNvml
from fleetwatch.sim.kernel_log import SimulatedKernelLog
from fleetwatch.sim.scenario import builtin_names, load_scenario
from fleetwatch.sim.storage import SimulatedMountCalls, SimulatedProcfs
from fleetwatch.sim.sysfs_tree import SimulatedSysfs
from fleetwatch.sim.world import SimulatedNode, WallClock

log = logging.getLogger(__name__)


def simulated_hardware(node: SimulatedNode, root: Path, settings: ExportSettings) -> Hardware:
    """`node` as the collectors' hardware, its sysfs tree written under `root` now (and,
    when the scenario has mounts, its procfs mount files under `root/proc`)."""
    sysfs = SimulatedSysfs(node=node, root=root)
    sysfs.write()
    refresh: Refresh = sysfs.write
    procfs_root = settings.procfs_root
    if node.scenario.mounts:
        procfs = SimulatedProcfs(node=node, root=root / "proc", host=settings.procfs_root)
        procfs.write()
        procfs_root = procfs.root

        def refresh() -> None:
            sysfs.write()
            procfs.write()

    context = CollectorContext(
        sysfs_root=root,
        procfs_root=procfs_root,
        rootfs_root=settings.rootfs_root,
        discover_mounts=False,
        nvml=FakeNvml(node=node),
        tool_path=str(tool_dir()),
        open_kernel_log=lambda path: _simulated_kernel_log(node, path),
        mount_calls=lambda rootfs: SimulatedMountCalls(node, rootfs=rootfs),
    )
    return Hardware(context=context, settings=_scenario_settings(node, settings), refresh=refresh)


def _simulated_kernel_log(node: SimulatedNode, path: Path) -> KernelLog:
    """The scenario's kernel log, unless `--collector.xid.kmsg-path` names a file of its own."""
    return SimulatedKernelLog(node=node) if path == DEFAULT_PATH else open_kmsg(path)


def _scenario_settings(node: SimulatedNode, settings: ExportSettings) -> ExportSettings:
    """A scenario's `expected_rate_gbps` stands in for `--collector.infiniband.expected-rate`
    (a flag given on the command line still wins), and its mounts are watched beside those
    `--collector.storage.mounts` names."""
    storage = settings.collectors.get("storage")
    if isinstance(storage, StorageSettings) and node.scenario.mounts:
        named = storage.mounts + tuple(
            m.mountpoint for m in node.scenario.mounts if m.mountpoint not in storage.mounts
        )
        collectors = {**settings.collectors, "storage": dataclasses.replace(storage, mounts=named)}
        settings = dataclasses.replace(settings, collectors=collectors)
    infiniband = settings.collectors.get("infiniband")
    if not isinstance(infiniband, InfinibandSettings) or infiniband.expected_rate:
        return settings
    rates = tuple(
        ExpectedRate(device_glob=hca.device, port=None, gbps=float(hca.expected_rate_gbps))
        for hca in node.scenario.infiniband
        if hca.expected_rate_gbps is not None
    )
    collectors = {
        **settings.collectors,
        "infiniband": dataclasses.replace(infiniband, expected_rate=rates),
    }
    return dataclasses.replace(settings, collectors=collectors)


@contextlib.contextmanager
def scenario_hardware(scenario_name: str, settings: ExportSettings) -> Iterator[Hardware]:
    """The scenario `scenario_name` (a file or a built-in name) on a wall clock, its sysfs tree
    in a temporary folder removed after."""
    scenario = load_scenario(scenario_name)
    node = SimulatedNode(scenario=scenario, clock=WallClock())
    root = Path(tempfile.mkdtemp(prefix="fleetwatch-sim-sysfs-"))
    try:
        simulated = simulated_hardware(node, root, settings)
        log.info(
            "simulating hardware",
            extra={"scenario": scenario.name, "source": scenario.source, "sysfs": str(root)},
        )
        yield simulated
    finally:
        node.release_hangs()
        shutil.rmtree(root, ignore_errors=True)


def list_scenarios() -> list[str]:
    """The built-in scenarios, one `name<TAB>description` line each (`--simulate list`)."""
    return [f"{name}\t{load_scenario(name).description}" for name in builtin_names()]
