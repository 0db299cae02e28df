"""`fleetwatch taint`, `untaint` and `breaker reset`.

The flags are the fields of the settings dataclasses in `tainter.settings` (and the
listener's `fleetwatch.listener.ListenerSettings`); this module checks those that go
together (token, TLS, leader election) and builds `TaintSettings` once from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import TYPE_CHECKING, Final

from fleetwatch import promclient
from fleetwatch.flags import Flags, Subcommand
from fleetwatch.listener import ListenerSettings
from fleetwatch.rules.override import RULES_CONFIG, RulesConfigFile
from fleetwatch.tainter.repair_settings import RepairSettings
from fleetwatch.tainter.settings import (
    BreakerCommand,
    BreakerPolicy,
    ControllerSettings,
    ElectionSettings,
    EvictionSettings,
    EvidenceSettings,
    KubeAccess,
    LeaseSettings,
    NodeConditionSettings,
    Orchestrator,
    QuarantineSettings,
    SlurmAccess,
    TaintSettings,
    TlsFiles,
    UntaintCommand,
    WebhookSecurity,
)
from fleetwatch.tainter.taint_policy import TaintPolicy
from fleetwatch.webconfig import WebConfig, WebConfigError, check_web_config

if TYPE_CHECKING:
    from fleetwatch.rules.config import Config
    from fleetwatch.rules.contract import Contract

log = logging.getLogger(__name__)

# Each settings dataclass and the prefix of its flags (`--PREFIX.FIELD-NAME`, unless a
# field names its own flag).
_LEASE = "leader-elect"
WEBHOOK: Final = Flags(settings=WebhookSecurity, prefix="web")
KUBE: Final = Flags(settings=KubeAccess)
LISTENER: Final = Flags(settings=ListenerSettings, prefix="web")
SERVICE: Final = Flags(settings=TaintSettings, prefix="service")
CONTROLLER: Final = Flags(settings=ControllerSettings, prefix="controller")
EVIDENCE: Final = Flags(settings=EvidenceSettings, prefix="untaint")
BREAKER: Final = Flags(settings=BreakerPolicy, prefix="breaker")
QUARANTINE: Final = Flags(settings=QuarantineSettings, prefix="quarantine")
REPAIR: Final = Flags(settings=RepairSettings, prefix="repair")
POLICY: Final = Flags(settings=TaintPolicy, prefix="taint")
EVICTION: Final = Flags(settings=EvictionSettings, prefix="evict")
NODE_CONDITION: Final = Flags(settings=NodeConditionSettings, prefix="node-condition")
LEASE: Final = Flags(settings=LeaseSettings, prefix=_LEASE)
ELECTION: Final = Flags(settings=ElectionSettings, prefix=_LEASE)
ORCHESTRATOR: Final = Flags(settings=Orchestrator)
SLURM: Final = Flags(settings=SlurmAccess, prefix="slurm")
UNTAINT: Final = Flags(settings=UntaintCommand)
BREAKER_COMMAND: Final = Flags(settings=BreakerCommand)


def subcommands() -> tuple[Subcommand, ...]:
    """The tainter's subcommands: `taint`, `untaint`, `breaker reset`."""
    return (
        Subcommand(
            name="taint",
            help="Alertmanager webhook receiver that taints and untaints nodes",
            description="Taint the node of every alert labelled fleetwatch_taint; untaint on "
            "positive evidence from Prometheus.",
            flags=(
                WEBHOOK,
                ORCHESTRATOR,
                KUBE,
                SLURM,
                LISTENER,
                SERVICE,
                CONTROLLER,
                EVIDENCE,
                BREAKER,
                QUARANTINE,
                REPAIR,
                POLICY,
                EVICTION,
                NODE_CONDITION,
                LEASE,
                ELECTION,
                promclient.FLAGS,
                RULES_CONFIG,
            ),
            run=_run_taint,
        ),
        Subcommand(
            name="untaint",
            help="remove fleetwatch taints from a node now",
            flags=(UNTAINT, ORCHESTRATOR, KUBE, SLURM),
            run=_run_untaint,
        ),
        Subcommand(
            name="breaker",
            help="control the tainter's circuit breaker",
            description="Close the breaker stored on the tainter's Lease, with your own "
            "Kubernetes credentials (RBAC on the Lease decides who may).",
            flags=(BREAKER_COMMAND, ORCHESTRATOR, KUBE, SLURM, LEASE),
            run=_run_breaker,
        ),
    )


def _fail(problem: str) -> SystemExit:
    return SystemExit(f"fleetwatch taint: error: {problem}")


def _tls(web: WebhookSecurity) -> TlsFiles | None:
    """The TLS files, when given; SystemExit when they are given halfway."""
    if (web.tls_cert_file is None) != (web.tls_key_file is None):
        raise _fail("--web.tls.cert-file and --web.tls.key-file go together")
    if web.tls_client_ca_file is not None and web.tls_cert_file is None:
        raise _fail("--web.tls.client-ca-file needs --web.tls.cert-file and --web.tls.key-file")
    if web.tls_cert_file is None or web.tls_key_file is None:
        return None
    return TlsFiles(cert=web.tls_cert_file, key=web.tls_key_file, client_ca=web.tls_client_ca_file)


def _web_config(listener: ListenerSettings, web: WebhookSecurity) -> WebConfig | None:
    """The checked `--web.config.file`, when given; SystemExit naming what it got wrong."""
    if listener.config_file is None:
        return None
    if web.tls_cert_file or web.tls_key_file or web.tls_client_ca_file:
        raise _fail("--web.config.file and --web.tls.* both set TLS: use one of them")
    try:
        return check_web_config(listener.config_file)
    except WebConfigError as exc:
        raise _fail(f"--web.config.file: {exc}") from exc


def _forwarded_tls(config: WebConfig) -> TlsFiles | None:
    """The files a follower pins when it hands a notification to the leader
    (`tainter.forward`): the web config's certificate, and with client certificates
    required, the same certificate as its client certificate."""
    tls = config.tls
    if tls is None:
        return None
    if tls.cert_file is None or tls.key_file is None:
        raise _fail(
            "--web.config.file: the tainter needs cert_file and key_file (not inline cert "
            "and key): replicas pin the certificate file when they forward to the leader"
        )
    required = tls.client_auth_type == "RequireAndVerifyClientCert"
    return TlsFiles(
        cert=tls.cert_file, key=tls.key_file, client_ca=tls.client_ca_file if required else None
    )


def _rules(rules: RulesConfigFile) -> tuple[Config, Contract]:
    """The rules config in effect (the shipped one, or with `--rules.config-file` merged
    over it) and its remediation contract; SystemExit naming what the override got wrong."""
    from fleetwatch.rules.config import ConfigError

    try:
        config = rules.load()
        return config, rules.contract(config)
    except ConfigError as exc:
        raise _fail(str(exc)) from exc


def _policy(args: argparse.Namespace, config: Config) -> TaintPolicy:
    """The taint policy; declared reasons default to the rules config's."""
    from fleetwatch.tainter.taint_policy import reasons_declared_by

    policy: TaintPolicy = POLICY.read(args)
    if policy.allow_undeclared_reasons:
        if policy.declared_reasons is not None:
            raise _fail(
                "--taint.declared-reasons and --taint.allow-undeclared-reasons contradict "
                "each other"
            )
        return policy
    if policy.declared_reasons is None:
        return dataclasses.replace(policy, declared_reasons=reasons_declared_by(config))
    return policy


def _untaint(
    args: argparse.Namespace, contract: Contract
) -> tuple[dict[str, str], tuple[str, ...]]:
    """Untaint evidence per reason and the manual reasons: the rules' remediation contract,
    then `--untaint.evidence`'s queries and `--untaint.manual-reason`'s reasons."""
    evidence: EvidenceSettings = EVIDENCE.read(args)
    if evidence.clear_celsius is not None:
        raise _fail(
            "--untaint.clear-celsius is no longer read: gpu-overheat's clear condition comes "
            "from the rules' remediation contract (thresholds.untaint_gpu_temperature_celsius "
            "of the rules config); to override it, pass --untaint.evidence=gpu-overheat=PROMQL"
        )
    queries = {**contract.clear, **dict(evidence.evidence)}
    return queries, tuple(sorted(contract.manual))


def settings_from_args(args: argparse.Namespace) -> TaintSettings:
    """Build TaintSettings from parsed flags; SystemExit with one line when they conflict."""
    from fleetwatch.tainter.auth import TokenError, read_token
    from fleetwatch.tainter.service import default_identity

    web: WebhookSecurity = WEBHOOK.read(args)
    listener: ListenerSettings = LISTENER.read(args)
    web_config = _web_config(listener, web)
    basic_auth = web_config is not None and bool(web_config.users)
    if web.token_file is None and not web.insecure_no_token and not basic_auth:
        raise _fail(
            "--web.token-file is required "
            "(or basic_auth_users in --web.config.file, "
            "or --web.insecure-no-token to accept unauthenticated webhooks)"
        )
    if web.token_file is not None and basic_auth:
        raise _fail(
            "--web.token-file and basic_auth_users of --web.config.file both want the "
            "Authorization header, and Alertmanager sends one: use one of them"
        )
    tls = _tls(web) if web_config is None else _forwarded_tls(web_config)
    if web.token_file is not None:
        try:
            read_token(web.token_file)
        except TokenError as exc:
            raise _fail(str(exc)) from exc
    lease: LeaseSettings = LEASE.read(args)
    orchestrator: Orchestrator = ORCHESTRATOR.read(args)
    election: ElectionSettings = ELECTION.read(
        args,
        namespace=lease.namespace,
        name=lease.name,
        identity=default_identity(),
    )
    if orchestrator.orchestrator == "slurm":
        # Several controller hosts may run: only the holder of the lease in the shared state
        # directory acts, whether or not --leader-elect was given.
        election = dataclasses.replace(election, enabled=True)
    problem = election.problem()
    if problem is not None:
        raise _fail(problem)
    rules: RulesConfigFile = RULES_CONFIG.read(args)
    config, contract = _rules(rules)
    queries, manual = _untaint(args, contract)
    prometheus: promclient.PrometheusClientSettings = promclient.FLAGS.read(args)
    problem = prometheus.problem()
    if problem is not None:
        raise _fail(problem)
    controller = CONTROLLER.read(
        args, quarantine=QUARANTINE.read(args), repair=REPAIR.read(args), repairs=contract.repairs
    )
    settings: TaintSettings = SERVICE.read(
        args,
        token_file=web.token_file,
        kubeconfig=KUBE.read(args).kubeconfig,
        controller=dataclasses.replace(
            controller, manual_reasons=(*manual, *controller.manual_reasons)
        ),
        breaker=BREAKER.read(args),
        policy=_policy(args, config),
        election=election,
        evidence_queries=queries,
        listener=listener,
        eviction=EVICTION.read(args),
        node_condition=NODE_CONDITION.read(args),
        tls=tls,
        orchestrator=orchestrator.orchestrator,
        slurm=SLURM.read(args),
        prometheus=prometheus,
        rules_config_file=rules.config_file,
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
    host, port = WEBHOOK.read(args).listen_address
    config_file = settings.listener.config_file
    basic_auth = config_file is not None and bool(check_web_config(config_file).users)
    if settings.token_file is None and not basic_auth:
        log.warning("webhook authentication is OFF (--web.insecure-no-token)")
    return run_tainter(settings, host=host, port=port)


def _run_untaint(args: argparse.Namespace) -> int:
    from fleetwatch.tainter.service import untaint_command

    command: UntaintCommand = UNTAINT.read(args)
    reasons = frozenset(command.reason) or None
    return untaint_command(
        kubeconfig=KUBE.read(args).kubeconfig,
        node=command.node,
        reasons=reasons,
        orchestrator=ORCHESTRATOR.read(args).orchestrator,
        slurm=SLURM.read(args),
    )


def _run_breaker(args: argparse.Namespace) -> int:
    from fleetwatch.tainter.service import breaker_reset_command

    lease: LeaseSettings = LEASE.read(args)
    return breaker_reset_command(
        kubeconfig=KUBE.read(args).kubeconfig,
        namespace=lease.namespace,
        name=lease.name,
        orchestrator=ORCHESTRATOR.read(args).orchestrator,
        slurm=SLURM.read(args),
    )
