"""Fabric alerts and rates: NVLink and InfiniBand links down, flapping, erroring,
degraded or saturated, and the GPU's NVLink fabric (NVL72) registration.

Thresholds are `thresholds.<name>` in rules/config.yaml, read here as `p("<name>")` (error
tables with `p.table`); each alert's severity, `for` and taint are `alerts.<AlertName>`;
how a taint lifts (its `Remediation`) is beside the alert's expression.
"""

from __future__ import annotations

from fleetwatch.catalog.exporter import COLLECTOR_UP
from fleetwatch.catalog.gpu import GPU_FABRIC_DEGRADED, GPU_FABRIC_STATE_ID
from fleetwatch.catalog.infiniband import (
    INFINIBAND_PORT_DATA_BYTES_TOTAL,
    INFINIBAND_PORT_ERROR_SATURATED,
    INFINIBAND_PORT_ERRORS_TOTAL,
    INFINIBAND_PORT_EXPECTED_RATE_BYTES_PER_SECOND,
    INFINIBAND_PORT_RATE_BYTES_PER_SECOND,
    INFINIBAND_PORT_STATE_CHANGES_TOTAL,
    INFINIBAND_PORT_UP,
)
from fleetwatch.catalog.nvlink import NVLINK_ERRORS_TOTAL, NVLINK_UP
from fleetwatch.rules.config import Config, Params
from fleetwatch.rules.contract import (
    GPU_RESET,
    GPU_SUBJECT,
    LINK_SUBJECT,
    NO_REPAIR,
    PORT_SUBJECT,
    LocalCheck,
    NeedsPrometheus,
)
from fleetwatch.rules.definitions import fabric_errors_record
from fleetwatch.rules.promql import (
    GPU,
    GPU_COLLECTOR,
    INFINIBAND_COLLECTOR,
    LINK,
    NVLINK_COLLECTOR,
    PORT,
    VALUE2,
    Alert,
    Healthy,
    Promql,
    Record,
    Remediation,
    clear_condition,
    events,
    match,
    union,
)

# NVML's GPU fabric registration states (`nvmlGpuFabricState_t`, exported as
# fleetwatch_gpu_fabric_state_id): NOT_SUPPORTED (0) is exported as no series at all.
FABRIC_NOT_STARTED = 1
FABRIC_IN_PROGRESS = 2
FABRIC_COMPLETED = 3


def records(config: Config, p: Params) -> list[Record]:
    """Error and data rates per link and port, and each node's fabric errors per second."""
    del p  # no thresholds: rates only
    q = Promql(config)
    nvlink = NVLINK_ERRORS_TOTAL.name
    ib = INFINIBAND_PORT_ERRORS_TOTAL.name
    ib_data = INFINIBAND_PORT_DATA_BYTES_TOTAL.name
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


PORT_UP = INFINIBAND_PORT_UP.name
PORT_RATE = INFINIBAND_PORT_RATE_BYTES_PER_SECOND.name
PORT_LEVEL = "job_node_device_port"


def history(config: Config, p: Params) -> list[Record]:
    """The InfiniBand ports each node had over `presence_history`, and the fastest rate
    each trained at."""
    q = Promql(config)
    return [
        record
        for metric in (PORT_UP, PORT_RATE)
        for record in q.history(PORT_LEVEL, metric, history=p("presence_history"))
    ]


def alerts(config: Config, p: Params) -> list[Alert]:
    """NVLink and InfiniBand: links down, flapping, erroring, degraded or saturated."""
    q = Promql(config)
    nvlink_rate = q.rate_name("node_gpu_link", NVLINK_ERRORS_TOTAL.name)
    ib_errors = INFINIBAND_PORT_ERRORS_TOTAL.name
    ib_rate = q.rate_name("node_device_port", ib_errors)
    flap_window = p("infiniband_flap_window")
    flaps = p("infiniband_flaps")
    port_up = q.exporter(PORT_UP)
    link_downed = q.exporter(ib_errors, match("error", "=", "link_downed"))
    recoveries = q.exporter(NVLINK_ERRORS_TOTAL.name, match("error", "=", "recovery"))
    state_changes = q.exporter(INFINIBAND_PORT_STATE_CHANGES_TOTAL.name)
    fabric_state = q.exporter(GPU_FABRIC_STATE_ID.name)
    window, grace, history = p("event_window"), p("presence_grace"), p("presence_history")
    port = "node, device, port"
    rate = q.exporter(PORT_RATE)
    expected_rate = q.exporter(INFINIBAND_PORT_EXPECTED_RATE_BYTES_PER_SECOND.name)
    ib_collector = q.exporter(COLLECTOR_UP.name, match("collector", "=", "infiniband"))
    hold_down = p("untaint_hold_down")

    def cleared(collector: str, *healthy: Healthy) -> str:
        """A clear condition of this area, with the configured hold-down."""
        return clear_condition(q, collector=collector, hold_down=hold_down, healthy=healthy)

    return [
        Alert(
            name="NVLinkDown",
            expr=f"{q.exporter(NVLINK_UP.name)} == 0",
            summary="NVLink down on node {{ $labels.node }}",
            description=f"{LINK} is down.",
            remediation=Remediation(
                reason="nvlink-down",
                clear=cleared(NVLINK_COLLECTOR, Healthy(NVLINK_UP.name, "min", "== 1")),
                local=(LocalCheck(family=NVLINK_UP.name, op="==", limit=0, subject=LINK_SUBJECT),),
                # A link that is down retrains on a GPU reset (runbook: reset, or reboot).
                repair=GPU_RESET,
            ),
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
            name="NVLinkRecovery",
            expr=(
                f"{events(recoveries, window, first_sample_counts=False)}\n"
                f"> {p('nvlink_recoveries')}"
            ),
            summary="NVLink link recovered on node {{ $labels.node }}",
            description=(
                f"{LINK} recovered (retrained) in the last {window}, {{{{ $value }}}} "
                "time(s): traffic stalled while it retrained, and a link that recovers again "
                "is failing."
            ),
        ),
        Alert(
            name="GPUFabricDegraded",
            expr=f"{q.exporter(GPU_FABRIC_DEGRADED.name)} == 1",
            summary="GPU NVLink fabric degraded on node {{ $labels.node }}",
            description=(
                f"{GPU} reports its NVLink fabric registration failed or its fabric "
                "bandwidth degraded: every job in its NVLink domain slows down or fails."
            ),
            remediation=Remediation(
                reason="gpu-fabric",
                clear=cleared(GPU_COLLECTOR, Healthy(GPU_FABRIC_DEGRADED.name, "max", "== 0")),
                local=(
                    LocalCheck(
                        family=GPU_FABRIC_DEGRADED.name, op="==", limit=1, subject=GPU_SUBJECT
                    ),
                ),
                # The GPU registers with its fabric again after a reset (NVL72 procedure).
                repair=GPU_RESET,
            ),
        ),
        Alert(
            name="GPUFabricNotRegistered",
            expr=union(
                [f"{fabric_state} == {s}" for s in (FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS)]
            ),
            summary="GPU not registered with its NVLink fabric on node {{ $labels.node }}",
            description=(
                f"{GPU} has not completed its NVLink fabric registration (state "
                "{{ if eq $value 1.0 }}not started{{ else }}in progress{{ end }}): the "
                "NVIDIA Fabric Manager or NVLink switch is not serving it, and CUDA jobs on "
                "it fail (error 802, system not yet initialized)."
            ),
            # Registered again: every GPU of the node reports COMPLETED.
            remediation=Remediation(
                reason="gpu-fabric",
                clear=cleared(
                    GPU_COLLECTOR,
                    Healthy(GPU_FABRIC_STATE_ID.name, "min", f"== {FABRIC_COMPLETED}"),
                ),
                local=NeedsPrometheus(
                    why="a GPU registers with its fabric after boot and after a Fabric Manager "
                    "restart: not started or in progress is a fault only when it lasts (the "
                    "alert's `for`), and slurmd runs the health check at boot"
                ),
                repair=GPU_RESET,
            ),
        ),
        Alert(
            name="InfiniBandPortDown",
            expr=f"{port_up} == 0",
            summary="InfiniBand port down on node {{ $labels.node }}",
            description=f"{PORT} is not ACTIVE/LinkUp.",
            remediation=Remediation(
                reason="infiniband-port-down",
                clear=cleared(INFINIBAND_COLLECTOR, Healthy(PORT_UP, "min", "== 1")),
                local=(LocalCheck(family=PORT_UP, op="==", limit=0, subject=PORT_SUBJECT),),
                # A port down is a cable, a switch or the far end: nothing on the node fixes it.
                repair=NO_REPAIR,
            ),
        ),
        Alert(
            name="InfiniBandLinkFlapping",
            expr=union(
                [
                    "sum without (error) (\n"
                    f"{events(link_downed, flap_window, first_sample_counts=False)}\n) > {flaps}",
                    f"{events(state_changes, flap_window, first_sample_counts=True)}\n> {flaps}",
                ]
            ),
            summary="InfiniBand link flapping on node {{ $labels.node }}",
            description=(
                f"{PORT} went down or changed state {{{{ $value }}}} times in {flap_window}."
            ),
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
                    f"{events(q.exporter(ib_errors, match('error', '=', error)), '1h', first_sample_counts=False)}\n> {limit}"  # noqa: E501
                    for error, limit in p.table("infiniband_errors_per_hour").items()
                ]
            ),
            summary="Too many InfiniBand {{ $labels.error }} errors on node {{ $labels.node }}",
            description=(
                f"{PORT} counted {{{{ $value }}}} {{{{ $labels.error }}}} errors in the last hour."
            ),
        ),
        Alert(
            name="InfiniBandLinkDegraded",
            expr="(\n"
            + union(
                [
                    f"{rate}\n< {expected_rate}",
                    f"{rate}\n< on ({port}) group_left ()\n"
                    f"{q.history_name(PORT_LEVEL, PORT_RATE)}\n"
                    f"unless on ({port})\n{expected_rate}",
                ]
            )
            + f"\n)\nand\n{port_up} == 1",
            summary="InfiniBand link trained below its expected rate on node {{ $labels.node }}",
            description=(
                f"{PORT} runs at {{{{ $value | humanize }}}}B/s, below its configured rate or "
                f"the fastest it trained at in the last {history}."
            ),
        ),
        Alert(
            name="InfiniBandPortMissing",
            expr=(
                f"{q.history_name(PORT_LEVEL, PORT_UP)}\n"
                f"unless on ({port})\nmax_over_time({port_up}[{grace}])\n"
                f"and on (node)\nmax by (node) (min_over_time({ib_collector}[{grace}])) == 1"
            ),
            summary="InfiniBand port gone on node {{ $labels.node }}",
            description=(
                f"{PORT} was there within the last {history} and has not been seen for "
                f"{grace}, while the node's InfiniBand collector works: the HCA or its port "
                "disappeared (a failed HCA, a firmware fault, a driver that did not bind)."
            ),
        ),
        Alert(
            name="InfiniBandCounterSaturated",
            expr=(
                f"{q.exporter(INFINIBAND_PORT_ERROR_SATURATED.name, match('error', '!~', p('infiniband_saturated_ignore')))}"  # noqa: E501
                " == 1"
            ),
            summary="InfiniBand {{ $labels.error }} counter saturated on node {{ $labels.node }}",
            description=(
                f"The {{{{ $labels.error }}}} counter of {PORT} is pinned at its "
                "maximum: its rate reads 0 however many errors happen."
            ),
        ),
    ]
