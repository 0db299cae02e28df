"""Simulator fault kinds: one type per kind in `FAULT_KINDS` holds its keys (its fields),
validation, docs and effect, so a new kind is its class and its table entry and nothing
else."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest

import generate
from fleetwatch.sim import scenario as scenario_module
from fleetwatch.sim import world as world_module
from fleetwatch.sim.fault_base import Fault, GpuFault, Readings
from fleetwatch.sim.fault_params import SECONDS, number
from fleetwatch.sim.faults import FAULT_KINDS
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

    celsius: float = field(metadata=number("held temperature", low=0, high=50))
    seconds: float | None = field(default=None, metadata=SECONDS)

    def temperature(self, gpu: int, value: float, t: float, node: Readings) -> float:
        return self.celsius if gpu == self.gpu and self.active(t) else value


def scenario_with(
    faults: list[dict[str, Any]], kinds: Any = FAULT_KINDS, *, mounts: bool = False
) -> Any:
    node = {**NODE, "mounts": [{"mountpoint": "/ckpt"}]} if mounts else NODE
    return parse_scenario({**node, "faults": faults}, source="test.yaml", name="t", kinds=kinds)


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
    keys = fault.scenario_keys()
    assert all(k.param.meaning and k.param.bounds for k in keys)
    fields = [f.name for f in dataclasses.fields(fault) if f.name != "at"]
    assert [k.name for k in keys] == fields, "a field no scenario key sets"
    assert any(getattr(fault, hook) is not getattr(Fault, hook) for hook in EFFECT_HOOKS)
    assert f"| `{kind}` |" in generate.fault_table()


@pytest.mark.parametrize("kind", list(FAULT_KINDS))
def test_every_kind_names_its_first_missing_key(kind: str) -> None:
    first = min(k.name for k in FAULT_KINDS[kind].scenario_keys() if k.required)
    with pytest.raises(ScenarioError, match=rf"faults\[0\]\.{first}: required key is missing"):
        scenario_with([{"at": 1, "kind": kind}])


# A valid value of every key any kind has (the error counter by kind: each has its own set).
SAMPLE: dict[str, Any] = {
    "gpu": 1,
    "link": 2,
    "device": "mlx5_0",
    "port": 2,
    "mountpoint": "/ckpt",
    "call": "nvmlInit",
    "celsius": 90,
    "per_second": 1,
    "value": 0.5,
    "xid": 79,
    "reason": "hw_slowdown",
    "factor": 2,
    "bytes_per_second": 1,
    "mode": "enabled",
    "slot": 0,
    "seconds": 5,
}
ERRORS = {"nvlink_errors": "replay", "ib_errors": "symbol", "ecc_errors": "corrected"}


@pytest.mark.parametrize("kind", list(FAULT_KINDS))
def test_a_kind_lasts_its_seconds_or_to_the_end(kind: str) -> None:
    keys = FAULT_KINDS[kind].scenario_keys()
    names = {k.name for k in keys if k.required or k.name == "seconds"}
    values = {**SAMPLE, "error": ERRORS.get(kind, "pending")}
    entry = {"at": 10, "kind": kind} | {name: values[name] for name in names}
    [fault] = scenario_with([entry], mounts=True).faults
    assert fault.active(10)
    assert fault.active(14.9)
    assert fault.active(15) is ("seconds" not in names)


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
