"""The webhook receiver: `POST /alerts` from Alertmanager, plus health, metrics, reset.

Answers follow Alertmanager's retry rules: 2xx when the notification was applied (or
deliberately refused by the breaker), 4xx with a reason for requests that can never
succeed (wrong token, not JSON, not a version 4 payload, a taint alert without a node),
5xx when the Kubernetes API failed so Alertmanager retries. A 4xx changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from aiohttp import web
from fleetwatch.tainter.controller import Controller, NodeSyncError
from fleetwatch.tainter.kube import ApiError
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import PayloadError, parse_webhook
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)

CONTROLLER_KEY: Final = web.AppKey("controller", Controller)
METRICS_KEY: Final = web.AppKey("metrics", TainterMetrics)
TOKEN_KEY: Final = web.AppKey("token", bytes)
WAKE_KEY: Final = web.AppKey("wake", asyncio.Event)
MAX_BODY_KEY: Final = web.AppKey("max_body_bytes", int)


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"status": "error", "error": reason}, status=status)


def _authorized(request: web.Request) -> bool:
    token = request.app[TOKEN_KEY]
    if not token:
        return True  # started with the explicit insecure flag
    header = request.headers.get("Authorization", "").encode()
    return hmac.compare_digest(header, b"Bearer " + token)


async def _alerts(request: web.Request) -> web.Response:
    metrics = request.app[METRICS_KEY]
    started = time.perf_counter()
    try:
        response, result = await _handle_alerts(request)
    finally:
        metrics.webhook_duration.observe(time.perf_counter() - started)
    metrics.webhook_requests.labels(result=result).inc()
    return response


async def _handle_alerts(request: web.Request) -> tuple[web.Response, str]:
    if not _authorized(request):
        return _error(401, "missing or wrong bearer token"), "unauthorized"
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[MAX_BODY_KEY]
        return _error(413, f"body larger than {limit} bytes"), "too_large"
    try:
        body = json.loads(raw)
    except ValueError as exc:
        return _error(400, f"body is not JSON: {exc}"), "bad_request"
    try:
        alerts = parse_webhook(body)
    except PayloadError as exc:
        log.warning("webhook rejected", extra={"error": str(exc)})
        return _error(400, str(exc)), "bad_request"
    try:
        await request.app[CONTROLLER_KEY].handle_alerts(alerts)
    except (NodeSyncError, ApiError) as exc:
        return _error(503, f"Kubernetes API failed, retry later: {exc}"), "api_error"
    return web.json_response({"status": "ok", "alerts": len(alerts)}), "ok"


async def _breaker_reset(request: web.Request) -> web.Response:
    if not _authorized(request):
        return _error(401, "missing or wrong bearer token")
    request.app[CONTROLLER_KEY].reset_breaker()
    request.app[WAKE_KEY].set()
    return web.json_response({"status": "ok", "breaker_open": False})


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def reconcile_forever(
    *,
    controller: Controller,
    metrics: TainterMetrics,
    interval: float,
    wake: asyncio.Event,
) -> None:
    """Reconcile now, then every `interval` seconds or as soon as `wake` is set."""
    while True:
        try:
            await controller.reconcile()
            metrics.reconciles.labels(result="ok").inc()
        except (NodeSyncError, ApiError) as exc:
            metrics.reconciles.labels(result="error").inc()
            log.error("reconcile failed; will retry", extra={"error": str(exc)})
        wake.clear()
        try:
            await asyncio.wait_for(wake.wait(), timeout=interval)
        except TimeoutError:
            continue  # the interval passed: reconcile again


def _reconciler(
    interval: float,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(
            reconcile_forever(
                controller=app[CONTROLLER_KEY],
                metrics=app[METRICS_KEY],
                interval=interval,
                wake=app[WAKE_KEY],
            )
        )
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):  # we cancelled it: it has stopped
            await task

    return context


def make_app(
    *,
    controller: Controller,
    metrics: TainterMetrics,
    token: bytes,
    max_body_bytes: int,
    reconcile_interval: float | None,
    cleanup: Callable[[web.Application], Awaitable[None]] | None = None,
) -> web.Application:
    """The tainter's aiohttp app. `token` empty means no auth (explicit insecure mode);
    `reconcile_interval` None runs no periodic reconcile (tests drive it)."""
    app = web.Application(client_max_size=max_body_bytes)
    app[CONTROLLER_KEY] = controller
    app[METRICS_KEY] = metrics
    app[TOKEN_KEY] = token
    app[WAKE_KEY] = asyncio.Event()
    app[MAX_BODY_KEY] = max_body_bytes
    app.router.add_post("/alerts", _alerts)
    app.router.add_post("/breaker/reset", _breaker_reset)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    if reconcile_interval is not None:
        app.cleanup_ctx.append(_reconciler(reconcile_interval))
    if cleanup is not None:
        app.on_cleanup.append(cleanup)
    return app
