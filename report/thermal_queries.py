"""The Thermal section's queries: GPU temperature, power, and time too hot or throttled.

Time too hot is time past each GPU model's overheat policy, through the headroom PromQL
the alerts use (`fleetwatch.rules.definitions.overheat_headroom`); thermal slowdown is the
growth of NVML's cumulative clock-event time for the thermal reasons.
"""

from __future__ import annotations

from fleetwatch.catalog.gpu import (
    GPU_CLOCK_EVENT_SECONDS_TOTAL,
    GPU_INFO,
    GPU_POWER_WATTS,
    GPU_TEMPERATURE_CELSIUS,
    GPU_TEMPERATURE_MARGIN_CELSIUS,
)
from fleetwatch.report.query import GPU, Query, Window
from fleetwatch.report.windowed_promql import duration, growth, select, time_in_state
from fleetwatch.rules.definitions import overheat_headroom

TEMP = GPU_TEMPERATURE_CELSIUS.name
POWER = GPU_POWER_WATTS.name
CLOCK_EVENTS = GPU_CLOCK_EVENT_SECONDS_TOTAL.name


def gpu_temperature(w: Window) -> str:
    """The GPU (not memory) temperature series in the window's scope."""
    return select(w, TEMP, 'sensor="gpu"')


def _headroom(w: Window) -> str:
    """Per GPU, °C left before its model's overheat policy, as the rules read it."""

    def selector(metric: str, matcher: str) -> str:
        return select(w, metric, matcher)

    return overheat_headroom(
        lambda metric, matcher, worst: selector(metric, matcher),
        selector,
        w.overheat_policy,
        default_celsius=f"{w.threshold_celsius:g}",
    )


THERMAL: tuple[Query, ...] = (
    Query(
        name="temp_p99",
        shape="summary",
        keys=GPU,
        required=(TEMP,),
        build=lambda w: (
            f"max by (node,gpu,uuid) (quantile_over_time(0.99, "
            f"{gpu_temperature(w)}[{duration(w.seconds)}]))"
        ),
    ),
    Query(
        name="temp_max",
        shape="summary",
        keys=GPU,
        required=(TEMP,),
        build=lambda w: (
            f"max by (node,gpu,uuid) (max_over_time({gpu_temperature(w)}[{duration(w.seconds)}]))"
        ),
    ),
    Query(
        name="temp_median",
        shape="summary",
        keys=GPU,
        required=(TEMP,),
        build=lambda w: (
            f"max by (node,gpu,uuid) (quantile_over_time(0.5, "
            f"{gpu_temperature(w)}[{duration(w.seconds)}]))"
        ),
    ),
    Query(
        name="power_median",
        shape="summary",
        keys=GPU,
        required=(POWER,),
        build=lambda w: (
            f"max by (node,gpu,uuid) (quantile_over_time(0.5, "
            f"{select(w, POWER)}[{duration(w.seconds)}]))"
        ),
    ),
    Query(
        name="temp_above_seconds",
        shape="summary",
        keys=GPU,
        required=(TEMP,),
        build=lambda w: (
            "max by (node,gpu,uuid) ("
            + time_in_state(w, f"(\n{_headroom(w)}\n) < bool 0")
            + ") > 0"
        ),
        optional=(GPU_INFO.name, GPU_TEMPERATURE_MARGIN_CELSIUS.name),
    ),
    Query(
        name="thermal_slowdown_seconds",
        shape="summary",
        keys=GPU,
        required=(CLOCK_EVENTS,),
        build=lambda w: (
            "sum by (node,gpu,uuid) ("
            + growth(
                w, select(w, CLOCK_EVENTS, 'reason=~"sw_thermal_slowdown|hw_thermal_slowdown"')
            )
            + ") > 0"
        ),
    ),
)
