"""Alerts on fleetwatch itself: the exporter, its collectors and the taint controller.

The exporter's alerts are node scope, the tainter's and the fleet-wide absence global.

Thresholds are `thresholds.<name>` in rules/config.yaml, read here as `p("<name>")`; each
alert's severity and `for` are `alerts.<AlertName>` there.
"""

from __future__ import annotations

from fleetwatch.catalog.exporter import COLLECTOR_UP
from fleetwatch.catalog.tainter import (
    TAINTER_BREAKER_OPEN,
    TAINTER_BREAKER_REFUSALS_TOTAL,
    TAINTER_LEADER,
    TAINTER_POLICY_REFUSALS_TOTAL,
    TAINTER_QUARANTINED_NODES,
    TAINTER_WEBHOOK_FORWARDS_TOTAL,
    TAINTER_WEBHOOK_REQUESTS_TOTAL,
)
from fleetwatch.catalog.xid import GPU_XID_EVENTS_LISTENING, GPU_XID_NVML_ERRORS_TOTAL
from fleetwatch.rules.config import Config, Params
from fleetwatch.rules.promql import Alert, Promql, events, match, union


def alerts(config: Config, p: Params) -> list[Alert]:
    """The exporter and its collectors on one node (node scope)."""
    del p
    q = Promql(config)
    return [
        Alert(
            name="FleetwatchExporterDown",
            expr=f"{q.exporter('up')} == 0",
            summary="fleetwatch exporter down on node {{ $labels.node }}",
            description=(
                "Prometheus cannot scrape the fleetwatch exporter {{ $labels.instance }}"
                " on node {{ $labels.node }}: its GPUs are not watched."
            ),
        ),
        Alert(
            name="FleetwatchCollectorFailing",
            expr=f"{q.exporter(COLLECTOR_UP.name)} == 0",
            summary="fleetwatch collector {{ $labels.collector }} failing on node "
            "{{ $labels.node }}",
            description=(
                "The {{ $labels.collector }} collector of the exporter on node "
                "{{ $labels.node }} fails or misses its deadline; its series are stale "
                "or gone."
            ),
        ),
        Alert(
            name="FleetwatchXidEventsUnavailable",
            expr=f"{q.exporter(GPU_XID_EVENTS_LISTENING.name)} == 0",
            summary="Xid events of GPU {{ $labels.gpu }} on node {{ $labels.node }} "
            "not reaching fleetwatch",
            description=(
                "NVML does not deliver the Xid events of GPU {{ $labels.gpu }} on node "
                "{{ $labels.node }} to the exporter (its event calls fail or block, "
                f"{GPU_XID_NVML_ERRORS_TOTAL.name} says which): its Xids from NVML are "
                "not counted; unless the node also reads the kernel log, the Xid alerts "
                "cannot fire for it."
            ),
        ),
    ]


def fleet_alerts(config: Config, p: Params) -> list[Alert]:
    """No exporter scraped anywhere (global scope: absent() looks across every node)."""
    del p
    q = Promql(config)
    return [
        Alert(
            name="FleetwatchExporterAbsent",
            expr=f"absent({q.exporter('up')})",
            summary="No fleetwatch exporter is scraped",
            description=(
                "Prometheus has no fleetwatch scrape target at all: no GPU is watched "
                "and no node can be tainted."
            ),
        ),
    ]


def tainter_alerts(config: Config, p: Params) -> list[Alert]:
    """The taint controller (global scope: they aggregate its replicas, wherever each is
    scraped, and read the ALERTS of every node)."""
    q = Promql(config)
    requests = TAINTER_WEBHOOK_REQUESTS_TOTAL.name
    forwards = TAINTER_WEBHOOK_FORWARDS_TOTAL.name
    # What each replica received: handled itself, or handed to the leader (which counts
    # what it did with it). A failure is one it handled badly, or one it could not hand
    # over at all; the two families' `result` values never coincide, so `or` adds them.
    # A deliberate refusal (left alone, dry run) is answered with success: not a failure.
    received = f"rate({q.tainter(requests)}[5m]) or rate({q.tainter(forwards)}[5m])"
    failed = (
        f"rate({q.tainter(requests, match('result', '!~', 'ok|left_alone|dry_run'))}[5m])"
        f" or rate({q.tainter(forwards, match('result', '=', 'unreachable'))}[5m])"
    )
    window = p("event_window")
    refusals = q.tainter(TAINTER_POLICY_REFUSALS_TOTAL.name)
    tainter_up = q.tainter("up")
    # Alerts that ask for a taint, firing now (Prometheus' own ALERTS series).
    taint_requested = 'count(ALERTS{alertstate="firing", fleetwatch_taint=~".+"}) > 0'
    return [
        Alert(
            name="FleetwatchTainterWebhookFailing",
            expr=(
                f"sum by (job, instance) ({failed})\n/\n"
                f"sum by (job, instance) ({received})\n"
                f"> {p('tainter_webhook_error_ratio')}"
            ),
            summary="fleetwatch tainter webhook failing",
            description=(
                "{{ $value | humanizePercentage }} of the Alertmanager webhook requests "
                "to the tainter {{ $labels.instance }} fail: alerts do not taint nodes."
            ),
        ),
        Alert(
            name="FleetwatchTaintBreakerOpen",
            # One breaker for every replica (its state lives on the Lease, and standbys
            # mirror it): one alert, not one per replica.
            expr=f"max without (instance, pod) ({q.tainter(TAINTER_BREAKER_OPEN.name)}) == 1",
            summary="fleetwatch taint circuit breaker open",
            description=(
                "The tainter refuses to take more nodes out: too many were taken out within "
                "the window, or too large a share of the GPU nodes carries taints it may lift. "
                f"{TAINTER_BREAKER_REFUSALS_TOTAL} and the TaintRefused Events name "
                "the cap; check for a fleet-wide cause before raising it."
            ),
        ),
        Alert(
            name="FleetwatchNodeQuarantined",
            # Only the leader counts quarantined nodes; a former leader's gauge is stale.
            expr=(
                "max without (instance, pod) (\n"
                f"  {q.tainter(TAINTER_QUARANTINED_NODES.name)}\n"
                f"  and on (job, instance) ({q.tainter(TAINTER_LEADER.name)} == 1)\n"
                ") > 0"
            ),
            summary="{{ $value }} node(s) quarantined by the fleetwatch tainter",
            description=(
                "{{ $value }} node(s) were tainted for the same reason --quarantine.after "
                "times within --quarantine.window (a repeat offender such as a failing cold "
                "plate): their taint stays until a person runs `fleetwatch untaint`. "
                "`kubectl get nodes -l fleetwatch.io/quarantined` lists them."
            ),
        ),
        Alert(
            name="FleetwatchTaintRefused",
            # Counted once for all replicas: only the leader answers webhooks.
            expr=(
                "sum without (instance, pod) (\n"
                f"{events(refusals, window, first_sample_counts=True)}\n"
                f") > {p('tainter_policy_refusals')}"
            ),
            summary="fleetwatch tainter refused {{ $value }} taints ({{ $labels.why }})",
            description=(
                "The tainter's policy refused {{ $value }} taint requests in the last "
                f"{window} ({{{{ $labels.why }}}}): alerts asked for a node to be taken out "
                "and it was not. Decide by hand, then fix the rule's labels or the tainter's "
                "policy flags."
            ),
        ),
        Alert(
            name="FleetwatchTainterDown",
            expr=union(
                [
                    f"max by (job) ({tainter_up}) == 0",
                    f"max by (job) ({q.tainter(TAINTER_LEADER.name)}) == 0",
                    f"absent({tainter_up})\nand on ()\n{taint_requested}",
                ]
            ),
            summary="No fleetwatch tainter acts on taint alerts",
            description=(
                "No tainter replica is up and leading (every replica down, none holding the "
                "leader Lease, or none scraped while alerts ask for taints): overheating or "
                "broken nodes are not taken out of the scheduler."
            ),
        ),
    ]
