"""A simulated node's NVML for the GPU tests: fake NVML + shared source at a fixed time."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from fleetwatch.collectors.metrics import SeriesFamily
from fleetwatch.collectors.sim.fake_nvml import FakeNvml
from fleetwatch.collectors.sim.scenario import Fault, load_scenario
from fleetwatch.collectors.sim.world import FixedClock, SimulatedNode
from fleetwatch.collectors.sources.nvml import NvmlSource
from fleetwatch.exporter.render import Renderer


def simulated(
    scenario: str = "dgx-h100", *, at: float = 120.0, faults: tuple[Fault, ...] = (), **changes: Any
) -> tuple[FakeNvml, NvmlSource]:
    """The fake NVML of a built-in scenario (plus extra faults) frozen at time `at`."""
    base = load_scenario(scenario)
    spec = replace(base, faults=base.faults + faults, **changes)
    fake = FakeNvml(node=SimulatedNode(scenario=spec, clock=FixedClock(at)))
    return fake, NvmlSource(lib=fake)


def samples(
    families: Iterable[SeriesFamily], name: str
) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of family `name` (counter names without `_total`) by sorted label items."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in families
        if family.name == name.removesuffix("_total")
        for s in family.to_metric().samples
    }


def text(families: Iterable[SeriesFamily]) -> str:
    return Renderer().render(families).decode()
