"""What the tainter is sent and told, fuzzed: Alertmanager webhook bodies (version 4, as
Alertmanager writes them: tests/tainter's shape) as JSON trees and as raw bytes, and
Prometheus' answers to its clear-condition queries. A body is taint requests or
`PayloadError`; every request names a valid node, reason and effect."""

from __future__ import annotations

import json
from typing import Any, Final

import pytest
from hypothesis import given

from fleetwatch.k8snames import is_label_value, is_node_name, is_taint_reason
from fleetwatch.tainter.payload import EFFECTS, AlertState, PayloadError, parse_webhook
from fleetwatch.tainter.sources import _vector
from tests.fuzz.harness import FUZZ, exercise, named
from tests.fuzz.mutations import mutated_bytes, mutated_tree


def _alert(node: str, reason: str, status: str = "firing", **labels: str) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": "GPUOverheating", "node": node, "fleetwatch_taint": reason}
        | labels,
        "annotations": {"summary": "hot"},
        "startsAt": "2026-12-01T10:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-12-01T10:01:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": f"fp-{node}-{reason}",
    }


BODIES: Final = tuple(
    {
        "version": "4",
        "groupKey": '{}:{alertname="GPUOverheating"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "fleetwatch",
        "groupLabels": {"alertname": "GPUOverheating"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": alerts,
    }
    for alerts in (
        [_alert("gpu-node-1", "gpu-overheat")],
        [
            _alert("gpu-node-2", "xid-fatal", fleetwatch_taint_effect="NoExecute"),
            _alert("gpu-node-1", "gpu-overheat", status="resolved"),
            {**_alert("gpu-node-3", ""), "labels": {"alertname": "Other", "node": "x"}},
        ],
        [],
    )
)


def requests_hold(states: list[AlertState]) -> None:
    for state in states:
        assert is_node_name(state.node)
        assert is_taint_reason(state.reason)
        assert state.effect in EFFECTS
        assert is_label_value(state.alertname)
        assert state.fingerprint
        assert state.starts_at.tzinfo is not None


@FUZZ
@given(mutated_tree(BODIES))
def test_webhook_body(body: Any) -> None:
    exercise(
        "Alertmanager webhook body",
        parse_webhook,
        body,
        errors=(PayloadError,),
        holds=requests_hold,
    )


def _decoded(raw: bytes) -> list[AlertState]:
    """The receiver's path: the bytes as JSON (its errors answered 400), then the body."""
    return parse_webhook(json.loads(raw))


@FUZZ
@given(mutated_bytes([json.dumps(body).encode() for body in BODIES], huge=65536))
def test_webhook_bytes(raw: bytes) -> None:
    exercise(
        "Alertmanager webhook bytes",
        _decoded,
        raw,
        errors=(PayloadError, ValueError, RecursionError),
        holds=requests_hold,
    )


ANSWERS: Final = (
    {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"node": "gpu-node-1"}, "value": [1764720000.0, "1"]}],
        },
    },
    {"status": "success", "data": {"resultType": "vector", "result": []}},
    {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"},
    {"status": "success", "data": {"resultType": "scalar", "result": [1764720000.0, "1"]}},
)


def vector_holds(found: list[Any] | str) -> None:
    """A vector's samples, or the reason the answer is not one (logged and counted)."""
    if isinstance(found, str):
        named(found)
    else:
        assert isinstance(found, list)


@FUZZ
@given(mutated_tree(ANSWERS))
def test_prometheus_answer_to_the_tainter(body: Any) -> None:
    exercise(
        "Prometheus answer (tainter)",
        _vector,
        body,
        malformed=lambda found: isinstance(found, str),
        holds=vector_holds,
    )


def test_bad_values_are_named_by_an_excerpt() -> None:
    """Found by the fuzzer (`named`): a webhook body's version, status, time or label value
    and a Prometheus answer's status were quoted whole in the 400 answer and the log."""
    huge = "x" * 65536
    alert = _alert("gpu-node-1", "gpu-overheat")
    changed = [{"status": huge}, {"startsAt": huge}]
    changed += [{"labels": alert["labels"] | {label: huge}} for label in ("node", "alertname")]
    changed.append({"labels": alert["labels"] | {"fleetwatch_taint_effect": huge}})
    bodies = [{**BODIES[0], "version": huge}]
    bodies += [{**BODIES[0], "alerts": [alert | change]} for change in changed]
    for body in bodies:
        with pytest.raises(PayloadError) as raised:
            parse_webhook(body)
        named(str(raised.value))
    why = _vector({"status": huge, "error": huge})
    assert isinstance(why, str)
    named(why)
