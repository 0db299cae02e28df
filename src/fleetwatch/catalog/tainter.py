"""The tainter's own families (`fleetwatch taint`, served on its own `/metrics`);
`fleetwatch.tainter.metrics` registers them with prometheus_client.

Part of the metric catalog (`fleetwatch.catalog`): each family is declared here once and
imported by name wherever it is emitted or read."""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.spec import Families

FAMILIES: Final = Families()
"""Every family of this module, in declaration order (the order docs/metrics.md lists them)."""

TAINTER_WEBHOOK_REQUESTS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_webhook_requests_total",
    "counter",
    (
        "Alertmanager webhook requests by result: ok; left_alone and dry_run (answered 2xx: "
        "alerts deliberately left alone by policy, breaker or someone else's hold, or nothing "
        "written under --dry-run; not failures); unauthorized, bad_request, too_deep, "
        "too_large (4xx); api_denied (the orchestrator denied a write, 4xx); api_error (503, "
        "Alertmanager retries). A standby's answers are counted apart."
    ),
    ("result",),
    unit="requests",
    source="webhook handler",
    series="9",
    label_values={
        "result": (
            "(`ok`, `left_alone`, `dry_run`, `unauthorized`, `bad_request`, `too_deep`, "
            "`too_large`, `api_denied`, `api_error`)"
        ),
    },
)


TAINTER_STANDBY_WEBHOOK_REQUESTS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_standby_webhook_requests_total",
    "counter",
    (
        "Webhook requests this replica answered 503 because it is not the leader and had no "
        "leader to hand them to (none, or the request was handed over already); Alertmanager "
        "retries them."
    ),
    (),
    unit="requests",
    source=(
        "webhooks a standby replica answered 503 without handing them to the leader "
        "(no leader known, or handed over already; Alertmanager retries)"
    ),
    series="1",
)


TAINTER_WEBHOOK_FORWARDS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_webhook_forwards_total",
    "counter",
    (
        "Webhook requests this follower handed to the leader, by result: delivered, "
        "leader_rejected, leader_error (the leader answered 2xx, 4xx, 5xx; it counts why "
        "itself), unreachable (no answer within --leader-elect.forward-timeout: answered "
        "503)."
    ),
    ("result",),
    unit="requests",
    source=(
        "webhooks a standby handed to the leader, by the leader's answer (2xx, 4xx, "
        "5xx) or none within `--leader-elect.forward-timeout`"
    ),
    series="4",
    label_values={
        "result": "(`delivered`, `leader_rejected`, `leader_error`, `unreachable`)",
    },
)


TAINTER_WEBHOOK_DURATION_SECONDS: Final = FAMILIES.declare(
    "fleetwatch_tainter_webhook_duration_seconds",
    "histogram",
    "Time to handle one webhook request, node writes (Kubernetes or scontrol) included.",
    (),
    unit="seconds",
    source="webhook handler, node writes (Kubernetes or scontrol) included",
    series="14",
)


TAINTER_TAINT_OPERATIONS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_taint_operations_total",
    "counter",
    "Taint operations by op (add, remove) and result (ok, refused, error, dry_run).",
    ("op", "result"),
    unit="operations",
    source="controller",
    series="8",
    label_values={
        "op": "(`add`, `remove`)",
        "result": "(`ok`, `refused`, `error`, `dry_run`)",
    },
)


TAINTER_API_CONFLICTS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_api_conflicts_total",
    "counter",
    "Node writes rejected because the node changed since it was read (409).",
    (),
    unit="writes",
    source="node writes answered 409 (node changed since read)",
    series="1",
)


TAINTER_API_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_api_errors_total",
    "counter",
    "Failed orchestrator calls (the Kubernetes API; on Slurm scontrol and the state file) "
    "by HTTP status (0 when unreachable, failing or timed out).",
    ("status",),
    unit="calls",
    source="Kubernetes client; on Slurm (`--orchestrator=slurm`) scontrol and the state file",
    series="~10",
    label_values={
        "status": (
            "(HTTP status, 0 when unreachable; on Slurm 0 for an scontrol call that failed or "
            "timed out, 404 for a node Slurm does not know, 500 for an unreadable state file)"
        ),
    },
)


TAINTER_TAINTED_NODES: Final = FAMILIES.declare(
    "fleetwatch_tainter_tainted_nodes",
    "gauge",
    "Nodes that carry at least one fleetwatch.io/ taint (as last written or read).",
    (),
    unit="nodes",
    source="nodes carrying a `fleetwatch.io/` taint",
    series="1",
)


TAINTER_BREAKER_OPEN: Final = FAMILIES.declare(
    "fleetwatch_tainter_breaker_open",
    "gauge",
    "1 while the circuit breaker refuses new taints, else 0.",
    (),
    unit="0/1",
    source="circuit breaker",
    series="1",
)


TAINTER_BREAKER_LIMIT_NODES: Final = FAMILIES.declare(
    "fleetwatch_tainter_breaker_limit_nodes",
    "gauge",
    (
        "The share cap in nodes: the most nodes that may be out at once because of "
        "fleetwatch taints the tainter may lift itself (--breaker.max-fraction)."
    ),
    (),
    unit="nodes",
    source=(
        "the share cap in nodes: most nodes out at once because of taints the tainter "
        "may lift itself (`--breaker.max-fraction` of the selected nodes)"
    ),
    series="1",
)


TAINTER_BREAKER_SHARE_NODES: Final = FAMILIES.declare(
    "fleetwatch_tainter_breaker_share_nodes",
    "gauge",
    (
        "Nodes out because of fleetwatch taints the tainter may lift itself (what the share "
        "cap counts; nodes waiting for a person are not among them)."
    ),
    (),
    unit="nodes",
    source=(
        "nodes the share cap counts now (out because of taints the tainter may lift; "
        "nodes waiting for a person are not)"
    ),
    series="1",
)


TAINTER_BREAKER_NEW_TAINTS: Final = FAMILIES.declare(
    "fleetwatch_tainter_breaker_new_taints",
    "gauge",
    (
        "Nodes taken out (given their first fleetwatch taint) within --breaker.window (what "
        "the rate cap --breaker.max-new-taints counts)."
    ),
    (),
    unit="nodes",
    source=(
        "nodes taken out (first fleetwatch taint) within `--breaker.window`: what the "
        "rate cap `--breaker.max-new-taints` counts"
    ),
    series="1",
)


TAINTER_BREAKER_REFUSALS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_breaker_refusals_total",
    "counter",
    (
        "Node syncs whose take-out the circuit breaker refused, by the cap that refused "
        "(new_taints, share)."
    ),
    ("cap",),
    unit="syncs",
    source="node take-outs the circuit breaker refused, by the cap that refused",
    series="2",
    label_values={
        "cap": "(`new_taints`, `share`; `unknown` for a breaker an older version opened)",
    },
)


TAINTER_QUARANTINED_NODES: Final = FAMILIES.declare(
    "fleetwatch_tainter_quarantined_nodes",
    "gauge",
    (
        "Tainted nodes in quarantine (label fleetwatch.io/quarantined): a reason tainted "
        "--quarantine.after times within --quarantine.window; only `fleetwatch untaint` "
        "lifts it."
    ),
    (),
    unit="nodes",
    source=(
        "tainted nodes in quarantine (label `fleetwatch.io/quarantined`): their taint "
        "stays until `fleetwatch untaint`"
    ),
    series="1",
)


TAINTER_QUARANTINES_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_quarantines_total",
    "counter",
    "Quarantines started, by taint reason.",
    ("reason",),
    unit="quarantines",
    source=("a reason tainted `--quarantine.after` times within `--quarantine.window` on one node"),
    series="declared reasons",
    label_values={
        "reason": "(taint reason)",
    },
)


TAINTER_MALFORMED_ANNOTATIONS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_malformed_annotations_total",
    "counter",
    (
        "Node annotations fleetwatch could not read (edited by hand) and read as empty, by "
        "annotation."
    ),
    ("annotation",),
    unit="reads",
    source="node annotations edited into something unreadable, read as empty",
    series="1",
    label_values={
        "annotation": "(`fleetwatch.io/taint-history`)",
    },
)


TAINTER_DRY_RUN_ACTIONS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_dry_run_actions_total",
    "counter",
    "Node writes skipped because of --dry-run, by op.",
    ("op",),
    unit="actions",
    source="writes skipped under `--dry-run`",
    series="2",
)


TAINTER_UNTAINT_DEFERRED_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_untaint_deferred_total",
    "counter",
    "Untaint checks that kept the taint, by why (hold, evidence, manual, quarantined, repairing).",
    ("why",),
    unit="checks",
    source="untaint decisions that kept a taint",
    series="5",
    label_values={
        "why": "(`hold`, `evidence`, `manual`, `quarantined`, `repairing`)",
    },
)


TAINTER_POLICY_REFUSALS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_policy_refusals_total",
    "counter",
    ("Alerts whose taint the policy refused, by why (noexecute, undeclared_reason, max_per_node)."),
    ("why",),
    unit="alerts",
    source="taint policy: alerts whose taint was refused, nothing written",
    series="3",
    label_values={
        "why": "(`noexecute`, `undeclared_reason`, `max_per_node`)",
    },
)


TAINTER_SOURCE_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_source_errors_total",
    "counter",
    "Failed or malformed answers from Prometheus or Alertmanager, by source.",
    ("source",),
    unit="answers",
    source="failed, timed-out or malformed answers (taints kept)",
    series="2",
    label_values={
        "source": "(`prometheus`, `alertmanager`)",
    },
)


TAINTER_RECONCILE_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_reconcile_errors_total",
    "counter",
    (
        "Failed iterations of a background loop (reconcile, breaker, leader_election); each "
        "is logged and retried on the loop's interval."
    ),
    ("loop",),
    unit="iterations",
    source="failed background-loop iterations, each logged and retried",
    series="3",
    label_values={
        "loop": "(`reconcile`, `breaker`, `leader_election`)",
    },
)


TAINTER_RECONCILE_LAST_SUCCESS_TIMESTAMP_SECONDS: Final = FAMILIES.declare(
    "fleetwatch_tainter_reconcile_last_success_timestamp_seconds",
    "gauge",
    "Unix time a background loop last completed an iteration without error.",
    ("loop",),
    unit="seconds",
    source="Unix time of a background loop's last error-free iteration",
    series="3",
)


TAINTER_LEADER: Final = FAMILIES.declare(
    "fleetwatch_tainter_leader",
    "gauge",
    "1 while this replica holds the leader Lease (or runs without election), else 0.",
    (),
    unit="0/1",
    source="1 while this replica holds the Lease (always 1 without `--leader-elect`)",
    series="1",
)


TAINTER_TOKEN_RELOADS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_token_reloads_total",
    "counter",
    "Webhook token file re-reads by result (ok, error).",
    ("result",),
    unit="reloads",
    source="webhook token file re-read after it changed",
    series="2",
    label_values={
        "result": "(`ok`, `error`)",
    },
)


TAINTER_HTTP_CONNECTIONS_REFUSED_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_http_connections_refused_total",
    "counter",
    "Connections closed by the listener, by why (too_many, header_timeout).",
    ("why",),
    unit="connections",
    source=(
        "listener: connections past `--web.max-connections`, request heads slower "
        "than `--web.header-timeout`"
    ),
    series="2",
    label_values={
        "why": "(`too_many`, `header_timeout`)",
    },
)


TAINTER_EVICTIONS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_evictions_total",
    "counter",
    (
        "Pod evictions for a taint reason (--evict.reasons) by result (evicted, "
        "blocked_by_pdb, deferred_same_job, rate_limited, skipped_daemonset, skipped_mirror, "
        "skipped_no_label, dry_run, error)."
    ),
    ("reason", "result"),
    unit="pods",
    source=(
        "removal from the run: each eviction outcome for a GPU pod on a node tainted "
        "for a listed reason (skips and dry runs once per pod)"
    ),
    series="reasons × 9",
    label_values={
        "reason": "(taint reason in `--evict.reasons`)",
        "result": (
            "(`evicted`, `blocked_by_pdb`, `deferred_same_job`, `rate_limited`, "
            "`skipped_daemonset`, `skipped_mirror`, `skipped_no_label`, `dry_run`, "
            "`error`)"
        ),
    },
)


TAINTER_NODE_CONDITION_WRITES_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_node_condition_writes_total",
    "counter",
    (
        "Writes of the node condition (--node-condition.type) by status (True, False) and "
        "result (ok, dry_run, error)."
    ),
    ("status", "result"),
    unit="writes",
    source="node condition (`--node-condition.type`) written after a node sync",
    series="6",
    label_values={
        "status": "(`True`, `False`)",
        "result": "(`ok`, `dry_run`, `error`)",
    },
)


TAINTER_REPAIRS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_repairs_total",
    "counter",
    (
        "Repairs of taken-out nodes (--repair.mode) by repair (gpu-reset, reboot) and result: "
        "started, dry_run, returned (the node came back), failed (the GPU reset Job failed), "
        "timeout (not back within --repair.timeout), error (the orchestrator refused to start "
        "it)."
    ),
    ("repair", "result"),
    unit="repairs",
    source="the repair engine: a repair asked of the orchestrator once the node's jobs left",
    series="12",
    label_values={
        "repair": "(`gpu-reset`, `reboot`)",
        "result": "(`started`, `dry_run`, `returned`, `failed`, `timeout`, `error`)",
    },
)


TAINTER_REPAIRS_IN_FLIGHT: Final = FAMILIES.declare(
    "fleetwatch_tainter_repairs_in_flight",
    "gauge",
    (
        "Nodes whose repair was asked and has not come back yet; they count toward the "
        "breaker's share."
    ),
    (),
    unit="nodes",
    source="the repair engine: repairs asked, node not back yet",
    series="1",
)


TAINTER_REPAIRS_NOT_HELD_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_tainter_repairs_not_held_total",
    "counter",
    (
        "Repairs that did not hold: the same reason took the node out again within "
        "--repair.window after it returned, by taint reason and repair."
    ),
    ("reason", "repair"),
    unit="repairs",
    source="the repair engine: a reason back within `--repair.window` after a repair returned",
    series="declared reasons × 2",
    label_values={"reason": "(taint reason)", "repair": "(`gpu-reset`, `reboot`)"},
)


TAINTER_REPAIR_BACK_IN_SERVICE_SECONDS: Final = FAMILIES.declare(
    "fleetwatch_tainter_repair_back_in_service_seconds",
    "histogram",
    "Time from a node taken out to back in service after its repair, by taint reason.",
    ("reason",),
    unit="seconds",
    source="the repair engine: taken out (the hold's audit record) to the repair's return",
    series="declared reasons × 12",
    label_values={"reason": "(taint reason)"},
)
