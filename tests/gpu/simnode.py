"""A simulated node's NVML for the GPU tests: fake NVML + shared source at a fixed time."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pynvml

from fleetwatch.collectors.families import SeriesFamily
from fleetwatch.collectors.sources.nvml import NvmlSource
from fleetwatch.exporter.render import Renderer
from fleetwatch.sim.fake_nvml import FakeNvml
from fleetwatch.sim.fault_base import Fault
from fleetwatch.sim.nvml_records import FakeEventSet, FakeGpmSample, FakeHandle
from fleetwatch.sim.scenario import load_scenario
from fleetwatch.sim.world import SimulatedNode
from testbed.clock import FixedClock


class ControlledNvml(FakeNvml):
    """The fake NVML with the tests' controls: a failure injected into any call, the
    profiling counters held by another tool, an Xid delivered now; and every event set
    created, to inspect."""

    def __init__(self, *, node: SimulatedNode) -> None:
        super().__init__(node=node)
        self._failures: dict[tuple[str, int | None], type[pynvml.NVMLError]] = {}
        self._profiling_held = False
        self._injected: deque[tuple[int, int]] = deque()
        self.event_sets: list[FakeEventSet] = []

    def fail(self, call: str, *, error: type[pynvml.NVMLError], gpu: int | None = None) -> None:
        """Make `call` raise `error` (on one GPU, or every GPU when `gpu` is None)."""
        self._failures[(call, gpu)] = error

    def clear_failures(self) -> None:
        self._failures.clear()

    def hold_profiling(self, held: bool) -> None:
        """Simulate another tool (Nsight, DCGM profiling) holding the profiling counters."""
        self._profiling_held = held

    def inject_xid(self, gpu: int, xid: int) -> None:
        """Deliver an Xid event to every registered event set, now."""
        with self._wake:
            self._injected.append((gpu, xid))
            self._wake.notify_all()

    def _enter(self, call: str, handle: FakeHandle | None) -> int | None:
        gpu = None if handle is None else handle.index
        error = self._failures.get((call, gpu)) or self._failures.get((call, None))
        if error is not None:
            raise error()
        return super()._enter(call, handle)

    def nvmlGpmSampleGet(self, handle: FakeHandle, sample: FakeGpmSample) -> FakeGpmSample:
        taken = super().nvmlGpmSampleGet(handle, sample)
        if self._profiling_held:
            raise pynvml.NVMLError_InUse()
        return taken

    def nvmlEventSetCreate(self) -> FakeEventSet:
        events = super().nvmlEventSetCreate()
        self.event_sets.append(events)
        return events

    def _next_event(self, events: FakeEventSet) -> tuple[int, int] | None:
        while self._injected:
            gpu, xid = self._injected.popleft()
            if gpu in events.gpus:
                return gpu, xid
        return super()._next_event(events)


def simulated(
    scenario: str = "dgx-h100", *, at: float = 120.0, faults: tuple[Fault, ...] = (), **changes: Any
) -> tuple[ControlledNvml, NvmlSource]:
    """The fake NVML of a built-in scenario (plus extra faults) frozen at time `at`."""
    base = load_scenario(scenario)
    spec = replace(base, faults=base.faults + faults, **changes)
    fake = ControlledNvml(node=SimulatedNode(scenario=spec, clock=FixedClock(at)))
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
