"""`fleetwatch taint`, `untaint` and `breaker reset`."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

from fleetwatch.tainter.payload import PayloadError, taint_key, valid_node_name
from fleetwatch.tainter.sources import NODE_PLACEHOLDER, default_evidence_queries

from fleetwatch.flags import (
    bounded_number,
    duration,
    http_url,
    listen_address,
    positive_duration,
    readable_file,
)

# The Kubernetes client and the controller are imported where they run, not here: every
# `fleetwatch` process builds this parser, and the exporter must stay small.
if TYPE_CHECKING:
    from fleetwatch.tainter.service import TaintSettings

log = logging.getLogger(__name__)

DEFAULT_MANUAL_REASONS = ("gpu-lost", "xid", "xid-critical", "row-remap-failed")


def _reason(text: str) -> str:
    try:
        taint_key(text)
    except PayloadError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def _reasons(text: str) -> frozenset[str]:
    """A comma-separated list of reasons (empty allowed)."""
    return frozenset(_reason(r.strip()) for r in text.split(",") if r.strip())


def _evidence(text: str) -> tuple[str, str]:
    reason, sep, query = text.partition("=")
    if not sep or not query.strip():
        raise argparse.ArgumentTypeError(
            f"invalid evidence {text!r}: expected REASON=PROMQL, e.g. gpu-overheat="
            f'max(fleetwatch_gpu_temperature_celsius{{node="{NODE_PLACEHOLDER}"}}) < 75'
        )
    return _reason(reason), query.strip()


_fraction = bounded_number(0.0, 1.0)
_count = bounded_number(0, 100_000, integer=True)
_max_per_node = bounded_number(1, 100, integer=True)
_max_connections = bounded_number(1, 10_000, integer=True)
_max_body_bytes = bounded_number(1, 64 << 20, integer=True, unit="bytes")


def _node(text: str) -> str:
    if not valid_node_name(text):
        raise argparse.ArgumentTypeError(f"invalid node name {text!r}")
    return text


def _add_kubeconfig(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        type=readable_file,
        default=None,
        help="kubeconfig file; without it the pod's in-cluster service account is used",
    )


def _add_lease(parser: argparse.ArgumentParser) -> None:
    """Where the tainter's Lease (leader election and the breaker's state) lives."""
    parser.add_argument(
        "--leader-elect.namespace",
        dest="lease_namespace",
        default="default",
        help="namespace of the tainter's Lease (default default; the chart: its namespace)",
    )
    parser.add_argument(
        "--leader-elect.name",
        dest="lease_name",
        default="fleetwatch-tainter",
        help="name of the tainter's Lease (default fleetwatch-tainter)",
    )


def _add_policy(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--taint.allow-noexecute",
        dest="allow_noexecute",
        type=_reasons,
        default=frozenset(),
        help="REASON,...: reasons whose alerts may ask for NoExecute (it evicts running "
        "pods; default none)",
    )
    parser.add_argument(
        "--taint.declared-reasons",
        dest="declared_reasons",
        type=_reasons,
        default=None,
        help="REASON,...: the reasons alerts may ask for (default: those the installed "
        "rules config declares)",
    )
    parser.add_argument(
        "--taint.allow-undeclared-reasons",
        dest="allow_undeclared",
        action="store_true",
        help="accept any valid reason, declared or not",
    )
    parser.add_argument(
        "--taint.max-per-node",
        dest="max_per_node",
        type=_max_per_node,
        default=8,
        help="most fleetwatch taints on one node (default 8)",
    )


def _add_election(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--leader-elect",
        dest="leader_elect",
        action="store_true",
        help="run as one of several replicas: only the holder of the Lease writes",
    )
    _add_lease(parser)
    for flag, dest, default, what in (
        ("lease-duration", "lease_duration", "15s", "how long a Lease is held without renewal"),
        ("renew-deadline", "renew_deadline", "10s", "how long the leader tries to renew"),
        ("retry-period", "retry_period", "2s", "time between tries to acquire or renew"),
    ):
        parser.add_argument(
            f"--leader-elect.{flag}",
            dest=dest,
            type=positive_duration,
            default=positive_duration(default),
            help=f"{what} (default {default})",
        )


def _add_listener(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--web.read-header-timeout",
        dest="header_timeout",
        type=positive_duration,
        default=10.0,
        help="close a connection whose request head has not arrived in time (default 10s)",
    )
    parser.add_argument(
        "--web.keepalive-timeout",
        dest="keepalive_timeout",
        type=positive_duration,
        default=75.0,
        help="close an idle kept-alive connection after this (default 75s)",
    )
    parser.add_argument(
        "--web.max-connections",
        dest="max_connections",
        type=_max_connections,
        default=256,
        help="most open connections; more are answered 503 and closed (default 256)",
    )


def add_subcommands(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register the tainter's subcommands."""
    taint = subparsers.add_parser(
        "taint",
        help="Alertmanager webhook receiver that taints and untaints nodes",
        description="Taint the node of every alert labelled fleetwatch_taint; untaint on "
        "positive evidence from Prometheus.",
    )
    taint.add_argument(
        "--web.listen-address",
        dest="listen",
        type=listen_address,
        default=listen_address(":9848"),
        help="HOST:PORT to serve (default :9848)",
    )
    taint.add_argument(
        "--web.token-file",
        dest="token_file",
        type=readable_file,
        help="file holding the bearer token Alertmanager must send",
    )
    taint.add_argument(
        "--web.insecure-no-token",
        dest="insecure",
        action="store_true",
        help="accept webhooks without a token (never in production)",
    )
    taint.add_argument(
        "--web.max-body-bytes",
        dest="max_body",
        type=_max_body_bytes,
        default=1 << 20,
        help="largest webhook body accepted, at least 1 (default 1 MiB)",
    )
    _add_listener(taint)
    taint.add_argument("--web.tls-cert-file", dest="tls_cert", type=readable_file)
    taint.add_argument("--web.tls-key-file", dest="tls_key", type=readable_file)
    taint.add_argument(
        "--web.tls-client-ca-file",
        dest="tls_client_ca",
        type=readable_file,
        help="require client certificates signed by this CA (mTLS)",
    )
    _add_kubeconfig(taint)
    taint.add_argument(
        "--prometheus-url",
        type=http_url,
        default=None,
        help="Prometheus for positive-evidence untaint; without it taints stay",
    )
    taint.add_argument(
        "--alertmanager-url",
        type=http_url,
        default=None,
        help="Alertmanager for periodic reconcile of firing alerts",
    )
    taint.add_argument(
        "--dry-run", action="store_true", help="log, count and record Events, but never write nodes"
    )
    taint.add_argument(
        "--node-selector",
        default="",
        help="label selector of the nodes the breaker fraction counts",
    )
    taint.add_argument(
        "--breaker.max-nodes",
        dest="breaker_max_nodes",
        type=_count,
        default=10,
        help="most nodes fleetwatch may taint at once (default 10)",
    )
    taint.add_argument(
        "--breaker.max-fraction",
        dest="breaker_max_fraction",
        type=_fraction,
        default=0.1,
        help="most fraction of selected nodes tainted (default 0.1)",
    )
    taint.add_argument(
        "--breaker.auto-close",
        dest="breaker_auto_close",
        action="store_true",
        help="close the breaker by itself once below the cap "
        "(default: only `fleetwatch breaker reset`)",
    )
    taint.add_argument(
        "--untaint.hold",
        dest="hold",
        type=duration,
        default=300.0,
        help="least time after the alert was last firing before untaint (default 5m)",
    )
    taint.add_argument(
        "--untaint.clear-celsius",
        dest="clear_celsius",
        type=float,
        default=75.0,
        help="gpu-overheat clears below this (default 75)",
    )
    taint.add_argument(
        "--untaint.evidence",
        dest="evidence",
        type=_evidence,
        action="append",
        default=[],
        help="REASON=PROMQL: non-empty result means clear; "
        f"{NODE_PLACEHOLDER} is replaced by the node name (repeatable)",
    )
    taint.add_argument(
        "--untaint.manual-reason",
        dest="manual_reasons",
        type=_reason,
        action="append",
        default=None,
        help="reason whose taint stays until `fleetwatch untaint` (repeatable; "
        f"default {', '.join(DEFAULT_MANUAL_REASONS)})",
    )
    taint.add_argument(
        "--reconcile-interval",
        type=positive_duration,
        default=30.0,
        help="how often to reconcile against Alertmanager and nodes (default 30s)",
    )
    taint.add_argument(
        "--kube.concurrency",
        dest="concurrency",
        type=_count,
        default=32,
        help="most node writes in flight (default 32)",
    )
    taint.add_argument(
        "--events.namespace",
        dest="event_namespace",
        default="default",
        help="namespace the node Events are created in (default default)",
    )
    _add_policy(taint)
    _add_election(taint)
    taint.set_defaults(run=_run_taint)

    untaint = subparsers.add_parser("untaint", help="remove fleetwatch taints from a node now")
    untaint.add_argument("node", type=_node)
    untaint.add_argument(
        "--reason",
        type=_reason,
        action="append",
        default=None,
        help="only this reason's taint (repeatable; default all fleetwatch taints)",
    )
    _add_kubeconfig(untaint)
    untaint.set_defaults(run=_run_untaint)

    breaker = subparsers.add_parser(
        "breaker",
        help="control the tainter's circuit breaker",
        description="Close the breaker stored on the tainter's Lease, with your own "
        "Kubernetes credentials (RBAC on the Lease decides who may).",
    )
    breaker.add_argument("action", choices=("reset",))
    _add_kubeconfig(breaker)
    _add_lease(breaker)
    breaker.set_defaults(run=_run_breaker)


def settings_from_args(args: argparse.Namespace) -> TaintSettings:
    """Build TaintSettings from parsed flags; SystemExit with one line when they conflict."""
    from fleetwatch.tainter.auth import TokenError, read_token
    from fleetwatch.tainter.breaker import BreakerPolicy
    from fleetwatch.tainter.controller import ControllerSettings
    from fleetwatch.tainter.election import ElectionSettings
    from fleetwatch.tainter.policy import TaintPolicy, shipped_reasons
    from fleetwatch.tainter.service import TaintSettings, TlsFiles, default_identity
    from fleetwatch.tainter.writes import RetryPolicy

    from fleetwatch.listener import ListenerLimits

    if args.token_file is None and not args.insecure:
        raise SystemExit(
            "fleetwatch taint: error: --web.token-file is required "
            "(or --web.insecure-no-token to accept unauthenticated webhooks)"
        )
    if (args.tls_cert is None) != (args.tls_key is None):
        raise SystemExit(
            "fleetwatch taint: error: --web.tls-cert-file and --web.tls-key-file go together"
        )
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise SystemExit(
            "fleetwatch taint: error: --web.tls-client-ca-file needs "
            "--web.tls-cert-file and --web.tls-key-file"
        )
    if args.token_file is not None:
        try:
            read_token(args.token_file)
        except TokenError as exc:
            raise SystemExit(f"fleetwatch taint: error: {exc}") from exc
    election = ElectionSettings(
        namespace=args.lease_namespace,
        name=args.lease_name,
        identity=default_identity(),
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
    )
    problem = election.problem()
    if problem is not None:
        raise SystemExit(f"fleetwatch taint: error: {problem}")
    if args.declared_reasons is not None and args.allow_undeclared:
        raise SystemExit(
            "fleetwatch taint: error: --taint.declared-reasons and "
            "--taint.allow-undeclared-reasons contradict each other"
        )
    declared = None if args.allow_undeclared else (args.declared_reasons or shipped_reasons())
    queries = default_evidence_queries(clear_celsius=args.clear_celsius)
    queries.update(dict(args.evidence))
    manual = DEFAULT_MANUAL_REASONS if args.manual_reasons is None else args.manual_reasons
    return TaintSettings(
        token_file=args.token_file,
        kubeconfig=args.kubeconfig,
        prometheus_url=args.prometheus_url,
        alertmanager_url=args.alertmanager_url,
        controller=ControllerSettings(
            dry_run=args.dry_run,
            hold_seconds=args.hold,
            manual_reasons=frozenset(manual),
            node_selector=args.node_selector,
            concurrency=max(1, args.concurrency),
            retry=RetryPolicy(),
        ),
        breaker=BreakerPolicy(
            max_nodes=args.breaker_max_nodes,
            max_fraction=args.breaker_max_fraction,
            auto_close=args.breaker_auto_close,
        ),
        policy=TaintPolicy(
            declared_reasons=declared,
            allow_noexecute=args.allow_noexecute,
            max_per_node=args.max_per_node,
        ),
        election=election,
        leader_elect=args.leader_elect,
        evidence_queries=queries,
        reconcile_interval=args.reconcile_interval,
        max_body_bytes=args.max_body,
        listener=ListenerLimits(
            header_timeout=args.header_timeout,
            keepalive_timeout=args.keepalive_timeout,
            max_connections=args.max_connections,
        ),
        event_namespace=args.event_namespace,
        tls=TlsFiles(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca)
        if args.tls_cert
        else None,
    )


def _run_taint(args: argparse.Namespace) -> int:
    from fleetwatch.tainter.service import run_tainter

    settings = settings_from_args(args)
    host, port = args.listen
    if settings.token_file is None:
        log.warning("webhook authentication is OFF (--web.insecure-no-token)")
    return run_tainter(settings, host=host, port=port)


def _run_untaint(args: argparse.Namespace) -> int:
    from fleetwatch.tainter.service import untaint_command

    reasons = None if args.reason is None else frozenset(args.reason)
    return untaint_command(kubeconfig=args.kubeconfig, node=args.node, reasons=reasons)


def _run_breaker(args: argparse.Namespace) -> int:
    from fleetwatch.tainter.service import breaker_reset_command

    return breaker_reset_command(
        kubeconfig=args.kubeconfig, namespace=args.lease_namespace, name=args.lease_name
    )
