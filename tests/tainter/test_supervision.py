"""Supervised loops: Prometheus answering null data, HTML, 500 and timeouts, and the API
failing, are logged, counted and retried while `/healthz` stays ok; a loop stuck forever
makes `/healthz` fail so the kubelet restarts the process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from fleetwatch.promclient import PrometheusAccess, PrometheusClientSettings
from fleetwatch.sim.kubeapi import FakeCluster
from fleetwatch.tainter.controller import Controller
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import AlertState, parse_webhook
from fleetwatch.tainter.server import Background, make_app
from fleetwatch.tainter.sources import PrometheusEvidence
from fleetwatch.tainter.supervise import Supervisor
from tests.tainter.conftest import Client, ControllerFactory, alert, keys, resolved, webhook


class FakePrometheus:
    """`/api/v1/query` answering whatever `mode` says: the shapes a real outage produces."""

    def __init__(self) -> None:
        self.mode = "clear"
        self.queries = 0

    async def query(self, _: web.Request) -> web.Response:
        self.queries += 1
        if self.mode == "null":
            return web.json_response({"status": "success", "data": None})
        if self.mode == "html":
            return web.Response(text="<html><body>502 Bad Gateway</body></html>", status=200)
        if self.mode == "500":
            return web.json_response({"status": "error", "error": "boom"}, status=500)
        if self.mode == "scalar":
            return web.json_response(
                {"status": "success", "data": {"resultType": "scalar", "result": [1, "1"]}}
            )
        if self.mode == "slow":
            await asyncio.sleep(5)
        return web.json_response(
            {
                "status": "success",
                "data": {"resultType": "vector", "result": [{"metric": {}, "value": [0, "1"]}]},
            }
        )


@pytest.fixture
async def prometheus() -> AsyncIterator[tuple[FakePrometheus, str]]:
    fake = FakePrometheus()
    app = web.Application()
    app.router.add_get("/api/v1/query", fake.query)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield fake, str(server.make_url("")).rstrip("/")
    await server.close()


async def until(probe: Callable[[], Awaitable[bool]], *, what: str, timeout: float = 10.0) -> None:
    """Poll `probe` with a deadline (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def sample(metrics: TainterMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@contextlib.asynccontextmanager
async def serving(
    controller: Controller, metrics: TainterMetrics, supervisor: Supervisor
) -> AsyncIterator[Client]:
    """The app with its background loops every 50 ms, served until the block ends."""
    app = make_app(
        controller=controller,
        metrics=metrics,
        auth=None,
        max_body_bytes=1024,
        background=Background(reconcile_interval=0.05, breaker_interval=0.05),
        supervisor=supervisor,
    )
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def test_prometheus_and_api_failures_are_counted_and_the_loop_keeps_running(
    make_controller: ControllerFactory,
    cluster: FakeCluster,
    prometheus: tuple[FakePrometheus, str],
) -> None:
    fake, url = prometheus
    metrics = TainterMetrics()
    async with aiohttp.ClientSession() as session:
        evidence = PrometheusEvidence(
            session=session,
            access=PrometheusAccess(PrometheusClientSettings(url=url)),
            queries={"gpu-overheat": 'up{node="$node"} == 1'},
            metrics=metrics,
            timeout=0.2,
        )
        controller = make_controller(metrics=metrics, evidence_source=evidence)
        fake.mode = "null"
        await controller.handle_alerts(parse_webhook(webhook(alert("gpu-1"))))
        await controller.handle_alerts(parse_webhook(webhook(resolved("gpu-1"))))
        supervisor = Supervisor(metrics=metrics, stall_intervals=5, stall_grace=2.0)
        async with serving(controller, metrics, supervisor) as client:
            for mode in ("null", "html", "500", "scalar", "slow"):
                fake.mode = mode
                errors = sample(
                    metrics, "fleetwatch_tainter_source_errors_total", source="prometheus"
                )

                async def counted(before: float = errors) -> bool:
                    now = sample(
                        metrics, "fleetwatch_tainter_source_errors_total", source="prometheus"
                    )
                    return now >= before + 2

                await until(counted, what=f"Prometheus errors counted in mode {mode}")
                assert (await client.get("/healthz")).status == 200, mode
                again = await client.post("/alerts", json=webhook(resolved("gpu-1")))
                assert again.status == 200, mode  # the node's webhooks keep working
                assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"], mode

            fake.mode = "clear"
            cluster.faults.outage = True  # now the API fails: the loop iteration itself fails

            async def loop_failed() -> bool:
                return (
                    sample(metrics, "fleetwatch_tainter_reconcile_errors_total", loop="reconcile")
                    >= 2
                )

            await until(loop_failed, what="reconcile errors counted")
            assert (await client.get("/healthz")).status == 200
            cluster.faults.outage = False

            async def untainted() -> bool:
                return keys(cluster, "gpu-1") == []

            await until(untainted, what="the taint removed once Prometheus recovered")
            assert (
                sample(
                    metrics,
                    "fleetwatch_tainter_reconcile_last_success_timestamp_seconds",
                    loop="reconcile",
                )
                > time.time() - 10
            )
            assert (await client.get("/healthz")).status == 200


class StuckAlerts:
    """An Alertmanager source whose call never returns (a wedged connection)."""

    async def firing_alerts(self) -> list[AlertState]:
        await asyncio.Event().wait()
        return []


async def test_a_loop_stuck_forever_fails_healthz(make_controller: ControllerFactory) -> None:
    metrics = TainterMetrics()
    controller = make_controller(metrics=metrics, alert_source=StuckAlerts())
    supervisor = Supervisor(metrics=metrics, stall_intervals=3, stall_grace=0.0)
    async with serving(controller, metrics, supervisor) as client:

        async def unhealthy() -> bool:
            return (await client.get("/healthz")).status == 503

        await until(unhealthy, what="/healthz to fail")
        body = await (await client.get("/healthz")).text()
        assert "reconcile loop" in body
        assert "breaker loop" not in body  # the other loop is fine
