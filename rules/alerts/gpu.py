"""GPU alerts and the fleet's GPU views: heat (now and soon), throttling, Xid, memory
health, lost GPUs; tensor activity, utilization and temperature per node and fleet.

Thresholds are `thresholds.<name>` in rules/config.yaml, read here as `p("<name>")`; each
alert's severity, `for`, `keep_firing_for` and taint are `alerts.<AlertName>` there; how
a taint lifts (its `Remediation`) is beside the alert's expression.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetwatch.catalog.exporter import COLLECTOR_UP
from fleetwatch.catalog.gpu import (
    GPU_CLOCK_EVENT_SECONDS_TOTAL,
    GPU_ECC_ERRORS_TOTAL,
    GPU_INFO,
    GPU_RECOVERY_ACTION,
    GPU_ROW_REMAP_FAILED,
    GPU_ROW_REMAP_PENDING,
    GPU_TEMPERATURE_CELSIUS,
    GPU_TEMPERATURE_MARGIN_CELSIUS,
    GPU_TENSOR_ACTIVE_RATIO,
    GPU_UTILIZATION_RATIO,
    GPUS_EXPECTED,
    GPUS_VISIBLE,
)
from fleetwatch.catalog.nvidia_xids import FALLEN_OFF_BUS, NVLINK5_XIDS, shipped_catalog
from fleetwatch.catalog.pci import GPUS_PCI_PRESENT
from fleetwatch.catalog.xid import (
    GPU_XID_ERRORS_TOTAL,
    GPU_XID_NVLINK5_ERRORS_TOTAL,
    KMSG_UNREADABLE_RECORDS_TOTAL,
)
from fleetwatch.rules.config import Config, Params
from fleetwatch.rules.contract import (
    GPU_SUBJECT,
    HARDWARE_INSPECTION,
    NO_REPAIR,
    LocalCheck,
    NeedsPrometheus,
    OverheatPolicy,
    Series,
    catalog_repair,
    xid_repairs,
)
from fleetwatch.rules.definitions import (
    TENSOR_ACTIVE_RECORD,
    overheat_headroom,
    overheat_policy_text,
    tensor_active,
)
from fleetwatch.rules.promql import (
    GPU,
    GPU_COLLECTOR,
    PERCENT,
    VALUE1,
    Alert,
    HealthyBy,
    Promql,
    Record,
    Remediation,
    clear_condition,
    events,
    match,
    union,
)


def records(config: Config, p: Params) -> list[Record]:
    """Tensor activity per GPU from either source, and node views of activity, utilization
    and heat (`level:metric:operation`): node scope."""
    q = Promql(config)
    util = q.exporter(GPU_UTILIZATION_RATIO.name)
    temp = q.exporter(GPU_TEMPERATURE_CELSIUS.name, 'sensor="gpu"')
    activity = tensor_active(
        config, own=q.exporter, dcgm=lambda metric, matcher: f"{metric}{{{matcher}}}"
    )
    return [
        Record(record=TENSOR_ACTIVE_RECORD, expr=activity),
        Record(
            record=f"node:{GPU_TENSOR_ACTIVE_RATIO}:avg",
            expr=f"avg by (node) ({TENSOR_ACTIVE_RECORD})",
        ),
        Record(record=f"node:{GPU_UTILIZATION_RATIO}:avg", expr=f"avg by (node) ({util})"),
        Record(record=f"node:{GPU_TEMPERATURE_CELSIUS}:max", expr=f"max by (node) ({temp})"),
        Record(
            record="node:fleetwatch_gpu_over_temperature_threshold:count",
            expr=f"sum by (node) ({_past_policy(q, p, config)})",
        ),
    ]


def fleet_records(config: Config, p: Params) -> list[Record]:
    """Fleet views of activity, utilization and heat: global scope (they average and count
    over every node)."""
    q = Promql(config)
    util = q.exporter(GPU_UTILIZATION_RATIO.name)
    return [
        Record(record=f"fleet:{GPU_TENSOR_ACTIVE_RATIO}:avg", expr=f"avg({TENSOR_ACTIVE_RECORD})"),
        Record(record=f"fleet:{GPU_UTILIZATION_RATIO}:avg", expr=f"avg({util})"),
        Record(
            record="fleet:fleetwatch_gpu_over_temperature_threshold:count",
            expr=f"sum({_past_policy(q, p, config)})",
        ),
    ]


VISIBLE = GPUS_VISIBLE.name


def history(config: Config, p: Params) -> list[Record]:
    """The most GPUs each node showed over `presence_history`."""
    return Promql(config).history("job_node", VISIBLE, history=p("presence_history"))


def _gpus_missing(q: Promql, p: Params) -> str:
    """Nodes that see fewer GPUs in NVML than they should, {job, node}, valued at the GPUs
    seen: fewer than `--collector.gpu.expected-count` where it is set; else fewer than the
    most the node showed within `presence_history`; and fewer than the NVIDIA GPUs on its
    PCI bus. Each count is the node's (an exporter pod replaced gets a new `instance`), and
    a deficit counts once it held for `presence_grace`, so a restart or a missed scrape
    (which leaves the count absent, not lower) is no lost GPU and a new node has only its
    own history."""
    grace = p("presence_grace")
    visible, by_node = q.exporter(VISIBLE), "max by (job, node)"
    expected = f"{by_node} ({q.exporter(GPUS_EXPECTED.name)})"
    seen = f"{by_node} (max_over_time({visible}[{grace}]))"
    on_bus = q.exporter(GPUS_PCI_PRESENT.name)
    # A GPU collector that runs but lists no GPU (no driver loaded) exports no count: 0.
    collector = q.exporter(COLLECTOR_UP.name, match("collector", "=", "gpu"))
    none_listed = f"0 * {by_node} ({collector} == 1)"
    return union(
        [
            f"{by_node} ({visible}) < {expected}",
            f"{seen}\n< {q.history_name('job_node', VISIBLE)}\nunless {expected}",
            f"({seen}\n  or\n{none_listed})\n< {by_node} (min_over_time({on_bus}[{grace}]))",
        ]
    )


def _critical_xids(q: Promql, p: Params) -> str:
    """New critical Xids per GPU, {gpu, uuid, xid} (and `unit` for a decoded NVLink5 Xid).

    An NVLink5 Xid (144-150) asks for a GPU reset only for some messages: where the node runs
    the kernel-log source (it exports the unreadable-record counter, at 0 from its start) the
    decode table's action for the very message counts, and only `reset_gpu` is critical;
    elsewhere (NVML events only) the Xid counts at its most severe catalog action. Every Xid
    still has to be in `xid_critical`."""
    window = p("event_window")
    critical = match("xid", "=~", p("xid_critical"))
    nvlink5 = "|".join(map(str, NVLINK5_XIDS))
    xid = GPU_XID_ERRORS_TOTAL.name
    other = q.exporter(xid, critical, match("xid", "!~", nvlink5))
    undecoded = q.exporter(xid, critical, match("xid", "=~", nvlink5))
    decoded = q.exporter(GPU_XID_NVLINK5_ERRORS_TOTAL.name, critical, 'action="reset_gpu"')
    kmsg_source = q.exporter(KMSG_UNREADABLE_RECORDS_TOTAL.name)
    return union(
        [
            f"{events(other, window, first_sample_counts=True)}\n> 0",
            f"{events(undecoded, window, first_sample_counts=True)}\n> 0\n"
            f"unless on (node)\n{kmsg_source}",
            f"sum without (action) (\n{events(decoded, window, first_sample_counts=True)}\n) > 0",
        ]
    )


def _headroom(
    q: Promql,
    p: Params,
    config: Config,
    *matchers: str,
    reading: Callable[[str, str], str] = lambda selector, worst: selector,
) -> str:
    """Per GPU, °C left before its model's overheat policy (`overheat_headroom`), read from
    the exporter's series. GPUOverheating, its clear condition, GPUOverheatingSoon and the
    over-threshold counts all read it. `reading(selector, worst)` turns each series read
    (the temperature, whose worst is its "max"; the margin, "min") into what is compared:
    the series as it is now by default, its worst over a window for the clear condition,
    its linear trend for the warning (the headroom is linear in both, so the trend of the
    headroom is the headroom of the trends). `matchers` narrow every series read (the clear
    condition's node)."""

    def select(metric: str, matcher: str) -> str:
        return q.exporter(metric, *filter(None, (matcher,)), *matchers)

    return overheat_headroom(
        lambda metric, matcher, worst: reading(select(metric, matcher), worst),
        select,
        p.overheat_policies,
        default_celsius=p("gpu_temperature_celsius"),
    )


def _worst_over(window: str | None) -> Callable[[str, str], str]:
    """A `_headroom` reading: each series' worst over `window`, or as it is now (None)."""

    def reading(selector: str, worst: str) -> str:
        return selector if window is None else f"{worst}_over_time({selector}[{window}])"

    return reading


def _past_policy(q: Promql, p: Params, config: Config) -> str:
    """1 for each GPU past its model's overheat policy (where GPUOverheating fires), 0 for
    the others: the over-threshold counts."""
    return f"(\n{_headroom(q, p, config)}\n) < bool 0"


def _overheating(q: Promql, p: Params, config: Config) -> str:
    """GPUs past their model's overheat policy, valued at their temperature: above
    `gpu_temperature_celsius` for a model with no policy, above the policy's temperature,
    or closer to the slowdown limit than the policy's margin."""
    temp = q.exporter(GPU_TEMPERATURE_CELSIUS.name, 'sensor="gpu"')
    return f"{temp}\nand on (node, uuid)\n(\n{_headroom(q, p, config)}\n) < 0"


def _overheating_soon(q: Promql, p: Params, config: Config) -> str:
    """GPUs within `overheat_warning_margin_celsius` of their model's overheat policy, not
    past it, whose trend over `overheat_trend_window` passes it within
    `overheat_horizon_seconds`; valued at the temperature the trend reaches."""
    window, horizon = p("overheat_trend_window"), p("overheat_horizon_seconds")

    def trend(selector: str, worst: str) -> str:
        del worst
        return f"predict_linear({selector}[{window}], {horizon})"

    temp = q.exporter(GPU_TEMPERATURE_CELSIUS.name, 'sensor="gpu"')
    return (
        f"{trend(temp, 'max')}\nand on (node, uuid)\n"
        f"(\n{_headroom(q, p, config, reading=trend)}\n) < 0\nand on (node, uuid)\n"
        # Not past the policy yet (0 °C left or more), and closer to it than the margin.
        f"(\n{_headroom(q, p, config)}\n) >= 0 < {p('overheat_warning_margin_celsius')}"
    )


def alerts(config: Config, p: Params) -> list[Alert]:
    """Heat (now and soon), throttling, Xid, memory health and lost GPUs: each one node's
    (node scope)."""
    q = Promql(config)
    policy_words = overheat_policy_text(p.overheat_policies, p("gpu_temperature_celsius"))
    temp = GPU_TEMPERATURE_CELSIUS.name
    xid = GPU_XID_ERRORS_TOTAL.name
    window = p("event_window")
    xid79 = q.exporter(xid, 'xid="79"')
    ecc = q.exporter(GPU_ECC_ERRORS_TOTAL.name, 'severity="uncorrected"')
    # One-hot by action (none, gpu_reset, node_reboot, drain_p2p, drain_and_reset).
    recovery = q.exporter(GPU_RECOVERY_ACTION.name, match("action", "!=", "none"))
    memory_temp = q.exporter(temp, match("sensor", "=", "memory"))
    clock_window, clock_fraction = p("clock_event_window"), p("clock_event_fraction")

    def clock_time(reasons: str) -> str:
        """Share of `clock_event_window` the reasons slowed the clocks, where above the
        fraction (a 0/1 bit sampled every few seconds misses intermittent throttling)."""
        held = q.exporter(GPU_CLOCK_EVENT_SECONDS_TOTAL.name, match("reason", "=~", reasons))
        return f"rate({held}[{clock_window}]) > {clock_fraction}"

    throttled = (
        f"{GPU} held its clocks down ({{{{ $labels.reason }}}}) {PERCENT} of the last "
        f"{clock_window}"
    )
    return [
        Alert(
            name="GPUOverheating",
            expr=_overheating(q, p, config),
            summary="GPU overheating on node {{ $labels.node }}",
            description=(
                f"{GPU} is at {VALUE1} °C, past the overheat policy of its model ({policy_words})."
            ),
            # Lifted once every GPU of the node was, for the hold-down, further from its
            # model's limit than the hysteresis (gpu_temperature_celsius minus
            # untaint_gpu_temperature_celsius): below the untaint temperature, or above the
            # margin plus the hysteresis, so a GPU hovering at its limit is not untainted
            # and tainted again.
            remediation=Remediation(
                reason="gpu-overheat",
                clear=clear_condition(
                    q,
                    collector=GPU_COLLECTOR,
                    hold_down=p("untaint_hold_down"),
                    healthy=[
                        HealthyBy(
                            lambda node, window: _headroom(
                                q, p, config, node, reading=_worst_over(window)
                            ),
                            "min",
                            f"> {p('gpu_temperature_celsius')} - "
                            f"{p('untaint_gpu_temperature_celsius')}",
                        )
                    ],
                ),
                local=(
                    LocalCheck(
                        family=temp,
                        labels={"sensor": "gpu"},
                        op=">",
                        limit=OverheatPolicy(
                            info=GPU_INFO.name,
                            model_label="name",
                            margin=GPU_TEMPERATURE_MARGIN_CELSIUS.name,
                            on=("uuid",),
                        ),
                        subject=GPU_SUBJECT,
                    ),
                ),
                # Cooling, not the GPU: the node returns when its clear condition holds.
                repair=NO_REPAIR,
            ),
        ),
        Alert(
            name="GPUOverheatingSoon",
            expr=_overheating_soon(q, p, config),
            summary="GPU heading past its overheat policy on node {{ $labels.node }}",
            description=(
                f"{GPU} is on a trend to pass the overheat policy of its model "
                f"({policy_words}) within "
                f"{p('overheat_horizon_seconds')} seconds, at {VALUE1} °C then, where the "
                "node is tainted: let its job checkpoint now."
            ),
        ),
        Alert(
            name="GPUMemoryOverheating",
            expr=f"{memory_temp} > {p('memory_temperature_celsius')}",
            summary=f"GPU memory above {p('memory_temperature_celsius')} °C on node "
            "{{ $labels.node }}",
            description=(
                f"The HBM of {GPU} is at {VALUE1} °C, above {p('memory_temperature_celsius')} °C."
            ),
        ),
        Alert(
            name="GPUThermalSlowdown",
            expr=clock_time("hw_thermal_slowdown|sw_thermal_slowdown"),
            summary="GPU clocks thermally throttled on node {{ $labels.node }}",
            description=f"{throttled}.",
        ),
        Alert(
            name="GPUPowerBrake",
            expr=clock_time("hw_power_brake"),
            summary="GPU hardware power brake active on node {{ $labels.node }}",
            description=(
                f"{throttled}: the board or the power supply signalled an external power problem."
            ),
        ),
        Alert(
            name="GPUXidCritical",
            expr=_critical_xids(q, p),
            summary="Critical Xid {{ $labels.xid }} on node {{ $labels.node }}",
            description=(
                f"{GPU} reported Xid {{{{ $labels.xid }}}} within the last {window}"
                "{{ if $labels.unit }} (NVLink5 unit {{ $labels.unit }}, a message NVIDIA's "
                "decode table answers with a GPU reset){{ end }}; NVIDIA's catalog asks for "
                "a GPU reset, a node reboot, a check of the board's seating, power and cooling "
                "(Xid 54) or NVIDIA support."
            ),
            remediation=Remediation(
                reason="xid-critical",
                manual="the GPU needs a reset, a reboot or NVIDIA support; no series shows "
                "that it was done",
                local=NeedsPrometheus(
                    why="an Xid counter holds every Xid since the exporter started, not a new "
                    f"one: only its growth within {window} is, and a check on the counter "
                    "would drain the node again after a person resumed it"
                ),
                # Per Xid, the repair NVIDIA's catalog action asks for (by the alert's `xid`
                # label); a listed code the catalog lacks goes to a person.
                repair=xid_repairs(
                    shipped_catalog(), config.thresholds["xid_critical"], label="xid"
                ),
            ),
        ),
        Alert(
            name="GPUFallenOffBus",
            expr=union(
                [
                    _gpus_missing(q, p),
                    f"{events(xid79, window, first_sample_counts=True)}\n> 0",
                ]
            ),
            summary="GPU fell off the bus on node {{ $labels.node }}",
            description=(
                "{{ if $labels.xid }}" + GPU + " reported Xid 79: it fell off the bus."
                "{{ else }}Node {{ $labels.node }} sees only {{ $value }} GPUs in NVML, fewer "
                "than expected (the configured count, the GPUs on its PCI bus, or the most it "
                f"showed in the last {p('presence_history')}).{{{{ end }}}}"
            ),
            remediation=Remediation(
                reason="gpu-lost",
                manual="a GPU that fell off the bus needs a reboot or a repair, and a GPU "
                "that is gone exports nothing to judge",
                # One scrape shows fewer GPUs than configured or than on the PCI bus; fewer
                # than the node's history, and Xid 79, are Prometheus' to see.
                local=(
                    LocalCheck(family=VISIBLE, op="<", limit=Series(family=GPUS_EXPECTED.name)),
                    LocalCheck(family=VISIBLE, op="<", limit=Series(family=GPUS_PCI_PRESENT.name)),
                ),
                # Xid 79's catalog action: a reboot brings a GPU back onto the bus.
                repair=catalog_repair(shipped_catalog(), FALLEN_OFF_BUS),
            ),
        ),
        Alert(
            name="GPUUncorrectableECC",
            expr=(
                f"sum without (severity) (\n{events(ecc, window, first_sample_counts=False)}\n) > 0"
            ),
            summary="Uncorrectable ECC errors on node {{ $labels.node }}",
            description=f"{GPU} had {VALUE1} uncorrectable ECC errors in the last {window}.",
        ),
        Alert(
            name="GPURowRemapFailed",
            expr=f"{q.exporter(GPU_ROW_REMAP_FAILED.name)} > 0",
            summary="GPU row remapping failed on node {{ $labels.node }}",
            description=(
                f"{GPU} could not remap a failing memory row: its memory can no "
                "longer be repaired in the field."
            ),
            remediation=Remediation(
                reason="row-remap-failed",
                manual="the GPU's memory cannot be repaired in the field: it goes to RMA",
                local=(
                    LocalCheck(
                        family=GPU_ROW_REMAP_FAILED.name, op=">", limit=0, subject=GPU_SUBJECT
                    ),
                ),
                repair=HARDWARE_INSPECTION,
            ),
        ),
        Alert(
            name="GPURowRemapPending",
            expr=f"{q.exporter(GPU_ROW_REMAP_PENDING.name)} > 0",
            summary="GPU row remap pending on node {{ $labels.node }}",
            description=f"{GPU} has a row remap that takes effect at the next GPU reset.",
        ),
        Alert(
            name="GPURecoveryActionRequested",
            expr=f"{recovery} == 1",
            summary="GPU asks for a recovery action on node {{ $labels.node }}",
            description=f"{GPU} requests the recovery action {{{{ $labels.action }}}}.",
        ),
    ]


def fleet_alerts(config: Config, p: Params) -> list[Alert]:
    """Many nodes hot at once (global scope: it counts nodes)."""
    return [
        Alert(
            name="GPUOverheatingFleetWide",
            expr=(
                "count(node:fleetwatch_gpu_over_temperature_threshold:count > 0)\n"
                f"> {p('fleet_overheating_nodes')}"
            ),
            summary="GPUs past their overheat policy on {{ $value }} nodes at once",
            description=(
                "{{ $value }} nodes have a GPU past the overheat policy of its model "
                f"({overheat_policy_text(p.overheat_policies, p('gpu_temperature_celsius'))}), "
                "more than "
                f"{p('fleet_overheating_nodes')}: a cooling fault (a row, a CDU, an inlet) "
                "that tainting nodes one by one does not fix, and the tainter's breaker "
                "caps how many it takes out."
            ),
        ),
    ]
