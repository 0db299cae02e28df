"""Wiring: settings → Kubernetes client, sources, breaker, controller, web app.

Kept apart from the CLI so tests build the same application the command runs.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web
from fleetwatch.tainter.breaker import Breaker, BreakerPolicy
from fleetwatch.tainter.controller import Controller, ControllerSettings
from fleetwatch.tainter.kube import ApiError, KubeNodeApi, NodeApi, NodeView
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import KEY_PREFIX, taint_key
from fleetwatch.tainter.server import make_app
from fleetwatch.tainter.sources import (
    AlertmanagerAlerts,
    EvidenceSource,
    NoEvidence,
    PrometheusEvidence,
)
from fleetwatch.tainter.writes import Change, DryRunNodeApi, RetryPolicy, guarded_update, our_taints

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Server certificate and key; a client CA turns on mTLS (client certificates required)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def context(self) -> ssl.SSLContext:
        """The server-side SSL context."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            context.load_verify_locations(self.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


@dataclass(frozen=True, slots=True)
class TaintSettings:
    """Everything `fleetwatch taint` runs with."""

    token: bytes
    kubeconfig: Path | None
    prometheus_url: str | None
    alertmanager_url: str | None
    controller: ControllerSettings
    breaker: BreakerPolicy
    evidence_queries: Mapping[str, str]
    reconcile_interval: float | None
    max_body_bytes: int = 1 << 20
    event_namespace: str = "default"
    tls: TlsFiles | None = None


async def build_app(
    settings: TaintSettings, *, metrics: TainterMetrics | None = None
) -> web.Application:
    """Connect to Kubernetes, Prometheus and Alertmanager and return the tainter's app.

    Everything opened here is closed by the app's cleanup, or at once when a later step
    fails."""
    metrics = metrics or TainterMetrics()
    kube = await KubeNodeApi.connect(
        kubeconfig=settings.kubeconfig, event_namespace=settings.event_namespace
    )
    session = aiohttp.ClientSession()
    try:
        api: NodeApi = DryRunNodeApi(real=kube) if settings.controller.dry_run else kube
        evidence: EvidenceSource = (
            PrometheusEvidence(
                session=session, url=settings.prometheus_url, queries=settings.evidence_queries
            )
            if settings.prometheus_url
            else NoEvidence()
        )
        alerts = (
            AlertmanagerAlerts(session=session, url=settings.alertmanager_url)
            if settings.alertmanager_url
            else None
        )
        controller = Controller(
            api=api,
            breaker=Breaker(policy=settings.breaker),
            evidence=evidence,
            alerts=alerts,
            metrics=metrics,
            settings=settings.controller,
        )
    except BaseException:
        await session.close()
        await kube.close()
        raise

    async def close(_: web.Application) -> None:
        await session.close()
        await kube.close()

    return make_app(
        controller=controller,
        metrics=metrics,
        token=settings.token,
        max_body_bytes=settings.max_body_bytes,
        reconcile_interval=settings.reconcile_interval,
        cleanup=close,
    )


def run_tainter(settings: TaintSettings, *, host: str, port: int) -> int:
    """Serve until SIGTERM/SIGINT."""
    log.info(
        "tainter starting",
        extra={
            "listen": f"{host}:{port}",
            "dry_run": settings.controller.dry_run,
            "prometheus_url": settings.prometheus_url,
            "alertmanager_url": settings.alertmanager_url,
            "breaker_max_nodes": settings.breaker.max_nodes,
            "breaker_max_fraction": settings.breaker.max_fraction,
        },
    )
    web.run_app(
        build_app(settings),
        host=host,
        port=port,
        print=None,
        ssl_context=settings.tls.context() if settings.tls else None,
        access_log=None,
    )
    return 0


async def manual_untaint(
    *,
    api: NodeApi,
    node: str,
    reasons: frozenset[str] | None,
    who: str | None = None,
    metrics: TainterMetrics | None = None,
) -> list[str]:
    """Remove fleetwatch taints from `node` now (all of them when `reasons` is None).

    This is how taints with manual reasons (Xid, lost GPU) leave a node once a person has
    looked at it. Returns the keys removed; raises ApiError when the API fails."""
    who = who or getpass.getuser()
    keys = None if reasons is None else {taint_key(r) for r in reasons}

    async def plan(view: NodeView) -> Change:
        present = set(our_taints(view))
        return Change(remove=frozenset(present if keys is None else present & keys))

    view, change = await guarded_update(
        api=api, name=node, plan=plan, retry=RetryPolicy(), metrics=metrics or TainterMetrics()
    )
    for key in sorted(change.remove):
        await api.create_event(
            node=view,
            reason="TaintRemoved",
            message=f"{key} removed by `fleetwatch untaint` run by {who}",
            warning=False,
        )
    return sorted(change.remove)


def untaint_command(*, kubeconfig: Path | None, node: str, reasons: frozenset[str] | None) -> int:
    """`fleetwatch untaint`: returns the exit status after printing what was removed."""

    async def run() -> list[str]:
        api = await KubeNodeApi.connect(kubeconfig=kubeconfig)
        try:
            return await manual_untaint(api=api, node=node, reasons=reasons)
        finally:
            await api.close()

    try:
        removed = asyncio.run(run())
    except ApiError as exc:
        log.error("untaint failed", extra={"node": node, "error": str(exc)})
        return 1
    if removed:
        log.info("taints removed", extra={"node": node, "keys": removed})
    else:
        log.info(
            "no matching fleetwatch taints on node",
            extra={"node": node, "prefix": KEY_PREFIX, "reasons": sorted(reasons or ())},
        )
    return 0
