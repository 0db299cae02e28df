"""The tainter's settings: frozen dataclasses whose fields are its flags.

Each dataclass is declared the way the exporter's are (`fleetwatch.flags.setting`: default,
bounds and help in one place) and built once from the parsed flags by `tainter.cli`; so are
the flags of `untaint` and `breaker reset`. This module imports neither the Kubernetes
client nor the controller: every `fleetwatch` process, the exporter's included, builds the
tainter's parser from it.
"""

from __future__ import annotations

import argparse
import random
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fleetwatch.flags import (
    REQUIRED,
    duration_setting,
    http_url,
    listen_address,
    number_setting,
    readable_file,
    setting,
    shown_address,
)
from fleetwatch.k8snames import is_node_name
from fleetwatch.listener import ListenerSettings
from fleetwatch.promclient import PrometheusClientSettings
from fleetwatch.rules.contract import NODE_PLACEHOLDER, Repair
from fleetwatch.tainter.repair_settings import RepairSettings
from fleetwatch.tainter.taint_policy import TaintPolicy, listed, reason, reasons


def evidence(text: str) -> tuple[str, str]:
    """`REASON=PROMQL` as a flag type."""
    name, sep, query = text.partition("=")
    if not sep or not query.strip():
        raise argparse.ArgumentTypeError(
            f"invalid evidence {text!r}: expected REASON=PROMQL, a query that returns a "
            f"non-empty result when the node ({NODE_PLACEHOLDER} in the query) is clear"
        )
    return reason(name), query.strip()


def node_name(text: str) -> str:
    """A Kubernetes node name as a flag type."""
    if not is_node_name(text):
        raise argparse.ArgumentTypeError(f"invalid node name {text!r}")
    return text


def condition_type(text: str) -> str:
    """A node condition type as a flag type: CamelCase letters and digits, or empty."""
    if text and not re.fullmatch(r"[A-Z][A-Za-z0-9]{0,62}", text):
        raise argparse.ArgumentTypeError(
            f"invalid node condition type {text!r}: expected CamelCase letters and digits "
            "such as GPUHealthy, or empty to set no condition"
        )
    return text


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeAccess:
    """How a command reaches the Kubernetes API (`--kubeconfig`)."""

    kubeconfig: Path | None = setting(
        None,
        parse=readable_file,
        metavar="FILE",
        flag="kubeconfig",
        help="kubeconfig file; without it the pod's in-cluster service account is used",
    )


ORCHESTRATORS = ("kubernetes", "slurm")


@dataclass(frozen=True, slots=True, kw_only=True)
class Orchestrator:
    """Which orchestrator the tainter acts on (`--orchestrator`): Kubernetes taints, or
    Slurm drains (`tainter.slurm_backend`)."""

    orchestrator: str = setting(
        "kubernetes",
        choices=ORCHESTRATORS,
        flag="orchestrator",
        help="take nodes out with Kubernetes taints, or with Slurm drains",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmAccess:
    """How `--orchestrator=slurm` reaches Slurm and where it keeps its state (`--slurm.*`)."""

    scontrol: str = setting(
        "scontrol", metavar="PATH", help="the scontrol to run (a bare name is found on PATH)"
    )
    conf: Path | None = setting(
        None,
        parse=readable_file,
        metavar="FILE",
        help="slurm.conf, passed to scontrol as SLURM_CONF (default: the environment's "
        "SLURM_CONF, else Slurm's own default)",
    )
    state_dir: Path | None = setting(
        None,
        parse=Path,
        metavar="DIR",
        help="where the taint history, quarantine, breaker and leader lease are kept; every "
        "controller host must share it (default: fleetwatch/ in slurmctld's "
        "StateSaveLocation, which its backup host already shares)",
    )
    timeout: float = duration_setting(
        5.0, minimum=0.1, maximum=120.0, help="deadline of one scontrol call"
    )
    remove_jobs: str = setting(
        "requeue",
        choices=("requeue", "cancel"),
        help="what removal from the run does to the running jobs of a node drained for a "
        "reason of --evict.reasons: requeue them (batch jobs) or cancel them",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookSecurity:
    """Where the webhook listens, and how callers prove who they are (`--web.*`): checked
    together when `fleetwatch taint` starts (`tainter.cli.settings_from_args`)."""

    listen_address: tuple[str, int] = setting(
        listen_address(":9848"),
        parse=listen_address,
        shown=shown_address,
        metavar="HOST:PORT",
        help="HOST:PORT to serve",
    )
    token_file: Path | None = setting(
        None,
        parse=readable_file,
        metavar="FILE",
        help="file holding the bearer token Alertmanager must send",
    )
    insecure_no_token: bool = setting(
        False,
        negatable=False,
        help="accept webhooks without a token (never in production)",
    )
    tls_cert_file: Path | None = setting(
        None,
        parse=readable_file,
        metavar="FILE",
        flag="{prefix}.tls.cert-file",
        deprecated=("web.tls-cert-file",),
        help="server certificate (PEM)",
    )
    tls_key_file: Path | None = setting(
        None,
        parse=readable_file,
        metavar="FILE",
        flag="{prefix}.tls.key-file",
        deprecated=("web.tls-key-file",),
        help="server certificate's key (PEM)",
    )
    tls_client_ca_file: Path | None = setting(
        None,
        parse=readable_file,
        metavar="FILE",
        flag="{prefix}.tls.client-ca-file",
        deprecated=("web.tls-client-ca-file",),
        help="require client certificates signed by this CA (mTLS)",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class UntaintCommand:
    """`fleetwatch untaint NODE [--reason REASON]...`."""

    node: str = setting(REQUIRED, parse=node_name, positional=True, help="the node to untaint")
    reason: tuple[str, ...] = setting(
        (),
        parse=reason,
        repeatable=True,
        metavar="REASON",
        help="only this reason's taint (repeatable; default all fleetwatch taints)",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerCommand:
    """`fleetwatch breaker reset`: what to do with the breaker."""

    action: str = setting(REQUIRED, choices=("reset",), positional=True, help=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How often and how patiently a node write is retried."""

    attempts: int = 8
    base_delay: float = 0.05
    max_delay: float = 2.0

    def delay(self, attempt: int) -> float:
        """Jittered exponential backoff, so racing writers spread out."""
        backoff: float = min(self.max_delay, self.base_delay * 2.0**attempt)
        return backoff * random.uniform(0.5, 1.5)


@dataclass(frozen=True, slots=True, kw_only=True)
class QuarantineSettings:
    """Repeat offenders (`--quarantine.*`): the `after`-th taint for the same reason within
    `window` keeps that taint until a person runs `fleetwatch untaint`."""

    after: int = number_setting(
        3,
        minimum=2,
        maximum=100,
        integer=True,
        help="quarantine a node tainted this many times for the same reason within "
        "--quarantine.window: its taint stays until `fleetwatch untaint`",
    )
    window: float = duration_setting(
        86400.0,
        minimum=60.0,
        maximum=30 * 86400.0,
        help="how far back --quarantine.after counts a node's taints",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerSettings:
    """Behaviour knobs of the controller: `--dry-run`, `--breaker.node-selector`, `--untaint.hold`,
    `--untaint.manual-reason` and `--kube.concurrency`; `quarantine` is built from its own
    flags."""

    dry_run: bool = setting(
        False, flag="dry-run", help="log, count and record Events, but never write nodes"
    )
    hold_seconds: float = duration_setting(
        300.0,
        minimum=0.0,
        maximum=7 * 86400.0,
        flag="untaint.hold",
        help="least time after the alert was last firing before untaint (0s: none)",
    )
    manual_reasons: tuple[str, ...] = setting(
        (),
        parse=reason,
        repeatable=True,
        metavar="REASON",
        flag="untaint.manual-reason",
        help="reason whose taint stays until `fleetwatch untaint`, besides those the rules' "
        "remediation contract declares manual (repeatable)",
    )
    node_selector: str = setting(
        "",
        flag="breaker.node-selector",
        deprecated=("node-selector",),
        metavar="SELECTOR",
        help="label selector of the nodes the breaker fraction counts",
    )
    concurrency: int = number_setting(
        32,
        minimum=1,
        maximum=1000,
        integer=True,
        flag="kube.concurrency",
        help="most node writes in flight",
    )
    owner: str = "fleetwatch-tainter"
    quarantine: QuarantineSettings = field(default_factory=QuarantineSettings)
    repair: RepairSettings = field(default_factory=RepairSettings)
    # Each reason's repair, from the rules' remediation contract (`contract.repair_of`).
    repairs: Mapping[str, Repair] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # How long, and how many, resolves are remembered against late firings.
    resolved_memory_seconds: float = 3600.0
    resolved_memory_size: int = 100_000


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerPolicy:
    """The breaker's two caps and how it closes (`tainter.breaker` says what each counts).

    The rate cap: at most `max_new_taints` nodes taken out (given their first fleetwatch
    taint) per sliding `window`, whatever the reason. The share cap: at most `max_fraction`
    of the selected nodes out at once because of taints the tainter may lift itself; nodes
    that wait for a person (manual-untaint reasons, quarantine) do not count toward it."""

    max_new_taints: int = number_setting(
        10,
        minimum=0,
        maximum=100_000,
        integer=True,
        deprecated=("breaker.max-nodes",),
        help="most nodes fleetwatch may take out (first taint) per --breaker.window (0: none)",
    )
    window: float = duration_setting(
        3600.0,
        minimum=60.0,
        maximum=7 * 86400.0,
        help="the sliding window --breaker.max-new-taints counts in",
    )
    max_fraction: float = number_setting(
        0.1,
        minimum=0.0,
        maximum=1.0,
        help="most fraction of selected nodes out at once because of fleetwatch taints the "
        "tainter may lift itself (nodes waiting for a person do not count)",
    )
    auto_close: bool = setting(
        False,
        help="close the breaker by itself once below both caps (off: only "
        "`fleetwatch breaker reset` closes it)",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseSettings:
    """Where the tainter's Lease (leader election and the breaker's state) lives."""

    namespace: str = setting(
        "default",
        metavar="NAMESPACE",
        help="namespace of the tainter's Lease (the chart: its namespace)",
    )
    name: str = setting("fleetwatch-tainter", metavar="NAME", help="name of the tainter's Lease")


@dataclass(frozen=True, slots=True, kw_only=True)
class ElectionSettings:
    """Whether replicas elect a leader, where the Lease is, who we are, the timing
    (client-go's defaults), and how a follower reaches the leader with the notifications it
    receives."""

    namespace: str
    name: str
    identity: str
    enabled: bool = setting(
        False,
        flag="leader-elect",
        help="run as one of several replicas: only the holder of the Lease writes",
    )
    lease_duration: float = duration_setting(
        15.0, minimum=1.0, maximum=3600.0, help="how long a Lease is held without renewal"
    )
    renew_deadline: float = duration_setting(
        10.0, minimum=0.5, maximum=3600.0, help="how long the leader tries to renew"
    )
    retry_period: float = duration_setting(
        2.0, minimum=0.1, maximum=600.0, help="time between tries to acquire or renew"
    )
    advertise_url: str | None = setting(
        None,
        parse=http_url,
        metavar="URL",
        help="this replica's own webhook base URL (e.g. http://POD_IP:9848), published on "
        "the Lease while it leads so that followers hand it the notifications they receive",
    )
    forward_timeout: float = duration_setting(
        5.0,
        minimum=0.1,
        maximum=60.0,
        help="how long a follower waits for the leader's answer to a notification it "
        "handed over before answering 503 (Alertmanager retries)",
    )

    def problem(self) -> str | None:
        """Why these settings cannot work, or None (the timings: the same rules as
        client-go)."""
        if self.advertise_url is not None and not self.enabled:
            return "--leader-elect.advertise-url needs --leader-elect"
        if not self.lease_duration > self.renew_deadline:
            return "--leader-elect.lease-duration must be longer than --leader-elect.renew-deadline"
        if not self.renew_deadline > 1.2 * self.retry_period:
            return (
                "--leader-elect.renew-deadline must be longer than 1.2 x "
                "--leader-elect.retry-period"
            )
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class EvidenceSettings:
    """What counts as positive evidence that a taint's condition is clear (`--untaint.*`):
    the rules' remediation contract, with `evidence` overriding a reason's clear condition.

    `clear_celsius` is deprecated and refused when given: gpu-overheat's clear condition is
    the contract's, built from the rules config's `thresholds.untaint_gpu_temperature_celsius`
    (the chart passes it rendered from its values)."""

    clear_celsius: float | None = number_setting(
        None,
        minimum=1.0,
        maximum=150.0,
        help="deprecated, refused: set thresholds.untaint_gpu_temperature_celsius in the rules "
        "config, or give gpu-overheat's query with --untaint.evidence",
    )
    evidence: tuple[tuple[str, str], ...] = setting(
        (),
        parse=evidence,
        repeatable=True,
        metavar="REASON=PROMQL",
        help="replaces the rules' clear condition of REASON: a non-empty result means its "
        f"condition is clear; {NODE_PLACEHOLDER} is replaced by the node name (repeatable)",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class EvictionSettings:
    """Removal from the run (`--evict.*`): for which taint reasons the pods opted in are
    evicted, how fast, and how patiently a PodDisruptionBudget's refusal is retried."""

    reasons: frozenset[str] = setting(
        frozenset(),
        parse=reasons,
        metavar="REASON,...",
        shown=listed,
        help="taint reasons whose node's opted-in GPU pods are evicted (default none: "
        "eviction is off)",
    )
    max_per_minute: int = number_setting(
        10, minimum=1, maximum=1000, integer=True, help="most pod evictions per minute"
    )
    pdb_attempts: int = number_setting(
        4,
        minimum=1,
        maximum=20,
        integer=True,
        help="tries of one eviction a PodDisruptionBudget refuses (429) before it is "
        "reported blocked (the next reconcile tries again)",
    )
    pdb_backoff: float = duration_setting(
        0.5,
        minimum=0.0,
        maximum=60.0,
        help="first wait after a 429; doubled after each further refusal",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConditionSettings:
    """The node condition fleetwatch keeps while it holds a taint (`--node-condition.type`)."""

    condition_type: str = setting(
        "GPUHealthy",
        parse=condition_type,
        flag="node-condition.type",
        metavar="TYPE",
        help="node condition set False while a fleetwatch taint is held, True after (empty: none)",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class TaintSettings:
    """Everything `fleetwatch taint` runs with. The flag fields here are the service's own;
    the others are built from their own settings dataclasses or checked together."""

    token_file: Path | None
    kubeconfig: Path | None
    controller: ControllerSettings
    breaker: BreakerPolicy
    policy: TaintPolicy
    election: ElectionSettings
    evidence_queries: Mapping[str, str]
    listener: ListenerSettings = field(default_factory=ListenerSettings)
    eviction: EvictionSettings = field(default_factory=EvictionSettings)
    node_condition: NodeConditionSettings = field(default_factory=NodeConditionSettings)
    tls: TlsFiles | None = None
    orchestrator: str = "kubernetes"
    slurm: SlurmAccess = field(default_factory=SlurmAccess)
    prometheus: PrometheusClientSettings = field(default_factory=PrometheusClientSettings)
    """The Prometheus asked for positive-evidence untaint (`--prometheus.*`); without its URL
    taints stay."""
    rules_config_file: Path | None = None
    """`--rules.config-file`: the override the rules config was loaded with."""
    alertmanager_url: str | None = setting(
        None,
        parse=http_url,
        metavar="URL",
        flag="alertmanager.url",
        deprecated=("alertmanager-url",),
        help="Alertmanager for periodic reconcile of firing alerts",
    )
    reconcile_interval: float = duration_setting(
        30.0,
        minimum=1.0,
        maximum=3600.0,
        flag="reconcile.interval",
        deprecated=("reconcile-interval",),
        help="how often to reconcile against Alertmanager and nodes",
    )
    max_body_bytes: int = number_setting(
        1 << 20,
        minimum=1,
        maximum=64 << 20,
        integer=True,
        unit="bytes",
        flag="web.max-body-bytes",
        help="largest webhook body accepted",
    )
    event_namespace: str = setting(
        "default",
        flag="events.namespace",
        metavar="NAMESPACE",
        help="namespace the node Events are created in",
    )
    token_overlap: float = 300.0
