"""The webhook receiver: `POST /alerts` from Alertmanager, plus health, readiness, metrics.

Answers follow Alertmanager's retry rules (it redelivers on 5xx only): 2xx when the
notification was handled, which includes every deliberate refusal: an alert the taint
policy refuses (NoExecute without the operator's leave, an undeclared reason, the per-node
cap), the circuit breaker holds back (the reconcile loop applies it once the breaker
closes), or a node someone else took out (a Slurm node an admin drained: fleetwatch leaves
it alone), and `--dry-run` (nothing written). Such an answer's body names each alert left
alone and why (`left_alone`), and it is counted by its own result, so the self-health alert
never pages on a refusal. 4xx with a reason for requests that a retry cannot change (wrong
token, not JSON, nested too deep, too large, not a version 4 payload, a taint alert without
a node) and for a write the orchestrator denies (RBAC, the admission policy: a person must
act). 5xx only for what a retry can fix: the orchestrator failed or did not answer (its
answer names which: the Kubernetes API or Slurm), and Alertmanager retries. A follower
hands the notification to the leader (`tainter.forward`) and answers with the leader's
answer; it answers 503 itself only when it has no leader to hand it to, the request was
handed over already, or the leader does not answer within
`--leader-elect.forward-timeout`. A malformed request changes nothing; a refusal changes
nothing for the refused alert while the other alerts of the notification still apply.
There is no way to reset the breaker here: the webhook token can never lift the safety cap
(`fleetwatch breaker reset` does, through the Kubernetes API, where RBAC decides who may).

The background loops (reconcile, breaker state, leader election) run supervised while
the app serves; `/healthz` fails when one of them is wedged, `/readyz` only on the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from fleetwatch.tainter.auth import TokenFile
from fleetwatch.tainter.controller import Controller, NodeSyncError
from fleetwatch.tainter.election import LeaderElector, Leadership
from fleetwatch.tainter.forward import FORWARDED_HEADER, Forwarder, ForwardFailed
from fleetwatch.tainter.kube_objects import ApiError
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import PayloadError, parse_webhook
from fleetwatch.tainter.supervise import Supervisor
from fleetwatch.tainter.writes import RETRIED_STATUSES

log = logging.getLogger(__name__)

CONTROLLER_KEY: Final = web.AppKey("controller", Controller)
METRICS_KEY: Final = web.AppKey("metrics", TainterMetrics)
AUTH_KEY: Final = web.AppKey("auth", TokenFile)
MAX_BODY_KEY: Final = web.AppKey("max_body_bytes", int)
LEADERSHIP_KEY: Final = web.AppKey("leadership", Leadership)
SUPERVISOR_KEY: Final = web.AppKey("supervisor", Supervisor)
FORWARDER_KEY: Final = web.AppKey("forwarder", Forwarder)
BACKEND_KEY: Final = web.AppKey("backend", str)
DRY_RUN_KEY: Final = web.AppKey("dry_run", bool)
BACKEND_NAMES: Final = {"kubernetes": "the Kubernetes API", "slurm": "Slurm (scontrol)"}
"""What each `--orchestrator` is called in an answer that says what failed."""
STANDBY: Final = "standby"
# What became of a notification a follower handed to the leader (the `result` of
# fleetwatch_tainter_webhook_forwards_total), by the leader's status class.
FORWARD_RESULTS: Final = {2: "delivered", 4: "leader_rejected", 5: "leader_error"}
UNREACHABLE: Final = "unreachable"


@dataclass(frozen=True, slots=True)
class Background:
    """The loops the app runs while it serves, and how often."""

    reconcile_interval: float
    breaker_interval: float
    elector: LeaderElector | None = None


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"status": "error", "error": reason}, status=status)


def _authorized(request: web.Request) -> bool:
    auth = request.app.get(AUTH_KEY)
    if auth is None:
        return True  # no token: the insecure flag, or --web.config.file basic auth guards all
    return auth.accepts(request.headers.get("Authorization", ""))


async def _alerts(request: web.Request) -> web.Response:
    metrics = request.app[METRICS_KEY]
    started = time.perf_counter()
    try:
        response, result = await _handle_alerts(request)
    finally:
        metrics.webhook_duration.observe(time.perf_counter() - started)
    if result == STANDBY:
        metrics.standby_requests.inc()  # no leader to hand it to: the retry may find one
    elif result == UNREACHABLE or result in FORWARD_RESULTS.values():
        metrics.webhook_forwards.labels(result=result).inc()  # the leader counts what it did
    else:
        metrics.webhook_requests.labels(result=result).inc()
    return response


async def _handle_alerts(request: web.Request) -> tuple[web.Response, str]:
    if not _authorized(request):
        return _error(401, "missing or wrong bearer token"), "unauthorized"
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[MAX_BODY_KEY]
        log.warning("webhook rejected: body too large", extra={"limit_bytes": limit})
        return _error(413, f"body larger than {limit} bytes"), "too_large"
    if not request.app[LEADERSHIP_KEY].is_leader:
        return await _hand_over(request, raw)
    try:
        body = json.loads(raw)
    except RecursionError:
        log.warning("webhook rejected: JSON nested too deep", extra={"bytes": len(raw)})
        return _error(400, "body is JSON nested too deep"), "too_deep"
    except ValueError as exc:
        log.warning("webhook rejected: not JSON", extra={"error": str(exc)})
        return _error(400, f"body is not JSON: {exc}"), "bad_request"
    try:
        alerts = parse_webhook(body)
    except PayloadError as exc:
        log.warning("webhook rejected", extra={"error": str(exc)})
        return _error(400, str(exc)), "bad_request"
    try:
        outcome = await request.app[CONTROLLER_KEY].handle_alerts(alerts)
    except ApiError as exc:
        return _backend_failed(request.app[BACKEND_KEY], exc)
    answer: dict[str, object] = {"status": "ok", "alerts": len(alerts)}
    result = "ok"
    if outcome.refused:
        first = outcome.refused[0]
        answer["message"] = (
            f"{len(outcome.refused)} alert(s) left alone; first: "
            f"{first.alert.alertname} on {first.alert.node}: {first.detail}"
        )
        answer["left_alone"] = [r.to_json() for r in outcome.refused]
        result = "left_alone"
    if request.app[DRY_RUN_KEY]:
        answer["dry_run"] = "nothing was written: the tainter runs with --dry-run"
        result = "dry_run"
    return web.json_response(answer), result


def _said(exc: ApiError) -> str:
    """What the orchestrator answered, without naming it (the caller does)."""
    return f"answered {exc.status}: {exc.reason}" if exc.status else exc.reason


def _backend_failed(backend: str, exc: ApiError) -> tuple[web.Response, str]:
    """503 when a retry can fix the failure (no answer, a conflict, throttling, the
    orchestrator's own 5xx), else 422: the orchestrator denied the write (RBAC, an admission
    policy) and only a person can change that. The text names the orchestrator."""
    failures = exc.failures if isinstance(exc, NodeSyncError) else {"": exc}
    detail = "; ".join(
        f"{node}: {_said(each)}" if node else _said(each) for node, each in sorted(failures.items())
    )
    if any(each.status in RETRIED_STATUSES for each in failures.values()):
        return _error(503, f"{backend} failed, retry later: {detail}"), "api_error"
    log.error("the orchestrator denied a write", extra={"backend": backend, "error": detail})
    return _error(422, f"{backend} denied the write; a retry cannot help: {detail}"), "api_denied"


def _busy(reason: str) -> web.Response:
    """503 for a notification this replica cannot have applied. Closing the connection
    sends Alertmanager's retry through the Service again, maybe to another replica: a
    kept-alive connection would bring every retry back to this one."""
    busy = _error(503, f"this replica is not the leader and {reason}; retry later")
    busy.force_close()
    return busy


async def _hand_over(request: web.Request, raw: bytes) -> tuple[web.Response, str]:
    """A follower's answer: the leader's, or 503 when there is no leader to ask."""
    forwarder = request.app.get(FORWARDER_KEY)
    leader = request.app[LEADERSHIP_KEY].leader_url
    if FORWARDED_HEADER in request.headers:
        # The sender saw this replica lead; it does not now. Handing it on could loop.
        return _busy("the request was handed over already"), STANDBY
    if forwarder is None or leader is None:
        return _busy("no leader is known to hand it to"), STANDBY
    try:
        answer = await forwarder.forward(
            leader, body=raw, authorization=request.headers.get("Authorization", "")
        )
    except ForwardFailed as exc:
        log.warning(
            "the leader did not answer a notification handed to it",
            extra={"leader": leader, "error": str(exc)},
        )
        return _busy(f"the leader at {leader} did not answer ({exc})"), UNREACHABLE
    response = web.Response(
        status=answer.status, body=answer.body, content_type=answer.content_type
    )
    return response, FORWARD_RESULTS.get(answer.status // 100, "leader_error")


async def _healthz(request: web.Request) -> web.Response:
    stalled = request.app[SUPERVISOR_KEY].stalled()
    if stalled:
        return web.Response(status=503, text="\n".join(stalled) + "\n")
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    if request.app[LEADERSHIP_KEY].is_leader:
        return web.Response(text="leader\n")
    return web.Response(status=503, text="follower: not the leader\n")


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _loops(background: Background) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        controller = app[CONTROLLER_KEY]
        leadership = app[LEADERSHIP_KEY]
        supervisor = app[SUPERVISOR_KEY]

        async def reconcile() -> None:
            if leadership.is_leader:
                await controller.reconcile()

        async def breaker() -> None:
            await controller.sync_breaker(store=leadership.is_leader)

        runs = [
            supervisor.run(
                "reconcile", reconcile, interval=background.reconcile_interval, wake=controller.wake
            ),
            supervisor.run("breaker", breaker, interval=background.breaker_interval),
        ]
        elector = background.elector
        if elector is not None:
            runs.append(
                supervisor.run("leader_election", elector.step, interval=elector.retry_period)
            )
        tasks = [asyncio.create_task(run) for run in runs]
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):  # we cancelled it: it has stopped
                await task
        if elector is not None:
            await elector.release()

    return context


def make_app(
    *,
    controller: Controller,
    metrics: TainterMetrics,
    auth: TokenFile | None,
    max_body_bytes: int,
    leadership: Leadership | None = None,
    forwarder: Forwarder | None = None,
    background: Background | None = None,
    supervisor: Supervisor | None = None,
    cleanup: Callable[[web.Application], Awaitable[None]] | None = None,
    orchestrator: str = "kubernetes",
    dry_run: bool = False,
) -> web.Application:
    """The tainter's aiohttp app. `auth` None means no auth (explicit insecure mode);
    `leadership` None means always leader; `forwarder` None makes a follower answer every
    webhook 503 instead of handing it to the leader; `background` None runs no loops
    (tests drive the controller); `orchestrator` names the backend in answers; `dry_run`
    says in every answer that nothing was written."""
    app = web.Application(client_max_size=max_body_bytes)
    app[CONTROLLER_KEY] = controller
    app[METRICS_KEY] = metrics
    if auth is not None:
        app[AUTH_KEY] = auth
    app[MAX_BODY_KEY] = max_body_bytes
    app[BACKEND_KEY] = BACKEND_NAMES[orchestrator]
    app[DRY_RUN_KEY] = dry_run
    app[LEADERSHIP_KEY] = leadership or Leadership(renew_deadline=None)
    app[SUPERVISOR_KEY] = supervisor or Supervisor(metrics=metrics)
    if forwarder is not None:
        app[FORWARDER_KEY] = forwarder
    app.router.add_post("/alerts", _alerts)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    if background is not None:
        app.cleanup_ctx.append(_loops(background))
    if cleanup is not None:
        app.on_cleanup.append(cleanup)
    return app
