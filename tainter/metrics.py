"""The tainter's own metrics (`fleetwatch_tainter_*`) in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class TainterMetrics:
    """Every family the tainter exports, registered on a private CollectorRegistry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.webhook_requests = Counter(
            "fleetwatch_tainter_webhook_requests_total",
            "Alertmanager webhook requests by result (ok, refused, unauthorized, bad_request, "
            "too_deep, too_large, api_error); a standby's answers are counted apart.",
            ["result"],
            registry=self.registry,
        )
        self.standby_requests = Counter(
            "fleetwatch_tainter_standby_webhook_requests_total",
            "Webhook requests this replica answered 503 because it is not the leader and "
            "had no leader to hand them to (none, or the request was handed over already); "
            "Alertmanager retries them.",
            registry=self.registry,
        )
        self.webhook_forwards = Counter(
            "fleetwatch_tainter_webhook_forwards_total",
            "Webhook requests this follower handed to the leader, by result: delivered, "
            "leader_rejected, leader_error (the leader answered 2xx, 4xx, 5xx; it counts "
            "why itself), unreachable (no answer within --leader-elect.forward-timeout: "
            "answered 503).",
            ["result"],
            registry=self.registry,
        )
        self.webhook_duration = Histogram(
            "fleetwatch_tainter_webhook_duration_seconds",
            "Time to handle one webhook request, Kubernetes writes included.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.taint_operations = Counter(
            "fleetwatch_tainter_taint_operations_total",
            "Taint operations by op (add, remove) and result (ok, refused, error, dry_run).",
            ["op", "result"],
            registry=self.registry,
        )
        self.api_conflicts = Counter(
            "fleetwatch_tainter_api_conflicts_total",
            "Node writes rejected because the node changed since it was read (409).",
            registry=self.registry,
        )
        self.api_errors = Counter(
            "fleetwatch_tainter_api_errors_total",
            "Failed Kubernetes API calls by HTTP status (0 when unreachable).",
            ["status"],
            registry=self.registry,
        )
        self.tainted_nodes = Gauge(
            "fleetwatch_tainter_tainted_nodes",
            "Nodes that carry at least one fleetwatch.io/ taint (as last written or read).",
            registry=self.registry,
        )
        self.breaker_open = Gauge(
            "fleetwatch_tainter_breaker_open",
            "1 while the circuit breaker refuses new taints, else 0.",
            registry=self.registry,
        )
        self.breaker_limit = Gauge(
            "fleetwatch_tainter_breaker_limit_nodes",
            "The share cap in nodes: the most nodes that may be out at once because of "
            "fleetwatch taints the tainter may lift itself (--breaker.max-fraction).",
            registry=self.registry,
        )
        self.breaker_sharing = Gauge(
            "fleetwatch_tainter_breaker_share_nodes",
            "Nodes out because of fleetwatch taints the tainter may lift itself (what the "
            "share cap counts; nodes waiting for a person are not among them).",
            registry=self.registry,
        )
        self.breaker_new_taints = Gauge(
            "fleetwatch_tainter_breaker_new_taints",
            "Nodes taken out (given their first fleetwatch taint) within --breaker.window "
            "(what the rate cap --breaker.max-new-taints counts).",
            registry=self.registry,
        )
        self.breaker_refusals = Counter(
            "fleetwatch_tainter_breaker_refusals_total",
            "Node syncs whose take-out the circuit breaker refused, by the cap that refused "
            "(new_taints, share).",
            ["cap"],
            registry=self.registry,
        )
        self.quarantined_nodes = Gauge(
            "fleetwatch_tainter_quarantined_nodes",
            "Tainted nodes in quarantine (label fleetwatch.io/quarantined): a reason tainted "
            "--quarantine.after times within --quarantine.window; only `fleetwatch untaint` "
            "lifts it.",
            registry=self.registry,
        )
        self.quarantines = Counter(
            "fleetwatch_tainter_quarantines_total",
            "Quarantines started, by taint reason.",
            ["reason"],
            registry=self.registry,
        )
        self.malformed_annotations = Counter(
            "fleetwatch_tainter_malformed_annotations_total",
            "Node annotations fleetwatch could not read (edited by hand) and read as empty, "
            "by annotation.",
            ["annotation"],
            registry=self.registry,
        )
        self.dry_run_actions = Counter(
            "fleetwatch_tainter_dry_run_actions_total",
            "Node writes skipped because of --dry-run, by op.",
            ["op"],
            registry=self.registry,
        )
        self.untaint_deferred = Counter(
            "fleetwatch_tainter_untaint_deferred_total",
            "Untaint checks that kept the taint, by why (hold, evidence, manual, quarantined).",
            ["why"],
            registry=self.registry,
        )
        self.policy_refusals = Counter(
            "fleetwatch_tainter_policy_refusals_total",
            "Alerts whose taint the policy refused, by why "
            "(noexecute, undeclared_reason, max_per_node).",
            ["why"],
            registry=self.registry,
        )
        self.source_errors = Counter(
            "fleetwatch_tainter_source_errors_total",
            "Failed or malformed answers from Prometheus or Alertmanager, by source.",
            ["source"],
            registry=self.registry,
        )
        self.loop_errors = Counter(
            "fleetwatch_tainter_reconcile_errors_total",
            "Failed iterations of a background loop (reconcile, breaker, leader_election); "
            "each is logged and retried on the loop's interval.",
            ["loop"],
            registry=self.registry,
        )
        self.loop_last_success = Gauge(
            "fleetwatch_tainter_reconcile_last_success_timestamp_seconds",
            "Unix time a background loop last completed an iteration without error.",
            ["loop"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "fleetwatch_tainter_leader",
            "1 while this replica holds the leader Lease (or runs without election), else 0.",
            registry=self.registry,
        )
        self.token_reloads = Counter(
            "fleetwatch_tainter_token_reloads_total",
            "Webhook token file re-reads by result (ok, error).",
            ["result"],
            registry=self.registry,
        )
        self.connections_refused = Counter(
            "fleetwatch_tainter_http_connections_refused_total",
            "Connections closed by the listener, by why (too_many, header_timeout).",
            ["why"],
            registry=self.registry,
        )

        self.evictions = Counter(
            "fleetwatch_tainter_evictions_total",
            "Pod evictions for a taint reason (--evict.reasons) by result (evicted, "
            "blocked_by_pdb, deferred_same_job, rate_limited, skipped_daemonset, "
            "skipped_mirror, skipped_no_label, dry_run, error).",
            ["reason", "result"],
            registry=self.registry,
        )
        self.node_condition_writes = Counter(
            "fleetwatch_tainter_node_condition_writes_total",
            "Writes of the node condition (--node-condition.type) by status (True, False) "
            "and result (ok, dry_run, error).",
            ["status", "result"],
            registry=self.registry,
        )

    def refused_connection(self, why: str) -> None:
        """The listener closed a connection (`too_many`, `header_timeout`)."""
        self.connections_refused.labels(why=why).inc()
