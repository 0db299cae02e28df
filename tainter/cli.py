"""`fleetwatch taint`, `untaint` and `breaker reset`.

The flags are the fields of the settings dataclasses in `tainter.settings` (and the
listener's `fleetwatch.listener.ListenerSettings`); this module adds the few that are
checked together (token, TLS) and builds `TaintSettings` once from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Any

from fleetwatch.tainter.policy import TaintPolicy, reason
from fleetwatch.tainter.settings import (
    BreakerPolicy,
    ControllerSettings,
    ElectionSettings,
    EvictionSettings,
    EvidenceSettings,
    LeaseSettings,
    NodeConditionSettings,
    QuarantineSettings,
    TaintSettings,
    TlsFiles,
)

from fleetwatch.flags import add_setting_flags, listen_address, read_settings, readable_file
from fleetwatch.k8snames import is_node_name
from fleetwatch.listener import ListenerSettings

log = logging.getLogger(__name__)

# Each settings dataclass and the prefix of its flags (`--PREFIX.FIELD-NAME`, unless a
# field names its own flag).
_LEASE = "leader-elect"
_SETTINGS: tuple[tuple[str, type[Any]], ...] = (
    ("web", ListenerSettings),
    ("service", TaintSettings),
    ("controller", ControllerSettings),
    ("untaint", EvidenceSettings),
    ("breaker", BreakerPolicy),
    ("quarantine", QuarantineSettings),
    ("taint", TaintPolicy),
    ("evict", EvictionSettings),
    ("node-condition", NodeConditionSettings),
    (_LEASE, LeaseSettings),
    (_LEASE, ElectionSettings),
)


def _node(text: str) -> str:
    if not is_node_name(text):
        raise argparse.ArgumentTypeError(f"invalid node name {text!r}")
    return text


def _add_kubeconfig(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        type=readable_file,
        default=None,
        help="kubeconfig file; without it the pod's in-cluster service account is used",
    )


def _add_webhook_security(parser: argparse.ArgumentParser) -> None:
    """The listen address, token and TLS flags (checked together in `settings_from_args`)."""
    parser.add_argument(
        "--web.listen-address",
        dest="listen",
        type=listen_address,
        default=listen_address(":9848"),
        help="HOST:PORT to serve (default :9848)",
    )
    parser.add_argument(
        "--web.token-file",
        dest="token_file",
        type=readable_file,
        help="file holding the bearer token Alertmanager must send",
    )
    parser.add_argument(
        "--web.insecure-no-token",
        dest="insecure",
        action="store_true",
        help="accept webhooks without a token (never in production)",
    )
    parser.add_argument("--web.tls-cert-file", dest="tls_cert", type=readable_file)
    parser.add_argument("--web.tls-key-file", dest="tls_key", type=readable_file)
    parser.add_argument(
        "--web.tls-client-ca-file",
        dest="tls_client_ca",
        type=readable_file,
        help="require client certificates signed by this CA (mTLS)",
    )


def add_subcommands(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register the tainter's subcommands."""
    taint = subparsers.add_parser(
        "taint",
        help="Alertmanager webhook receiver that taints and untaints nodes",
        description="Taint the node of every alert labelled fleetwatch_taint; untaint on "
        "positive evidence from Prometheus.",
    )
    _add_webhook_security(taint)
    _add_kubeconfig(taint)
    for prefix, settings in _SETTINGS:
        add_setting_flags(taint, prefix, settings)
    taint.set_defaults(run=_run_taint)

    untaint = subparsers.add_parser("untaint", help="remove fleetwatch taints from a node now")
    untaint.add_argument("node", type=_node)
    untaint.add_argument(
        "--reason",
        type=reason,
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
    add_setting_flags(breaker, _LEASE, LeaseSettings)
    breaker.set_defaults(run=_run_breaker)


def _fail(problem: str) -> SystemExit:
    return SystemExit(f"fleetwatch taint: error: {problem}")


def _tls(args: argparse.Namespace) -> TlsFiles | None:
    """The TLS files, when given; SystemExit when they are given halfway."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise _fail("--web.tls-cert-file and --web.tls-key-file go together")
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise _fail("--web.tls-client-ca-file needs --web.tls-cert-file and --web.tls-key-file")
    if args.tls_cert is None:
        return None
    return TlsFiles(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca)


def _policy(args: argparse.Namespace) -> TaintPolicy:
    """The taint policy; declared reasons default to the installed rules config's."""
    from fleetwatch.tainter.policy import shipped_reasons

    policy = read_settings(args, "taint", TaintPolicy)
    if policy.allow_undeclared_reasons:
        if policy.declared_reasons is not None:
            raise _fail(
                "--taint.declared-reasons and --taint.allow-undeclared-reasons contradict "
                "each other"
            )
        return policy
    if policy.declared_reasons is None:
        return dataclasses.replace(policy, declared_reasons=shipped_reasons())
    return policy


def _untaint(args: argparse.Namespace) -> tuple[dict[str, str], tuple[str, ...]]:
    """Untaint evidence per reason and the manual reasons: the rules' remediation contract,
    then `--untaint.evidence`'s queries and `--untaint.manual-reason`'s reasons."""
    from fleetwatch.rules.config import ConfigError
    from fleetwatch.tainter.policy import shipped_contract

    evidence = read_settings(args, "untaint", EvidenceSettings)
    if evidence.clear_celsius is not None:
        raise _fail(
            "--untaint.clear-celsius is no longer read: gpu-overheat's clear condition comes "
            "from the rules' remediation contract (thresholds.untaint_gpu_temperature_celsius "
            "of the rules config); to override it, pass --untaint.evidence=gpu-overheat=PROMQL"
        )
    try:
        contract = shipped_contract()
    except ConfigError as exc:
        raise _fail(str(exc)) from exc
    queries = {**contract.clear, **dict(evidence.evidence)}
    return queries, tuple(sorted(contract.manual))


def settings_from_args(args: argparse.Namespace) -> TaintSettings:
    """Build TaintSettings from parsed flags; SystemExit with one line when they conflict."""
    from fleetwatch.tainter.auth import TokenError, read_token
    from fleetwatch.tainter.service import default_identity

    if args.token_file is None and not args.insecure:
        raise _fail(
            "--web.token-file is required "
            "(or --web.insecure-no-token to accept unauthenticated webhooks)"
        )
    tls = _tls(args)
    if args.token_file is not None:
        try:
            read_token(args.token_file)
        except TokenError as exc:
            raise _fail(str(exc)) from exc
    lease = read_settings(args, _LEASE, LeaseSettings)
    election = read_settings(
        args,
        _LEASE,
        ElectionSettings,
        namespace=lease.namespace,
        name=lease.name,
        identity=default_identity(),
    )
    problem = election.problem()
    if problem is not None:
        raise _fail(problem)
    queries, manual = _untaint(args)
    controller = read_settings(
        args,
        "controller",
        ControllerSettings,
        quarantine=read_settings(args, "quarantine", QuarantineSettings),
    )
    settings = read_settings(
        args,
        "service",
        TaintSettings,
        token_file=args.token_file,
        kubeconfig=args.kubeconfig,
        controller=dataclasses.replace(
            controller, manual_reasons=(*manual, *controller.manual_reasons)
        ),
        breaker=read_settings(args, "breaker", BreakerPolicy),
        policy=_policy(args),
        election=election,
        evidence_queries=queries,
        listener=read_settings(args, "web", ListenerSettings),
        eviction=read_settings(args, "evict", EvictionSettings),
        node_condition=read_settings(args, "node-condition", NodeConditionSettings),
        tls=tls,
    )
    if settings.event_namespace != NODE_EVENT_NAMESPACE:
        # A real API server refuses (422) an Event about a cluster-scoped object in any other
        # namespace: every node Event would be lost, so refuse at start instead.
        raise _fail(
            f"--events.namespace={settings.event_namespace}: Events about nodes (cluster-scoped) "
            f"are accepted only in {NODE_EVENT_NAMESPACE!r}"
        )
    return settings


NODE_EVENT_NAMESPACE = "default"
"""Where the API server accepts Events about a node (a cluster-scoped object)."""


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

    lease = read_settings(args, _LEASE, LeaseSettings)
    return breaker_reset_command(
        kubeconfig=args.kubeconfig, namespace=lease.namespace, name=lease.name
    )
