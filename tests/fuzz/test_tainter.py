"""What the tainter is sent and told, fuzzed: Alertmanager webhook bodies (version 4, as
Alertmanager writes them: tests/tainter's shape) as JSON trees and as raw bytes, Alertmanager's
answer to its list of active alerts (API v2, served over HTTP), and Prometheus' answers to its
clear-condition queries. A body is taint requests or `PayloadError`, an alerts answer taint
requests or `SourceError`; every request names a valid node, reason and effect."""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

import aiohttp
import pytest
from hypothesis import given

from fleetwatch.k8snames import is_label_value, is_node_name, is_taint_reason
from fleetwatch.promclient import PrometheusAccess, PrometheusClientSettings
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import EFFECTS, AlertState, PayloadError, parse_webhook
from fleetwatch.tainter.sources import (
    AlertmanagerAlerts,
    EvidenceResult,
    PrometheusEvidence,
    SourceError,
    _vector,
)
from tests.fuzz.harness import FUZZ, FUZZ_COSTLY, exercise, named
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


def _active(alert: dict[str, Any]) -> dict[str, Any]:
    """An alert as Alertmanager's `GET /api/v2/alerts` lists it."""
    return {
        "labels": alert["labels"],
        "annotations": alert["annotations"],
        "startsAt": alert["startsAt"].replace("Z", "+00:00"),
        "endsAt": "2026-12-01T10:05:00+00:00",
        "updatedAt": "2026-12-01T10:01:00+00:00",
        "fingerprint": alert["fingerprint"],
        "receivers": [{"name": "fleetwatch"}],
        "status": {"state": "active", "silencedBy": [], "inhibitedBy": [], "mutedBy": []},
        "generatorURL": alert["generatorURL"],
    }


ACTIVE: Final[tuple[list[dict[str, Any]], ...]] = (
    [
        _active(_alert("gpu-node-1", "gpu-overheat")),
        _active(_alert("gpu-node-2", "xid-fatal", fleetwatch_taint_effect="NoExecute")),
        _active({**_alert("gpu-node-3", ""), "labels": {"alertname": "Other", "node": "x"}}),
    ],
    [],
)


class _Answer(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the bytes the test put in `server.body`."""

    def do_GET(self) -> None:
        body: bytes = self.server.body  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet: one request per example."""


@pytest.fixture(scope="module")
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    """An HTTP server answering every GET with the bytes `_serve` gave it: Alertmanager or
    Prometheus, as the test's bytes say."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _serve(server: http.server.ThreadingHTTPServer, raw: bytes) -> str:
    """Have `server` answer `raw` from now on; its URL."""
    server.body = raw  # type: ignore[attr-defined]
    return f"http://127.0.0.1:{server.server_address[1]}"


async def _firing(url: str) -> list[AlertState]:
    async with aiohttp.ClientSession() as session:
        return await AlertmanagerAlerts(session=session, url=url).firing_alerts()


@FUZZ_COSTLY
@given(mutated_bytes([json.dumps(answer).encode() for answer in ACTIVE], huge=65536))
def test_alertmanager_alerts_answer(server: http.server.ThreadingHTTPServer, raw: bytes) -> None:
    url = _serve(server, raw)
    exercise(
        "Alertmanager alerts answer (tainter)",
        lambda _: asyncio.run(_firing(url)),
        None,
        errors=(SourceError,),
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


@functools.cache
def _access(url: str) -> PrometheusAccess:
    """One client's access for the run: building its TLS context costs a tenth of a second."""
    return PrometheusAccess(PrometheusClientSettings(url=url))


async def _evidence(url: str) -> EvidenceResult:
    async with aiohttp.ClientSession() as session:
        evidence = PrometheusEvidence(
            session=session,
            access=_access(url),
            queries={"gpu-overheat": "up == 1"},
            metrics=TainterMetrics(),
        )
        return await evidence.condition_clear(node="gpu-node-1", reason="gpu-overheat")


def _evidence_holds(raw: bytes) -> Callable[[EvidenceResult], None]:
    """Clear only on a complete, successful answer (no taint lifted on a broken one);
    otherwise the reason, named."""

    def holds(result: EvidenceResult) -> None:
        if result.clear:
            body = json.loads(raw)
            assert body["status"] == "success"
            assert not body.get("warnings")
        else:
            named(result.detail)

    return holds


@FUZZ_COSTLY
@given(mutated_bytes([json.dumps(answer).encode() for answer in ANSWERS], huge=65536))
def test_prometheus_answer_bytes_to_the_tainter(
    server: http.server.ThreadingHTTPServer, raw: bytes
) -> None:
    """The bytes, over HTTP, through the tainter's evidence source."""
    url = _serve(server, raw)
    exercise(
        "Prometheus answer bytes (tainter)",
        lambda _: asyncio.run(_evidence(url)),
        None,
        malformed=lambda result: not result.clear and "failed" in result.detail,
        holds=_evidence_holds(raw),
    )


def test_answers_nested_too_deep_or_not_utf8_are_source_failures(
    server: http.server.ThreadingHTTPServer,
) -> None:
    """Found by the fuzzer: JSON nested 100000 deep raised RecursionError out of both readers
    (into the reconcile loop), and the repr of a UnicodeDecodeError quoted the whole answer."""
    for raw in (b"[" * 100000, json.dumps(ACTIVE[0]).encode("utf-16")):
        url = _serve(server, raw)
        with pytest.raises(SourceError) as raised:
            asyncio.run(_firing(url))
        named(str(raised.value))
        result = asyncio.run(_evidence(url))
        assert not result.clear
        named(result.detail)
