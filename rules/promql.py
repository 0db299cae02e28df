"""The PromQL helper layer the rule definitions are written with.

Rules are plain data (`Alert`, `Record`); the helpers here build selectors with the
configured job matchers (so no rule hard-codes `job="fleetwatch"`), join alternatives, and
write the annotation fragments (labels, values, lookups) every area shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from fleetwatch.rules.config import Config


@dataclass(frozen=True, kw_only=True)
class Alert:
    """One alert's definition: what it matches and what it says.

    Its severity, `for`, hysteresis and taint come from the `alerts:` section of
    config.yaml under the same name.
    """

    name: str
    expr: str
    summary: str
    description: str


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


def union(parts: Sequence[str]) -> str:
    """PromQL `or` of parenthesised expressions, one per line."""
    return "\n  or\n".join(f"({part})" for part in parts)


def new_or_increased(series: str, window: str) -> str:
    """A counter that grew within `window`, or whose series first appeared within it.

    Xid counters are created by the first Xid, so their first sample is already 1 and
    increase() alone would miss it.
    """
    return f"increase({series}[{window}]) > 0\n  or\n({series} unless {series} offset {window})"


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
