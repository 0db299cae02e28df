"""The tainter's positive evidence from a real Prometheus behind the fault proxy: an answer
slower than the deadline, a 503, a 500 and an answer marked as partial data (`warnings`)
each keep the taint, counted and logged; the first complete answer lifts it. One Prometheus
and one proxy for the module.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from fleetwatch.promclient import PrometheusAccess, PrometheusClientSettings
from fleetwatch.sim.kubeapi import FakeCluster
from fleetwatch.sim.loopback_servers import Server, prometheus
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import parse_webhook
from fleetwatch.tainter.sources import PrometheusEvidence
from testbed.fault_proxy import Fault, FaultProxy
from tests.tainter.conftest import ControllerFactory, alert, keys, resolved, webhook

pytestmark = pytest.mark.integration

QUERY = r"^/api/v1/query\?"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with prometheus(tmp_path_factory.mktemp("prometheus"), scrape_configs=[]) as server:
        yield server


@pytest.fixture(scope="module")
def proxied(prom: Server) -> Iterator[tuple[FaultProxy, str]]:
    proxy = FaultProxy(upstream=prom.url)
    with proxy.serve() as url:
        yield proxy, url


@pytest.fixture
def proxy(proxied: tuple[FaultProxy, str]) -> FaultProxy:
    proxied[0].clear()
    return proxied[0]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened:
        yield opened


async def test_no_untaint_on_slow_erroring_or_partial_evidence(
    make_controller: ControllerFactory,
    cluster: FakeCluster,
    proxied: tuple[FaultProxy, str],
    proxy: FaultProxy,
    session: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    metrics = TainterMetrics()
    evidence = PrometheusEvidence(
        session=session,
        access=PrometheusAccess(PrometheusClientSettings(url=proxied[1])),
        queries={"gpu-overheat": "vector(1)"},  # clear, whenever Prometheus answers fully
        metrics=metrics,
        timeout=1.0,
    )
    control = make_controller(metrics=metrics, evidence_source=evidence)
    await control.handle_alerts(parse_webhook(webhook(alert("gpu-1"))))
    proxy.add(
        Fault.delay(2.0, path=QUERY),  # past the 1 s deadline
        Fault.answer(503, path=QUERY),
        Fault.answer(500, path=QUERY),
        Fault.warn("remote read: store unreachable; partial data", path=QUERY),
    )
    await control.handle_alerts(parse_webhook(webhook(resolved("gpu-1"))))
    for _ in range(3):
        await control.reconcile()
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]
    assert [s.fault for s in proxy.seen(path=QUERY)] == ["delay", "answer", "answer", "warn"]
    failed = metrics.registry.get_sample_value(
        "fleetwatch_tainter_source_errors_total", {"source": "prometheus"}
    )
    assert failed == 4
    deferred = metrics.registry.get_sample_value(
        "fleetwatch_tainter_untaint_deferred_total", {"why": "evidence"}
    )
    assert deferred == 4
    errors = [
        str(getattr(r, "error", ""))
        for r in caplog.records
        if r.getMessage() == "cannot read positive evidence; taint kept"
    ]
    assert len(errors) == 4
    assert "partial data" in errors[-1]
    await control.reconcile()  # Prometheus answers in full: lifted
    assert keys(cluster, "gpu-1") == []


def test_the_proxy_marks_a_real_answer_partial(proxied: tuple[FaultProxy, str]) -> None:
    """The `warn` fault keeps Prometheus' own answer and adds the warning (so the test above
    checks the tainter, not the proxy)."""
    proxied[0].clear()
    proxied[0].add(Fault.warn("partial", path=QUERY))
    with urllib.request.urlopen(f"{proxied[1]}/api/v1/query?query=vector(7)", timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success"
    assert body["warnings"] == ["partial"]
    assert body["data"]["result"][0]["value"][1] == "7"
