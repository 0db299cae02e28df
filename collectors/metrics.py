"""Metric specs as a table, and a builder that fills families from readings.

Collectors declare each family once (`MetricSpec`: name, type, help, label names) and add
samples by label values; the builder checks the label count, skips absent values (a value
the hardware does not report is absent, never a fake 0) and returns only families that
have samples.

A device's label sets are the same every cycle, so a collector keeps one `LabelCache`
across collections: each label set is checked against its spec and turned into a dict
once, then reused (prometheus_client's `add_metric` rebuilds the dict every call). The
builder's families are `SeriesFamily`s, a list of label dicts and a list of values, so
no `Sample` is made per value; the exposition renderer reads the two lists directly
(`exporter.render`).

A collector whose series are all known at discovery (InfiniBand: every port's counter
files) goes one step further: it builds its label lists once and gathers each cycle's
values with one C-level pick, so not even a `put` runs per value.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from prometheus_client.core import Metric

MetricKind = Literal["gauge", "counter"]

PREFIX: Final = "fleetwatch_"
_METRIC_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Units a name must not be in: the contract wants base units (seconds, bytes, watts, ...).
_NOT_BASE_UNITS: Final = (
    "milliseconds", "microseconds", "nanoseconds", "minutes", "hours", "days",
    "kilobytes", "megabytes", "gigabytes", "kibibytes", "mebibytes", "gibibytes", "bits",
    "milliwatts", "kilowatts", "millijoules", "kilojoules", "megahertz", "gigahertz",
    "kilohertz", "percent", "fahrenheit", "kelvin",
)  # fmt: skip
# Suffixes promtool's lint reserves for histograms and summaries.
_RESERVED_SUFFIXES: Final = ("_count", "_sum", "_bucket", "_created")


def metric_name_problems(name: str, kind: str, labels: Sequence[str]) -> list[str]:
    """What is wrong with a family's name and labels under the metric contract.

    Prometheus name and label syntax; the `fleetwatch_` prefix; base units only (no
    `_milliseconds`, `_percent`, ...); a counter ends in `_total` and nothing else does;
    no suffix promtool reserves (`_count`, `_sum`, ...) and no `counter` in a name; no
    label named `__*`, `le` or `quantile`, and none twice.
    """
    problems: list[str] = []
    if not _METRIC_NAME.fullmatch(name):
        problems.append("is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)")
    if not name.startswith(PREFIX):
        problems.append(f"does not start with {PREFIX!r}")
    if kind not in ("gauge", "counter"):
        problems.append(f"has kind {kind!r}, not 'gauge' or 'counter'")
    stem = name.removesuffix("_total")
    if kind == "counter" and stem == name:
        problems.append("is a counter but does not end in '_total'")
    if kind != "counter" and stem != name:
        problems.append(f"ends in '_total' but is a {kind}, not a counter")
    if "counter" in name.removeprefix(PREFIX) or stem.endswith(_RESERVED_SUFFIXES):
        problems.append("contains 'counter' or ends in a suffix promtool reserves")
    units = [unit for unit in _NOT_BASE_UNITS if f"_{unit}_" in f"{stem}_"]
    if units:
        problems.append(f"uses a non-base unit ({units[0]}): use seconds, bytes, watts, ...")
    for label in labels:
        if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
            problems.append(f"label {label!r} is not a valid label name")
        elif label in ("le", "quantile"):
            problems.append(f"label {label!r} is reserved for histograms and summaries")
    if len(set(labels)) != len(labels):
        problems.append(f"repeats a label in {tuple(labels)}")
    return problems


@dataclass(frozen=True)
class MetricSpec:
    """One metric family of the contract. Counters are named with their `_total` suffix.

    Checked where it is defined (`metric_name_problems`): a bad name fails at import with
    every reason, not later in promtool or at a scrape.
    """

    name: str
    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problems = metric_name_problems(self.name, self.kind, self.labels)
        if not self.help.strip():
            problems.append("has no help text")
        if problems:
            raise ValueError(f"metric {self.name!r}: " + "; ".join(problems))

    @functools.cached_property
    def family_name(self) -> str:
        """The family's name as prometheus_client has it: a counter's without `_total`."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


class LabelCache:
    """Label dicts by (family, label values), checked against the spec table once.

    Keep one per collector and `clear()` it when devices are re-discovered, so label
    sets of vanished devices do not accumulate.
    """

    def __init__(self, specs: Iterable[MetricSpec]) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self._cache: dict[tuple[str, tuple[str, ...]], dict[str, str]] = {}

    def labels(self, family: str, values: tuple[str, ...]) -> dict[str, str]:
        """The (shared, not to be mutated) label dict of one sample."""
        key = (family, values)
        found = self._cache.get(key)
        if found is None:
            names = self.specs[family].labels
            if len(values) != len(names):
                raise ValueError(f"{family}: expected labels {names}, got {values}")
            found = self._cache[key] = dict(zip(names, values, strict=True))
        return found

    def clear(self) -> None:
        self._cache.clear()


class FamilyBuilder:
    """Accumulates samples for a fixed table of specs during one collection.

    Samples go into two lists per family (label dicts and values) and come out as
    `SeriesFamily`s: no prometheus_client sample is made per value.
    """

    def __init__(self, specs: Iterable[MetricSpec] | LabelCache) -> None:
        self._cache = specs if isinstance(specs, LabelCache) else LabelCache(specs)
        self._specs = self._cache.specs
        self._columns: dict[str, tuple[list[dict[str, str]], list[float | None]]] = {}

    def add(self, name: str, labels: Sequence[str], value: float | None) -> None:
        """Add one sample; `value=None` means the hardware did not report it (skipped)."""
        if value is None:
            return
        self.put(name, self._cache.labels(name, tuple(labels)), value)

    def put(self, name: str, labels: dict[str, str], value: float | None) -> None:
        """Add one sample whose label dict came from the same `LabelCache`."""
        if value is None:
            return
        column = self._columns.get(name)
        if column is None:
            if name not in self._specs:
                raise KeyError(f"{name} is not in this builder's specs")
            column = self._columns[name] = ([], [])
        column[0].append(labels)
        column[1].append(float(value))

    def families(self) -> list[SeriesFamily]:
        """Families with at least one sample, in spec order."""
        return [
            SeriesFamily(self._specs[name], *self._columns[name])
            for name in self._specs
            if name in self._columns
        ]


class SeriesFamily:
    """A family as two lists, label dicts and values: what collectors hand the renderer.

    `labels[i]` and `values[i]` make one sample; a None value is absent and left out.
    The renderer keeps each family's formatted prefixes and reuses them while the label
    list holds the same dicts (those of a `LabelCache` are the same objects every cycle,
    so the check is by identity, element by element). It is the one family type
    collectors return and the renderer reads. It is not a prometheus_client family:
    `to_metric()` builds one through client_python's public API for generic consumers
    (`generate_latest` in the renderer's tests and benchmark).
    """

    __slots__ = ("labels", "spec", "values")

    def __init__(
        self,
        spec: MetricSpec,
        labels: list[dict[str, str]],
        values: Sequence[float | None],
    ) -> None:
        if len(labels) != len(values):
            raise ValueError(f"{spec.name}: {len(labels)} label sets for {len(values)} values")
        self.spec = spec
        self.labels = labels
        self.values = values

    @property
    def name(self) -> str:
        """The family's name as prometheus_client has it: a counter's without `_total`."""
        return self.spec.family_name

    @property
    def sample_name(self) -> str:
        """The name every sample carries (a counter's with `_total`)."""
        return self.spec.name

    @property
    def type(self) -> str:
        return self.spec.kind

    @property
    def documentation(self) -> str:
        return self.spec.help

    def count(self) -> int:
        """How many samples the family has (values that are not None)."""
        return len(self.values) - self.values.count(None)

    def to_metric(self) -> Metric:
        """The same samples as a prometheus_client `Metric`, for generic consumers."""
        metric = Metric(self.name, self.documentation, self.type)
        for labels, value in zip(self.labels, self.values, strict=True):
            if value is not None:
                metric.add_sample(self.sample_name, labels, float(value))
        return metric


def series_count(families: Iterable[SeriesFamily]) -> int:
    """Samples in `families` (absent values not counted)."""
    return sum(family.count() for family in families)
