"""GPU alerts and the fleet's GPU views: heat (now and soon), throttling, Xid, memory
health, lost GPUs; tensor activity, utilization and temperature per node and fleet.

Thresholds are `thresholds.<name>` in rules/config.yaml, read here as `p("<name>")`; each
alert's severity, `for`, `keep_firing_for` and taint are `alerts.<AlertName>` there.
"""

from __future__ import annotations

from fleetwatch.rules.config import Config, Params
from fleetwatch.rules.definitions import TENSOR, tensor_active
from fleetwatch.rules.promql import (
    GPU,
    VALUE1,
    Alert,
    Promql,
    Record,
    match,
    new_or_increased,
    union,
)

GROUP = "fleetwatch-gpu"


def records(config: Config, p: Params) -> list[Record]:
    """Tensor activity per GPU from either source, and node and fleet views of activity,
    utilization and heat (`level:metric:operation`)."""
    q = Promql(config)
    util = q.exporter("fleetwatch_gpu_utilization_ratio")
    temp = q.exporter("fleetwatch_gpu_temperature_celsius", 'sensor="gpu"')
    above = f"{temp} > bool {p('gpu_temperature_celsius')}"
    activity = tensor_active(
        config, own=q.exporter, dcgm=lambda metric, matcher: f"{metric}{{{matcher}}}"
    )
    return [
        Record(record=TENSOR, expr=activity),
        Record(
            record="node:fleetwatch_gpu_tensor_active_ratio:avg", expr=f"avg by (node) ({TENSOR})"
        ),
        Record(record="fleet:fleetwatch_gpu_tensor_active_ratio:avg", expr=f"avg({TENSOR})"),
        Record(record="node:fleetwatch_gpu_utilization_ratio:avg", expr=f"avg by (node) ({util})"),
        Record(record="fleet:fleetwatch_gpu_utilization_ratio:avg", expr=f"avg({util})"),
        Record(
            record="node:fleetwatch_gpu_temperature_celsius:max", expr=f"max by (node) ({temp})"
        ),
        Record(
            record="node:fleetwatch_gpu_over_temperature_threshold:count",
            expr=f"sum by (node) ({above})",
        ),
        Record(
            record="fleet:fleetwatch_gpu_over_temperature_threshold:count", expr=f"sum({above})"
        ),
    ]


def alerts(config: Config, p: Params) -> list[Alert]:
    """Heat (now and soon), throttling, Xid, memory health and lost GPUs."""
    q = Promql(config)
    temp = "fleetwatch_gpu_temperature_celsius"
    xid = "fleetwatch_gpu_xid_errors_total"
    window = p("event_window")
    critical_xid = q.exporter(xid, f'xid=~"{p("xid_critical")}"')
    xid79 = q.exporter(xid, 'xid="79"')
    count = q.exporter("fleetwatch_gpus_visible")
    expected = q.exporter("fleetwatch_gpus_expected")
    ecc = q.exporter("fleetwatch_gpu_ecc_errors_total", 'severity="uncorrected"')
    clock = "fleetwatch_gpu_clock_event_active"
    # One-hot by action (none, gpu_reset, node_reboot, drain_p2p, drain_and_reset).
    recovery = q.exporter("fleetwatch_gpu_recovery_action", match("action", "!=", "none"))
    gpu_temp = q.exporter(temp, match("sensor", "=", "gpu"))
    memory_temp = q.exporter(temp, match("sensor", "=", "memory"))
    thermal = q.exporter(clock, match("reason", "=~", "hw_thermal_slowdown|sw_thermal_slowdown"))
    return [
        Alert(
            name="GPUOverheating",
            expr=f"{gpu_temp} > {p('gpu_temperature_celsius')}",
            summary=f"GPU above {p('gpu_temperature_celsius')} °C on node {{{{ $labels.node }}}}",
            description=(
                f"{GPU} is at {VALUE1} °C, above the fleet limit of "
                f"{p('gpu_temperature_celsius')} °C."
            ),
        ),
        Alert(
            name="GPUOverheatingSoon",
            expr=(
                f"predict_linear({gpu_temp}[{p('overheat_trend_window')}], "
                f"{p('overheat_horizon_seconds')})\n> {p('gpu_temperature_celsius')}\n"
                f"and\n{gpu_temp} <= {p('gpu_temperature_celsius')}\n"
                f"and\n{gpu_temp} > {p('gpu_temperature_celsius')} - "
                f"{p('overheat_warning_margin_celsius')}"
            ),
            summary=f"GPU heading above {p('gpu_temperature_celsius')} °C on node "
            "{{ $labels.node }}",
            description=(
                f"{GPU} is on a trend to {VALUE1} °C within "
                f"{p('overheat_horizon_seconds')} seconds, above the fleet limit of "
                f"{p('gpu_temperature_celsius')} °C where the node is tainted: let its job "
                "checkpoint now."
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
            expr=f"{thermal} == 1",
            summary="GPU clocks thermally throttled on node {{ $labels.node }}",
            description=f"{GPU} is slowing its clocks ({{{{ $labels.reason }}}}).",
        ),
        Alert(
            name="GPUPowerBrake",
            expr=f"{q.exporter(clock, match('reason', '=', 'hw_power_brake'))} == 1",
            summary="GPU hardware power brake active on node {{ $labels.node }}",
            description=(
                f"{GPU} has its hardware power brake asserted: the board or the "
                "power supply signalled an external power problem."
            ),
        ),
        Alert(
            name="GPUXidCritical",
            expr=new_or_increased(critical_xid, window),
            summary="Critical Xid {{ $labels.xid }} on node {{ $labels.node }}",
            description=(
                f"{GPU} reported Xid {{{{ $labels.xid }}}} within the last "
                f"{window}; NVIDIA's catalog asks for a GPU reset, a node reboot or NVIDIA support."
            ),
        ),
        Alert(
            name="GPUFallenOffBus",
            expr=union([f"{count} < {expected}", new_or_increased(xid79, window)]),
            summary="GPU fell off the bus on node {{ $labels.node }}",
            description=(
                "{{ if $labels.xid }}" + GPU + " reported Xid 79: it fell off the bus."
                "{{ else }}Node {{ $labels.node }} sees only {{ $value }} GPUs, fewer than "
                "expected.{{ end }}"
            ),
        ),
        Alert(
            name="GPUUncorrectableECC",
            expr=f"sum without (severity) (increase({ecc}[{window}])) > 0",
            summary="Uncorrectable ECC errors on node {{ $labels.node }}",
            description=f"{GPU} had {VALUE1} uncorrectable ECC errors in the last {window}.",
        ),
        Alert(
            name="GPURowRemapFailed",
            expr=f"{q.exporter('fleetwatch_gpu_row_remap_failed')} > 0",
            summary="GPU row remapping failed on node {{ $labels.node }}",
            description=(
                f"{GPU} could not remap a failing memory row: its memory can no "
                "longer be repaired in the field."
            ),
        ),
        Alert(
            name="GPURowRemapPending",
            expr=f"{q.exporter('fleetwatch_gpu_row_remap_pending')} > 0",
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
