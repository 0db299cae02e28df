"""Metric specs as a table, and a builder that fills families from readings.

Collectors declare each family once (`MetricSpec`: name, type, help, label names) and add
samples by label values; the builder checks the label count, skips absent values (a value
the hardware does not report is absent, never a fake 0) and returns only families that
have samples.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)

MetricKind = Literal["gauge", "counter"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric family of the contract. Counters are named with their `_total` suffix."""

    name: str
    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()

    def new_family(self) -> Metric:
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.help, labels=self.labels)
        return GaugeMetricFamily(self.name, self.help, labels=self.labels)


class FamilyBuilder:
    """Accumulates samples for a fixed table of specs during one collection."""

    def __init__(self, specs: Iterable[MetricSpec]) -> None:
        self._specs = {spec.name: spec for spec in specs}
        self._families: dict[str, Metric] = {}

    def add(self, name: str, labels: Sequence[str], value: float | None) -> None:
        """Add one sample; `value=None` means the hardware did not report it (skipped)."""
        if value is None:
            return
        spec = self._specs[name]
        if len(labels) != len(spec.labels):
            raise ValueError(f"{name}: expected labels {spec.labels}, got {tuple(labels)}")
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = spec.new_family()
        family.add_metric(list(labels), float(value))  # type: ignore[attr-defined]

    def families(self) -> list[Metric]:
        """Families with at least one sample, in spec order."""
        return [self._families[name] for name in self._specs if name in self._families]


def specs_by_name(specs: Iterable[MetricSpec]) -> dict[str, MetricSpec]:
    return {spec.name: spec for spec in specs}
