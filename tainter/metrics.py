"""The tainter's own metrics (`fleetwatch_tainter_*`) in a registry of its own.

Each family's name, help and labels come from the metric catalog
(`fleetwatch.catalog.tainter`); this module only registers them with prometheus_client.
"""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleetwatch import __version__
from fleetwatch.catalog.exporter import (
    BUILD_INFO,
    WEB_CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS,
    WEB_CONFIG_RELOAD_ERRORS_TOTAL,
)
from fleetwatch.catalog.spec import MetricSpec
from fleetwatch.catalog.tainter import (
    TAINTER_API_CONFLICTS_TOTAL,
    TAINTER_API_ERRORS_TOTAL,
    TAINTER_BREAKER_LIMIT_NODES,
    TAINTER_BREAKER_NEW_TAINTS,
    TAINTER_BREAKER_OPEN,
    TAINTER_BREAKER_REFUSALS_TOTAL,
    TAINTER_BREAKER_SHARE_NODES,
    TAINTER_DRY_RUN_ACTIONS_TOTAL,
    TAINTER_EVICTIONS_TOTAL,
    TAINTER_HTTP_CONNECTIONS_REFUSED_TOTAL,
    TAINTER_LEADER,
    TAINTER_MALFORMED_ANNOTATIONS_TOTAL,
    TAINTER_NODE_CONDITION_WRITES_TOTAL,
    TAINTER_POLICY_REFUSALS_TOTAL,
    TAINTER_QUARANTINED_NODES,
    TAINTER_QUARANTINES_TOTAL,
    TAINTER_RECONCILE_ERRORS_TOTAL,
    TAINTER_RECONCILE_LAST_SUCCESS_TIMESTAMP_SECONDS,
    TAINTER_REPAIR_BACK_IN_SERVICE_SECONDS,
    TAINTER_REPAIRS_IN_FLIGHT,
    TAINTER_REPAIRS_NOT_HELD_TOTAL,
    TAINTER_REPAIRS_TOTAL,
    TAINTER_SOURCE_ERRORS_TOTAL,
    TAINTER_STANDBY_WEBHOOK_REQUESTS_TOTAL,
    TAINTER_TAINT_OPERATIONS_TOTAL,
    TAINTER_TAINTED_NODES,
    TAINTER_TOKEN_RELOADS_TOTAL,
    TAINTER_UNTAINT_DEFERRED_TOTAL,
    TAINTER_WEBHOOK_DURATION_SECONDS,
    TAINTER_WEBHOOK_FORWARDS_TOTAL,
    TAINTER_WEBHOOK_REQUESTS_TOTAL,
)


def _counter(spec: MetricSpec, registry: CollectorRegistry) -> Counter:
    """The catalog's counter `spec`, registered on `registry`."""
    return Counter(spec.name, spec.help, spec.labels, registry=registry)


def _gauge(spec: MetricSpec, registry: CollectorRegistry) -> Gauge:
    """The catalog's gauge `spec`, registered on `registry`."""
    return Gauge(spec.name, spec.help, spec.labels, registry=registry)


def _histogram(
    spec: MetricSpec, registry: CollectorRegistry, buckets: tuple[float, ...]
) -> Histogram:
    """The catalog's histogram `spec` with `buckets`, registered on `registry`."""
    return Histogram(spec.name, spec.help, spec.labels, buckets=buckets, registry=registry)


class TainterMetrics:
    """Every family the tainter exports, registered on a private CollectorRegistry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        _gauge(BUILD_INFO, self.registry).labels(__version__, platform.python_version()).set(1)
        self.webhook_requests = _counter(TAINTER_WEBHOOK_REQUESTS_TOTAL, self.registry)
        self.standby_requests = _counter(TAINTER_STANDBY_WEBHOOK_REQUESTS_TOTAL, self.registry)
        self.webhook_forwards = _counter(TAINTER_WEBHOOK_FORWARDS_TOTAL, self.registry)
        self.webhook_duration = _histogram(
            TAINTER_WEBHOOK_DURATION_SECONDS,
            self.registry,
            (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.taint_operations = _counter(TAINTER_TAINT_OPERATIONS_TOTAL, self.registry)
        self.api_conflicts = _counter(TAINTER_API_CONFLICTS_TOTAL, self.registry)
        self.api_errors = _counter(TAINTER_API_ERRORS_TOTAL, self.registry)
        self.tainted_nodes = _gauge(TAINTER_TAINTED_NODES, self.registry)
        self.breaker_open = _gauge(TAINTER_BREAKER_OPEN, self.registry)
        self.breaker_limit = _gauge(TAINTER_BREAKER_LIMIT_NODES, self.registry)
        self.breaker_sharing = _gauge(TAINTER_BREAKER_SHARE_NODES, self.registry)
        self.breaker_new_taints = _gauge(TAINTER_BREAKER_NEW_TAINTS, self.registry)
        self.breaker_refusals = _counter(TAINTER_BREAKER_REFUSALS_TOTAL, self.registry)
        self.quarantined_nodes = _gauge(TAINTER_QUARANTINED_NODES, self.registry)
        self.quarantines = _counter(TAINTER_QUARANTINES_TOTAL, self.registry)
        self.malformed_annotations = _counter(TAINTER_MALFORMED_ANNOTATIONS_TOTAL, self.registry)
        self.dry_run_actions = _counter(TAINTER_DRY_RUN_ACTIONS_TOTAL, self.registry)
        self.untaint_deferred = _counter(TAINTER_UNTAINT_DEFERRED_TOTAL, self.registry)
        self.policy_refusals = _counter(TAINTER_POLICY_REFUSALS_TOTAL, self.registry)
        self.source_errors = _counter(TAINTER_SOURCE_ERRORS_TOTAL, self.registry)
        self.loop_errors = _counter(TAINTER_RECONCILE_ERRORS_TOTAL, self.registry)
        self.loop_last_success = _gauge(
            TAINTER_RECONCILE_LAST_SUCCESS_TIMESTAMP_SECONDS, self.registry
        )
        self.leader = _gauge(TAINTER_LEADER, self.registry)
        self.token_reloads = _counter(TAINTER_TOKEN_RELOADS_TOTAL, self.registry)
        self.connections_refused = _counter(TAINTER_HTTP_CONNECTIONS_REFUSED_TOTAL, self.registry)

        self.evictions = _counter(TAINTER_EVICTIONS_TOTAL, self.registry)
        self.node_condition_writes = _counter(TAINTER_NODE_CONDITION_WRITES_TOTAL, self.registry)
        self.repairs = _counter(TAINTER_REPAIRS_TOTAL, self.registry)
        self.repairs_in_flight = _gauge(TAINTER_REPAIRS_IN_FLIGHT, self.registry)
        self.repairs_not_held = _counter(TAINTER_REPAIRS_NOT_HELD_TOTAL, self.registry)
        self.back_in_service = _histogram(
            TAINTER_REPAIR_BACK_IN_SERVICE_SECONDS,
            self.registry,
            (60, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 86400, 172800),
        )

        self.web_config_reload_errors = _counter(WEB_CONFIG_RELOAD_ERRORS_TOTAL, self.registry)
        self.web_config_last_reload = _gauge(
            WEB_CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS, self.registry
        )

    def web_config_reloaded(self, ok: bool) -> None:
        """`--web.config.file` (or a file it names) changed and loaded, or did not."""
        if ok:
            self.web_config_last_reload.set_to_current_time()
        else:
            self.web_config_reload_errors.inc()

    def refused_connection(self, why: str) -> None:
        """The listener closed a connection (`too_many`, `header_timeout`)."""
        self.connections_refused.labels(why=why).inc()
