"""The PromQL helper layer the rule definitions are written with.

Rules are plain data (`Alert`, `Record`); the helpers here build selectors with the
configured job matchers (so no rule hard-codes `job="fleetwatch"`), join alternatives, and
write the annotation fragments (labels, values, lookups) every area shares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from fleetwatch.catalog.exporter import COLLECTOR_UP
from fleetwatch.rules.config import Config
from fleetwatch.rules.contract import NODE_PLACEHOLDER, Local, Repair

# The exporter's collectors (the `collector` label of COLLECTOR_UP) whose success the clear
# conditions require.
GPU_COLLECTOR: Final = "gpu"
NVLINK_COLLECTOR: Final = "nvlink"
INFINIBAND_COLLECTOR: Final = "infiniband"


@dataclass(frozen=True, kw_only=True)
class Remediation:
    """How the taint an alert requests is lifted: the undo, read beside the action.

    `reason` is the taint reason (`fleetwatch.io/<reason>`); the alert asks for it when
    config.yaml's `alerts.<name>.taint` names it. Exactly one of: `clear`, a PromQL query for
    one node (`$node`) that returns a non-empty result only when positive evidence says
    the condition is gone (see `clear_condition`); or `manual`, why only a person may lift
    it. `local`: how one scrape of the node's exporter shows the alert's condition (the
    Slurm health check's judgement where no Prometheus answers), or `NeedsPrometheus` with
    why one scrape cannot; an alert that taints must say one or the other. `repair`: what
    puts the node back once it is out (`fleetwatch.rules.contract.REPAIRS`, or by a label of
    the alert, `RepairByLabel`), from NVIDIA's Xid catalog where an Xid is the reason; an
    alert that taints must declare it.
    """

    reason: str
    clear: str | None = None
    manual: str | None = None
    local: Local | None = None
    repair: Repair | None = None

    def __post_init__(self) -> None:
        if (self.clear is None) == (self.manual is None):
            raise ValueError(f"remediation of {self.reason!r}: give exactly one of clear, manual")


@dataclass(frozen=True, kw_only=True)
class Alert:
    """One alert's definition: what it matches and what it says, and for an alert that
    may taint, how its taint is lifted (`remediation`).

    Its severity, `for`, hysteresis and taint come from the `alerts:` section of
    config.yaml under the same name.
    """

    name: str
    expr: str
    summary: str
    description: str
    remediation: Remediation | None = None


@dataclass(frozen=True, kw_only=True)
class Record:
    """One recording rule."""

    record: str
    expr: str


def match(label: str, op: str, value: str) -> str:
    """One PromQL label matcher: `label op "value"`."""
    return f'{label}{op}"{value}"'


class Promql:
    """Builds selectors with the configured job matchers, so no rule hard-codes them."""

    def __init__(self, config: Config) -> None:
        self._exporter = config.exporter_selector
        self._tainter = config.tainter_selector
        self._kube_state_metrics = config.kube_state_metrics_selector
        self.window = config.rate_window
        self.history_interval = config.history_interval

    def exporter(self, metric: str, *matchers: str) -> str:
        """`metric{job="fleetwatch", matchers...}`."""
        return f"{metric}{{{', '.join((self._exporter, *matchers))}}}"

    def tainter(self, metric: str, *matchers: str) -> str:
        return f"{metric}{{{', '.join((self._tainter, *matchers))}}}"

    def kube_state_metrics(self, metric: str, *matchers: str) -> str:
        return f"{metric}{{{', '.join((self._kube_state_metrics, *matchers))}}}"

    def rate_name(self, level: str, metric: str) -> str:
        """Recording-rule name of a counter's rate: `level:metric_without_total:rate1m`."""
        return f"{level}:{metric.removesuffix('_total')}:rate{self.window}"

    def history_name(self, level: str, metric: str) -> str:
        """Recording-rule name of a gauge's highest value over `presence_history`."""
        return f"{level}:{metric}:history_max"

    def history(self, level: str, metric: str, *, history: str) -> list[Record]:
        """Two recording rules (the `intervals.history` group) that keep the highest value
        of the exporter's `metric` per `level` labels (`job_node`: by job, node) over
        `history`: each interval's highest, then the highest of those. By node, not by
        instance, so an exporter pod replaced (a new `instance`) keeps the node's history;
        the series exists for whatever was present at any time in `history`."""
        tile = f"{level}:{metric}:max{self.history_interval}"
        labels = ", ".join(level.split("_"))
        return [
            Record(
                record=tile,
                expr=(
                    f"max by ({labels}) "
                    f"(max_over_time({self.exporter(metric)}[{self.history_interval}]))"
                ),
            ),
            Record(
                record=self.history_name(level, metric),
                expr=f"max_over_time({tile}[{history}])",
            ),
        ]


@dataclass(frozen=True)
class Healthy:
    """One part of a clear condition: the node's worst series of `metric` (with
    `matchers`), "max" or "min" over its GPUs, links or ports, passes `test` (`< 75`)."""

    metric: str
    worst: str
    test: str
    matchers: tuple[str, ...] = ()


@dataclass(frozen=True)
class HealthyBy:
    """A part of a clear condition over an expression of its own: `build(node, window)`
    gives each series' value for the node matcher `node`, its worst over `window` when one
    is given (now when None); the node's `worst` ("max" or "min") of those passes `test`."""

    build: Callable[[str, str | None], str]
    worst: str
    test: str


def clear_condition(
    q: Promql, *, collector: str, hold_down: str, healthy: Sequence[Healthy | HealthyBy]
) -> str:
    """A taint's clear condition for node `$node`: positive evidence, never an absence.

    Non-empty only when, now and at every sample of the last `hold_down`, the node's
    exporter is scraped (`up` under the exporter selector is 1), its `collector` reports
    success, and each `healthy` part holds. Every term is an aggregation of present
    series joined `on (node)`, so a node whose series vanished (exporter gone, collector
    dropped its series) reads as not clear; and the exporter must have been up already
    `hold_down` ago, so a node that just reappeared waits out the whole hold-down.
    """
    node = match("node", "=", NODE_PLACEHOLDER)
    up = q.exporter("up", node)
    collector_up = q.exporter(COLLECTOR_UP.name, match("collector", "=", collector), node)
    terms = [
        f"min by (node) ({up} offset {hold_down}) == 1",
        f"min by (node) (min_over_time({up}[{hold_down}])) == 1",
        f"min by (node) (min_over_time({collector_up}[{hold_down}])) == 1",
    ]
    for part in healthy:
        worst = part.worst
        if isinstance(part, HealthyBy):
            terms += [
                f"{worst} by (node) ({part.build(node, hold_down)}) {part.test}",
                f"{worst} by (node) ({part.build(node, None)}) {part.test}",
            ]
            continue
        series = q.exporter(part.metric, *part.matchers, node)
        terms += [
            f"{worst} by (node) ({worst}_over_time({series}[{hold_down}])) {part.test}",
            f"{worst} by (node) ({series}) {part.test}",
        ]
    terms += [f"min by (node) ({up}) == 1", f"min by (node) ({collector_up}) == 1"]
    return "\nand on (node)\n".join(terms)


def union(parts: Sequence[str]) -> str:
    """PromQL `or` of parenthesised expressions, one per line."""
    return "\n  or\n".join(f"({part})" for part in parts)


def events(series: str, window: str, *, first_sample_counts: bool) -> str:
    """How many events a small integer counter counted within `window`, exactly.

    `increase()` extrapolates to the window's edges in Prometheus (one down/up cycle of an
    InfiniBand port reads as 2.03 state changes, and `> 2` fires) while MetricsQL does not:
    an alert on a small count must read the count itself. Both engines compute the same
    here, from the counter's samples only:

    - a series that existed `window` ago and did not go down: now minus then;
    - a series that appeared within the window, or went down within it (a reset: the
      counter's source restarted), counts from its own start: its value now when
      `first_sample_counts` (a counter the exporter creates at its first event, or starts
      at 0, such as an Xid counter: its first sample is events), else its growth since
      its lowest sample in the window (a hardware counter, such as link_downed, whose
      first sample is history: a new node or a restarted exporter is not an event).

    Never negative: a reset is not a negative count. The result is parenthesised, ready
    for a comparison.
    """
    before = f"{series} offset {window}"
    since = series if first_sample_counts else f"{series} - min_over_time({series}[{window}])"
    return f"(\n  ({series} - ({before} <= {series}))\n  or\n  ({since})\n)"


def lookup(query: str, *labels: str, then: str, otherwise: str = "", sort: str = "node") -> str:
    """An annotation fragment: run `query` (printf-formatted with the alert's `labels`),
    render `then` for each result (`.Labels`, `.Value`) in order of label `sort`, separated
    by commas, or `otherwise` when it returns nothing."""
    args = " ".join(f"$labels.{label}" for label in labels)
    tail = f"{{{{ else }}}}{otherwise}" if otherwise else ""
    return (
        f'{{{{ range $i, $r := printf `{query}` {args} | query | sortByLabel "{sort}" }}}}'
        f"{{{{ if $i }}}}, {{{{ end }}}}{then}{tail}{{{{ end }}}}"
    )


# Annotation fragments: how an alert names what it is about, and its value.
GPU: Final = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on node {{ $labels.node }}"
PORT: Final = "InfiniBand port {{ $labels.device }}/{{ $labels.port }} on node {{ $labels.node }}"
LINK: Final = "NVLink {{ $labels.link }} of GPU {{ $labels.gpu }} on node {{ $labels.node }}"
VALUE1: Final = '{{ $value | printf "%.1f" }}'
VALUE2: Final = '{{ $value | printf "%.2f" }}'
PERCENT: Final = "{{ $value | humanizePercentage }}"
