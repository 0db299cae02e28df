"""The PromQL pieces every report query is built from, each over a report `Window`.

A selector carries the window's `--selector` and its node batch; durations are whole
seconds; time in a state is counted at `--step` resolution; a hardware counter's growth is
read from its samples alone, so Prometheus and VictoriaMetrics agree on it.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetwatch.report.query import Window
from fleetwatch.rules.definitions import Selector

DCGM_NODE_LABEL = "Hostname"
"""What names the node on dcgm-exporter series that Prometheus gave no `node` label."""


def select(
    window: Window, name: str, matchers: str = "", *, scoped: bool = True, node: str = "node"
) -> str:
    """`name{matchers, selector, batch}`; the batch's node regex goes on label `node`."""
    batch = f'{node}=~"{window.nodes}"' if scoped and window.nodes else ""
    parts = [m for m in (matchers, window.selector if scoped else "", batch) if m]
    return f"{name}{{{','.join(parts)}}}"


def duration(seconds: float) -> str:
    """A PromQL duration in whole seconds: `3600s`."""
    return f"{round(seconds)}s"


def time_in_state(window: Window, expr: str) -> str:
    """Seconds (at `step` resolution) during which the 0/1 expression was 1."""
    w = window
    return f"sum_over_time(({expr})[{duration(w.seconds)}:{duration(w.step)}]) * {w.step:g}"


def growth(window: Window, selector: str) -> str:
    """A hardware counter's growth within the window, exactly: its last sample minus its
    lowest. `increase()` extrapolates to the window's edges in Prometheus and not in
    VictoriaMetrics, so a count read with it differs between engines (5 flaps read as 5.02);
    this reads the samples only. After a reset (the exporter restarted) it counts the growth
    since the reset."""
    w = duration(window.seconds)
    return f"(last_over_time({selector}[{w}]) - min_over_time({selector}[{w}]))"


def window_delta(window: Window, selector: str) -> str:
    """Counter growth in the window, counting series that first appeared inside it."""
    w = duration(window.seconds)
    last = f"last_over_time({selector}[{w}])"
    return f"{last} - (last_over_time({selector}[{w}] offset {w}) or {last} * 0)"


def over_window(fn: str, metric: str) -> Callable[[Window], str]:
    """`fn(metric{selector}[window])`."""
    return lambda w: f"{fn}({select(w, metric)}[{duration(w.seconds)}])"


def per_bucket(
    fn: str, selector: Callable[[Window], str], by: tuple[str, ...]
) -> Callable[[Window], str]:
    """`max by (by) (fn(selector[bucket]))`: one value per series per bucket."""
    return lambda w: f"max by ({','.join(by)}) ({fn}({selector(w)}[{duration(w.bucket)}]))"


def over_bucket(w: Window, fn: str, *, scoped: bool = True, extra: str = "") -> Selector:
    """A `Selector` reading `fn(metric{matcher, ...}[bucket])` (for the rules' builders).

    A series without a `node` label (dcgm-exporter's, `node=""`) is batched by the
    `DCGM_NODE_LABEL` that stands in for it."""

    def selector(metric: str, matcher: str) -> str:
        matchers = ",".join(m for m in (extra, matcher) if m)
        node = DCGM_NODE_LABEL if matcher == 'node=""' else "node"
        picked = select(w, metric, matchers, scoped=scoped, node=node)
        return f"{fn}({picked}[{duration(w.bucket)}])"

    return selector
