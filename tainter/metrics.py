"""The tainter's own metrics (`fleetwatch_tainter_*`) in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class TainterMetrics:
    """Every family the tainter exports, registered on a private CollectorRegistry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.webhook_requests = Counter(
            "fleetwatch_tainter_webhook_requests_total",
            "Alertmanager webhook requests by result (ok, unauthorized, bad_request, "
            "too_large, api_error).",
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
            "The most nodes the breaker lets fleetwatch taint now.",
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
            "Untaint checks that kept the taint, by why (hold, evidence, manual).",
            ["why"],
            registry=self.registry,
        )
        self.reconciles = Counter(
            "fleetwatch_tainter_reconcile_runs_total",
            "Periodic reconcile runs by result (ok, error).",
            ["result"],
            registry=self.registry,
        )
