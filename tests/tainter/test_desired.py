"""The desired state indexed by node: a node's sync sees its own intents only, and a node
with none left holds no entry (memory bounded by the intents, whatever the node names)."""

from __future__ import annotations

from fleetwatch.tainter.desired import Intents
from fleetwatch.tainter.payload import parse_webhook
from tests.tainter.conftest import alert, resolved, webhook


def intents() -> Intents:
    return Intents(resolved_seconds=3600.0, resolved_size=100)


def test_each_node_sees_only_its_own_intents() -> None:
    state = intents()
    touched = state.record(
        parse_webhook(
            webhook(alert("gpu-1"), alert("gpu-1", reason="xid"), alert("gpu-2", reason="xid"))
        ),
        now=100.0,
    )
    assert touched == {"gpu-1", "gpu-2"}
    assert sorted(state.on("gpu-1")) == ["fleetwatch.io/gpu-overheat", "fleetwatch.io/xid"]
    assert list(state.on("gpu-2")) == ["fleetwatch.io/xid"]
    assert dict(state.on("gpu-3")) == {}
    assert len(state) == 3


def test_a_node_whose_last_intent_goes_leaves_no_entry() -> None:
    state = intents()
    state.record(parse_webhook(webhook(alert("gpu-1"), alert("gpu-2"))), now=100.0)
    state.forget("gpu-1", "fleetwatch.io/gpu-overheat")
    state.forget_node("gpu-2")
    assert state.nodes() == set()
    assert len(state) == 0
    assert state.all() == []


def test_an_instance_missing_from_alertmanager_is_resolved_and_remembered() -> None:
    state = intents()
    state.record(parse_webhook(webhook(alert("gpu-1"), alert("gpu-2"))), now=100.0)
    active = parse_webhook(webhook(alert("gpu-2")))
    state.resolve_missing(active, now=200.0)
    (gone,) = state.on("gpu-1").values()
    assert (gone.firing, gone.last_firing) == ({}, 200.0)
    assert state.on("gpu-2")["fleetwatch.io/gpu-overheat"].firing  # still active: kept
    # The late (retried) firing of the instance taken for resolved does not want it again.
    assert state.record(parse_webhook(webhook(alert("gpu-1"))), now=300.0) == set()
    assert state.record(parse_webhook(webhook(resolved("gpu-2"))), now=300.0) == {"gpu-2"}
