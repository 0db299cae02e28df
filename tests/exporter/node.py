"""A simulated node's whole exposition, collected once without the engine or HTTP.

Shared by the exposition tests (each collector's golden together) and the lean-profile
tests (the full exposition against the lean one), so neither test module imports the other.
"""

from __future__ import annotations

from pathlib import Path

from fleetwatch.cli import build_parser
from fleetwatch.collectors import COLLECTORS
from fleetwatch.collectors.storage import StorageCollector
from fleetwatch.exporter.export import close_collectors, create_collectors
from fleetwatch.exporter.render import Renderer
from fleetwatch.exporter.settings import ExportSettings
from fleetwatch.sim.exporter_hardware import simulated_hardware
from fleetwatch.sim.scenario import load_scenario
from fleetwatch.sim.world import SimulatedNode
from testbed.clock import FixedClock


def collect_node(scenario: str, at: float, workdir: Path, *flags: str) -> str:
    """Every default collector's exposition for `scenario` at simulated time `at`."""
    node = SimulatedNode(scenario=load_scenario(scenario), clock=FixedClock(at))
    root = workdir / f"sysfs-{scenario}-{at:g}"
    args = build_parser().parse_args(["export", f"--simulate={scenario}", *flags])
    hardware = simulated_hardware(node, root, ExportSettings.from_args(args, COLLECTORS))
    collectors = create_collectors(hardware.context, hardware.settings)
    storage = collectors.get("storage")
    if isinstance(storage, StorageCollector):
        # A cycle waits 50 ms for the mounts' calls, then reports what answered: on a loaded
        # machine a first call can take longer, and one collection would lack its series.
        storage._wait = 30.0
    try:
        parts = [Renderer().render(c.collect()) for c in collectors.values()]
    finally:
        close_collectors(collectors)
    return b"".join(parts).decode()
