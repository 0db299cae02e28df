"""Simulator fault kinds: one type per kind in `FAULT_KINDS` holds its keys, validation,
docs and effect, so a new kind is its class and its table entry and nothing else."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

import pytest

import generate
from fleetwatch.sim import scenario as scenario_module
from fleetwatch.sim import world as world_module
from fleetwatch.sim.faults import (
    FAULT_KINDS,
    SECONDS,
    Fault,
    GpuFault,
    Readings,
    gpu_index,
    number,
)
from fleetwatch.sim.scenario import ScenarioError, parse_scenario
from fleetwatch.sim.world import SimulatedNode
from testbed.clock import FixedClock

NODE: dict[str, Any] = {
    "gpus": 4,
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "nvlinks_per_gpu": 18,
    "infiniband": [{"device": "mlx5_0", "ports": 2}],
}
# The hooks a kind may override to change what the simulated node reads.
EFFECT_HOOKS = frozenset(
    name
    for name, member in vars(Fault).items()
    if inspect.isfunction(member)
    and not name.startswith("_")
    and name not in {"check_references", "active", "elapsed_active"}
)


@dataclass(frozen=True, kw_only=True)
class Freeze(GpuFault):
    """Holds a GPU's temperature at `celsius` (a kind only this test knows)."""

    KIND = "freeze"
    PARAMS = (gpu_index(), number("celsius", "held temperature", low=0, high=50), SECONDS)

    celsius: float

    def temperature(self, gpu: int, value: float, t: float, node: Readings) -> float:
        return self.celsius if gpu == self.gpu and self.active(t) else value


def scenario_with(faults: list[dict[str, Any]], kinds: Any = FAULT_KINDS) -> Any:
    return parse_scenario({**NODE, "faults": faults}, source="test.yaml", name="t", kinds=kinds)


def test_a_new_kind_is_its_type_and_its_table_entry() -> None:
    kinds = {**FAULT_KINDS, Freeze.KIND: Freeze}
    scenario = scenario_with([{"at": 10, "kind": "freeze", "gpu": 1, "celsius": 20}], kinds)
    assert scenario.faults == (Freeze(at=10.0, gpu=1, celsius=20.0),)
    assert SimulatedNode(scenario=scenario, clock=FixedClock(5)).gpu_temperature(1) > 50
    frozen = SimulatedNode(scenario=scenario, clock=FixedClock(30))
    assert frozen.gpu_temperature(1) == 20.0
    assert frozen.gpu_temperature(0) > 50
    with pytest.raises(ScenarioError, match=r"^test\.yaml: faults\[0\]\.celsius: 90 is out of"):
        scenario_with([{"at": 1, "kind": "freeze", "gpu": 1, "celsius": 90}], kinds)
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.kind: 'freeze' is not one of"):
        scenario_with([{"at": 1, "kind": "freeze", "gpu": 1, "celsius": 20}])
    row = "| `freeze` | `gpu`: GPU index (0..`gpus`-1); `celsius`: held temperature (0..50); "
    assert row in generate.fault_table(kinds)


@pytest.mark.parametrize("kind", list(FAULT_KINDS))
def test_every_kind_declares_keys_docs_and_an_effect(kind: str) -> None:
    assert len(EFFECT_HOOKS) > 10
    fault = FAULT_KINDS[kind]
    assert kind == fault.KIND
    assert fault.effect()
    assert not fault.effect().startswith(f"{fault.__name__}("), "no docstring of its own"
    names = [p.name for p in fault.PARAMS]
    assert len(names) == len(set(names))
    assert all(p.meaning and p.bounds for p in fault.PARAMS)
    fields = {f.name for f in dataclasses.fields(fault)} - {"at"}
    assert set(names) <= fields
    assert fields - set(names) <= {"seconds"}, "a field no scenario key sets"
    assert any(getattr(fault, hook) is not getattr(Fault, hook) for hook in EFFECT_HOOKS)
    assert f"| `{kind}` |" in generate.fault_table()


@pytest.mark.parametrize("kind", list(FAULT_KINDS))
def test_every_kind_names_its_first_missing_key(kind: str) -> None:
    first = min(p.name for p in FAULT_KINDS[kind].PARAMS if p.required)
    with pytest.raises(ScenarioError, match=rf"faults\[0\]\.{first}: required key is missing"):
        scenario_with([{"at": 1, "kind": kind}])


@pytest.mark.parametrize("module", [scenario_module, world_module])
def test_the_loader_and_the_node_branch_on_no_kind(module: object) -> None:
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    nodes = list(ast.walk(tree))
    compared = {
        c.value
        for n in nodes
        if isinstance(n, ast.Compare | ast.MatchValue)
        for c in ast.walk(n)
        if isinstance(c, ast.Constant)
    }
    assert not compared & FAULT_KINDS.keys()
    assert not {n.attr for n in nodes if isinstance(n, ast.Attribute)} & {"kind", "KIND"}
    types = {kind.__name__ for kind in FAULT_KINDS.values()}
    assert not {n.id for n in nodes if isinstance(n, ast.Name)} & types
    assert not {a.name for n in nodes if isinstance(n, ast.ImportFrom) for a in n.names} & types
