"""Wiring: settings → backend, sources, breaker, leader election, controller, app.

Kept apart from the CLI so tests build the same application the command runs. Also the
one-shot commands that act on the cluster with the caller's credentials: `untaint` and
`breaker reset`. The backend (`connect_backend`) is Kubernetes or Slurm; each is imported
only when chosen, so a Slurm controller never loads the Kubernetes client.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from fleetwatch.listener import Listener, start_listener
from fleetwatch.promclient import PrometheusAccess
from fleetwatch.tainter.after_sync import AfterSync
from fleetwatch.tainter.auth import TokenFile
from fleetwatch.tainter.backend import ClusterApi, NodeApi
from fleetwatch.tainter.breaker import Breaker, BreakerRecord, BreakerStore
from fleetwatch.tainter.controller import Controller
from fleetwatch.tainter.election import (
    LeaderElector,
    LeaderOnlyNodeApi,
    Leadership,
)
from fleetwatch.tainter.forward import Forwarder, PinnedServingCertificate
from fleetwatch.tainter.kube_objects import ApiError, NodeView, now_rfc3339
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import KEY_PREFIX, taint_key
from fleetwatch.tainter.quarantine import release
from fleetwatch.tainter.repair_settings import RepairSettings
from fleetwatch.tainter.server import METRICS_KEY, Background, make_app
from fleetwatch.tainter.settings import RetryPolicy, SlurmAccess, TaintSettings
from fleetwatch.tainter.sources import (
    AlertmanagerAlerts,
    EvidenceSource,
    NoEvidence,
    PrometheusEvidence,
)
from fleetwatch.tainter.supervise import Supervisor
from fleetwatch.tainter.writes import (
    Change,
    DryRunNodeApi,
    guarded_update,
    our_taints,
    with_retries,
)
from fleetwatch.webguard import WebGuard

log = logging.getLogger(__name__)


Close = Callable[[], Awaitable[None]]


async def connect_backend(
    orchestrator: str,
    *,
    kubeconfig: Path | None = None,
    event_namespace: str = "default",
    slurm: SlurmAccess | None = None,
    repairs: RepairSettings | None = None,
) -> tuple[ClusterApi, Close]:
    """The backend `orchestrator` names, connected, and how to close it. Raises ApiError
    when it cannot be reached (Slurm: scontrol does not answer `show config`)."""
    if orchestrator == "slurm":
        from fleetwatch.tainter.slurm_backend import connect_slurm

        api = await connect_slurm(slurm or SlurmAccess())

        async def nothing() -> None:
            return None

        return api, nothing
    from fleetwatch.tainter.kube import KubeNodeApi

    kube = await KubeNodeApi.connect(
        kubeconfig=kubeconfig, event_namespace=event_namespace, repairs=repairs
    )
    return kube, kube.close


def _after_sync(
    settings: TaintSettings, *, api: ClusterApi, leadership: Leadership, metrics: TainterMetrics
) -> tuple[AfterSync, ...]:
    """The steps after each node sync: Kubernetes' node condition and eviction; on Slurm,
    requeueing or cancelling a drained node's jobs (`tainter.slurm_requeue`)."""
    if settings.orchestrator == "slurm":
        from fleetwatch.tainter.slurm_requeue import JobRemover

        return (
            JobRemover(
                access=settings.slurm,
                reasons=settings.eviction.reasons,
                leadership=leadership,
                metrics=metrics,
                dry_run=settings.controller.dry_run,
            ),
        )
    from fleetwatch.tainter.after_sync import after_sync_steps
    from fleetwatch.tainter.kube import KubeNodeApi

    assert isinstance(api, KubeNodeApi)
    return after_sync_steps(settings, api=api, leadership=leadership, metrics=metrics)


def default_identity() -> str:
    """This replica's name in the Lease: the host (the pod name in Kubernetes) and a
    random suffix, so two processes on one host never share it."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


async def build_app(
    settings: TaintSettings, *, metrics: TainterMetrics | None = None
) -> web.Application:
    """Connect to the orchestrator, Prometheus and Alertmanager and return the tainter's app.

    Everything opened here is closed by the app's cleanup, or at once when a later step
    fails."""
    metrics = metrics or TainterMetrics()
    auth = (
        TokenFile(settings.token_file, overlap=settings.token_overlap, metrics=metrics)
        if settings.token_file
        else None
    )
    kube, close_backend = await connect_backend(
        settings.orchestrator,
        kubeconfig=settings.kubeconfig,
        event_namespace=settings.event_namespace,
        slurm=settings.slurm,
        repairs=settings.controller.repair,
    )
    session = aiohttp.ClientSession()
    try:
        leadership = Leadership(
            renew_deadline=settings.election.renew_deadline if settings.election.enabled else None
        )
        gated = LeaderOnlyNodeApi(real=kube, leadership=leadership)
        api: NodeApi = DryRunNodeApi(real=gated) if settings.controller.dry_run else gated
        evidence: EvidenceSource = (
            PrometheusEvidence(
                session=session,
                access=PrometheusAccess(settings.prometheus),
                queries=settings.evidence_queries,
                metrics=metrics,
            )
            if settings.prometheus.url
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
            policy=settings.policy,
            breaker_store=BreakerStore(
                api=kube,
                namespace=settings.election.namespace,
                name=settings.election.name,
                leadership=leadership,
            ),
            after_sync=_after_sync(settings, api=kube, leadership=leadership, metrics=metrics),
        )
        elector = forwarder = None
        if settings.election.enabled:
            forwarder = Forwarder(
                session=session,
                identity=settings.election.identity,
                timeout=settings.election.forward_timeout,
                tls=PinnedServingCertificate(settings.tls) if settings.tls else None,
            )

            def on_change(leader: bool) -> None:
                metrics.leader.set(1 if leader else 0)
                if leader:
                    controller.wake.set()

            elector = LeaderElector(
                api=kube,
                settings=settings.election,
                leadership=leadership,
                on_elected=controller.prepare_to_lead,
                on_change=on_change,
            )
        metrics.leader.set(0 if settings.election.enabled else 1)
    except BaseException:
        await session.close()
        await close_backend()
        raise

    async def close(_: web.Application) -> None:
        await session.close()
        await close_backend()

    return make_app(
        controller=controller,
        metrics=metrics,
        auth=auth,
        max_body_bytes=settings.max_body_bytes,
        leadership=leadership,
        forwarder=forwarder,
        background=Background(
            reconcile_interval=settings.reconcile_interval,
            breaker_interval=settings.election.retry_period,
            elector=elector,
        ),
        supervisor=Supervisor(metrics=metrics),
        cleanup=close,
        orchestrator=settings.orchestrator,
        dry_run=settings.controller.dry_run,
    )


async def serve(settings: TaintSettings, *, host: str, port: int) -> None:
    """Serve the app behind the hardened listener until SIGTERM or SIGINT."""
    app = await build_app(settings)
    metrics = app[METRICS_KEY]
    config_file = settings.listener.config_file
    guard = None
    if config_file is not None:
        guard = WebGuard(config_file, on_reload=metrics.web_config_reloaded)
        metrics.web_config_last_reload.set(guard.last_reload_success)
    runner, server = await start_listener(
        app,
        host=host,
        port=port,
        listener=Listener(
            limits=settings.listener, on_refused=metrics.refused_connection, web=guard
        ),
        ssl_context=settings.tls.context() if settings.tls and guard is None else None,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
        log.info("tainter stopping")
    finally:
        server.close()
        await runner.cleanup()


def run_tainter(settings: TaintSettings, *, host: str, port: int) -> int:
    """Serve until SIGTERM/SIGINT."""
    log.info(
        "tainter starting",
        extra={
            "listen": f"{host}:{port}",
            "dry_run": settings.controller.dry_run,
            "orchestrator": settings.orchestrator,
            "prometheus_url": settings.prometheus.url,
            "alertmanager_url": settings.alertmanager_url,
            "breaker_max_new_taints": settings.breaker.max_new_taints,
            "breaker_window_seconds": settings.breaker.window,
            "breaker_max_fraction": settings.breaker.max_fraction,
            "leader_elect": settings.election.enabled,
            "lease": f"{settings.election.namespace}/{settings.election.name}",
            "identity": settings.election.identity,
            "advertise_url": settings.election.advertise_url,
        },
    )
    if settings.election.enabled and settings.election.advertise_url is None:
        log.warning(
            "no --leader-elect.advertise-url: while this replica leads, the others answer "
            "the notifications they receive 503 instead of handing them to it"
        )
    try:
        asyncio.run(serve(settings, host=host, port=port))
    except ApiError as exc:  # the backend cannot be reached at start (scontrol, kubeconfig)
        log.error(
            "tainter cannot start", extra={"orchestrator": settings.orchestrator, "error": str(exc)}
        )
        return 1
    return 0


async def reset_breaker(*, store: BreakerStore, who: str) -> BreakerRecord | None:
    """Close the breaker in the cluster; returns the record it replaced (None if none).

    The leader renews the same Lease every retry period, so a write can meet a newer
    resourceVersion (409): it is read again and retried, like a node write."""

    async def write() -> BreakerRecord | None:
        _, before = await store.read()
        await store.write(BreakerRecord(open=False, changed_at=now_rfc3339(), changed_by=who))
        return before

    return await with_retries(
        write, retry=RetryPolicy(), metrics=TainterMetrics(), what="reset the breaker"
    )


def breaker_reset_command(
    *,
    kubeconfig: Path | None,
    namespace: str,
    name: str,
    orchestrator: str = "kubernetes",
    slurm: SlurmAccess | None = None,
) -> int:
    """`fleetwatch breaker reset`: close the breaker stored on the tainter's Lease, with the
    caller's own Kubernetes credentials (RBAC on the Lease decides who may), or in the Slurm
    state file (its permissions decide)."""
    who = f"{getpass.getuser()}@{socket.gethostname()} (fleetwatch breaker reset)"

    async def run() -> BreakerRecord | None:
        api, close = await connect_backend(orchestrator, kubeconfig=kubeconfig, slurm=slurm)
        try:
            store = BreakerStore(api=api, namespace=namespace, name=name)
            return await reset_breaker(store=store, who=who)
        finally:
            await close()

    try:
        before = asyncio.run(run())
    except ApiError as exc:
        log.error(
            "breaker reset failed",
            extra={"lease": f"{namespace}/{name}", "status": exc.status, "error": str(exc)},
        )
        return 1
    log.warning(
        "breaker reset: the leader closes it within its retry period",
        extra={
            "lease": f"{namespace}/{name}",
            "was_open": bool(before and before.open),
            "opened_by": before.changed_by if before else None,
        },
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

    This is how taints with manual reasons (Xid, lost GPU) and quarantined ones leave a
    node once a person has looked at it; the quarantine and taint history of those reasons
    go with them. Returns the keys removed; raises ApiError when the API fails."""
    who = who or getpass.getuser()
    keys = None if reasons is None else {taint_key(r) for r in reasons}

    async def plan(view: NodeView) -> Change:
        present = set(our_taints(view))
        marks = release(view, reasons)
        return Change(
            remove=frozenset(present if keys is None else present & keys),
            labels=marks.labels,
            annotations=marks.annotations,
        )

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


def untaint_command(
    *,
    kubeconfig: Path | None,
    node: str,
    reasons: frozenset[str] | None,
    orchestrator: str = "kubernetes",
    slurm: SlurmAccess | None = None,
) -> int:
    """`fleetwatch untaint`: returns the exit status after printing what was removed (on
    Slurm: resumes the node when no fleetwatch hold is left, and only from its own drain)."""

    async def run() -> list[str]:
        api, close = await connect_backend(orchestrator, kubeconfig=kubeconfig, slurm=slurm)
        try:
            return await manual_untaint(api=api, node=node, reasons=reasons)
        finally:
            await close()

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
