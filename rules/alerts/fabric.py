"""Fabric alerts and rates: NVLink and InfiniBand links down, flapping, erroring,
degraded or saturated, and the GPU's NVLink fabric (NVL72) registration.

Thresholds are `thresholds.<name>` in rules/config.yaml, read here as `p("<name>")` (error
tables with `p.table`); each alert's severity, `for` and taint are `alerts.<AlertName>`.
"""

from __future__ import annotations

from fleetwatch.rules.config import Config, Params
from fleetwatch.rules.definitions import fabric_errors_record
from fleetwatch.rules.promql import (
    GPU,
    LINK,
    PORT,
    VALUE1,
    VALUE2,
    Alert,
    Promql,
    Record,
    match,
    union,
)

GROUP = "fleetwatch-fabric"


def records(config: Config, p: Params) -> list[Record]:
    """Error and data rates per link and port, and each node's fabric errors per second."""
    del p  # no thresholds: rates only
    q = Promql(config)
    nvlink = "fleetwatch_nvlink_errors_total"
    ib = "fleetwatch_infiniband_port_errors_total"
    ib_data = "fleetwatch_infiniband_port_data_bytes_total"
    nvlink_rate = q.rate_name("node_gpu_link", nvlink)
    ib_rate = q.rate_name("node_device_port", ib)
    return [
        Record(record=nvlink_rate, expr=f"rate({q.exporter(nvlink)}[{q.window}])"),
        Record(record=ib_rate, expr=f"rate({q.exporter(ib)}[{q.window}])"),
        Record(
            record=q.rate_name("node_device_port", ib_data),
            expr=f"rate({q.exporter(ib_data)}[{q.window}])",
        ),
        Record(
            record=fabric_errors_record(config),
            expr=union(
                [
                    f'label_replace(sum by (node) ({rate}), "fabric", "{fabric}", "__name__", ".*")'
                    for fabric, rate in (("NVLink", nvlink_rate), ("InfiniBand", ib_rate))
                ]
            ),
        ),
    ]


def alerts(config: Config, p: Params) -> list[Alert]:
    """NVLink and InfiniBand: links down, flapping, erroring, degraded or saturated."""
    q = Promql(config)
    nvlink_rate = q.rate_name("node_gpu_link", "fleetwatch_nvlink_errors_total")
    ib_errors = "fleetwatch_infiniband_port_errors_total"
    ib_rate = q.rate_name("node_device_port", ib_errors)
    flap_window = p("infiniband_flap_window")
    flaps = p("infiniband_flaps")
    port_up = q.exporter("fleetwatch_infiniband_port_up")
    link_downed = q.exporter(ib_errors, match("error", "=", "link_downed"))
    return [
        Alert(
            name="NVLinkDown",
            expr=f"{q.exporter('fleetwatch_nvlink_up')} == 0",
            summary="NVLink down on node {{ $labels.node }}",
            description=f"{LINK} is down.",
        ),
        Alert(
            name="NVLinkErrorsRising",
            expr=union(
                [
                    f'{nvlink_rate}{{error="{error}"}} > {limit}'
                    for error, limit in p.table("nvlink_errors_per_second").items()
                ]
            ),
            summary="NVLink {{ $labels.error }} errors rising on node {{ $labels.node }}",
            description=f"{LINK} counts {VALUE2} {{{{ $labels.error }}}} errors per second.",
        ),
        Alert(
            name="GPUFabricDegraded",
            expr=f"{q.exporter('fleetwatch_gpu_fabric_degraded')} == 1",
            summary="GPU NVLink fabric degraded on node {{ $labels.node }}",
            description=(
                f"{GPU} reports its NVLink fabric registration failed or its fabric "
                "bandwidth degraded: every job in its NVLink domain slows down or fails."
            ),
        ),
        Alert(
            name="InfiniBandPortDown",
            expr=f"{port_up} == 0",
            summary="InfiniBand port down on node {{ $labels.node }}",
            description=f"{PORT} is not ACTIVE/LinkUp.",
        ),
        Alert(
            name="InfiniBandLinkFlapping",
            expr=union(
                [
                    f"sum without (error) (increase({link_downed}[{flap_window}])) > {flaps}",
                    f"increase({q.exporter('fleetwatch_infiniband_port_state_changes_total')}"
                    f"[{flap_window}]) > {flaps}",
                ]
            ),
            summary="InfiniBand link flapping on node {{ $labels.node }}",
            description=f"{PORT} went down or changed state {VALUE1} times in {flap_window}.",
        ),
        Alert(
            name="InfiniBandErrorRateHigh",
            expr=union(
                [
                    f'{ib_rate}{{error="{error}"}} > {limit}'
                    for error, limit in p.table("infiniband_errors_per_second").items()
                ]
            ),
            summary="InfiniBand {{ $labels.error }} errors on node {{ $labels.node }}",
            description=f"{PORT} counts {VALUE2} {{{{ $labels.error }}}} errors per second.",
        ),
        Alert(
            name="InfiniBandErrorCountHigh",
            expr=union(
                [
                    f"increase({q.exporter(ib_errors, match('error', '=', error))}[1h]) > {limit}"
                    for error, limit in p.table("infiniband_errors_per_hour").items()
                ]
            ),
            summary="Too many InfiniBand {{ $labels.error }} errors on node {{ $labels.node }}",
            description=f"{PORT} counted {VALUE1} {{{{ $labels.error }}}} errors in the last hour.",
        ),
        Alert(
            name="InfiniBandLinkDegraded",
            expr=(
                f"{q.exporter('fleetwatch_infiniband_port_rate_bytes_per_second')}\n< "
                f"{q.exporter('fleetwatch_infiniband_port_expected_rate_bytes_per_second')}\n"
                f"and\n{port_up} == 1"
            ),
            summary="InfiniBand link trained below its expected rate on node {{ $labels.node }}",
            description=(
                f"{PORT} runs at {{{{ $value | humanize }}}}B/s, below its configured rate."
            ),
        ),
        Alert(
            name="InfiniBandCounterSaturated",
            expr=(
                f"{q.exporter('fleetwatch_infiniband_port_error_saturated', match('error', '!~', p('infiniband_saturated_ignore')))}"  # noqa: E501
                " == 1"
            ),
            summary="InfiniBand {{ $labels.error }} counter saturated on node {{ $labels.node }}",
            description=(
                f"The {{{{ $labels.error }}}} counter of {PORT} is pinned at its "
                "maximum: its rate reads 0 however many errors happen."
            ),
        ),
    ]
