"""Metric specs as a table, and a builder that fills families from readings.

Collectors take the families they emit from the metric catalog
(`fleetwatch.catalog.collected_by`) and add samples by label values; the builder checks
the label count, skips absent values (a value the hardware does not report is absent,
never a fake 0) and returns only families that have samples. A family whose series are
plain values of the source's reading declares where each is read (`Read`); `reads_of` turns
those declarations into the collector's value table, checked against the source when the
collector's module loads.

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

from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, cast

from fleetwatch.catalog.spec import MetricSpec, Read

if TYPE_CHECKING:
    from prometheus_client.core import Metric


def reads_of(
    specs: Iterable[MetricSpec], *, available: Collection[str], identity: int
) -> tuple[tuple[str, Read], ...]:
    """(family, read) for every `Read` the specs declare, in declaration order.

    `available` is what the collector's source offers (its reading's field names, or its
    table's keys) and `identity` how many identity labels the collector puts before a
    read's own label values. A read of something the source lacks, or with the wrong
    number of label values, raises naming the family: a typo fails when the collector's
    module loads, not at the first scrape.
    """
    rows = []
    for spec in specs:
        for read in spec.reads:
            if read.field not in available:
                raise LookupError(f"{spec.name} reads {read.field!r}, which its source lacks")
            if identity + len(read.labels) != len(spec.labels):
                raise ValueError(
                    f"{spec.name}: {read.field!r} gives label values {read.labels} after "
                    f"{identity} identity labels; the family has labels {spec.labels}"
                )
            rows.append((spec.name, read))
    return tuple(rows)


class LabelCache:
    """Label dicts by label names and values, checked against the spec table once.

    Families with the same label names share one dict per label set (a mount's eight
    per-operation families hold one dict per (mount, operation), not eight: with 50 NFS
    mounts 1,400 dicts instead of 9,350, about 1.6 MB). Keep one per collector and
    `clear()` it when devices are re-discovered, so label sets of vanished devices do not
    accumulate.
    """

    def __init__(self, specs: Iterable[MetricSpec]) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self._cache: dict[tuple[str, ...], dict[tuple[str, ...], dict[str, str]]] = {}

    def labels(self, family: str, values: tuple[str, ...]) -> dict[str, str]:
        """The (shared, not to be mutated) label dict of one sample."""
        names = self.specs[family].labels
        by_values = self._cache.get(names)
        if by_values is None:
            by_values = self._cache[names] = {}
        found = by_values.get(values)
        if found is None:
            if len(values) != len(names):
                raise ValueError(f"{family}: expected labels {names}, got {values}")
            found = by_values[values] = dict(zip(names, values, strict=True))
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
        column = self._column(name)
        column[0].append(labels)
        column[1].append(float(value))

    def extend(
        self, name: str, labels: Sequence[dict[str, str]], values: Sequence[float | None]
    ) -> None:
        """Add samples whose label dicts (from the same `LabelCache`) a collector keeps in a
        list, one per value, in one call: `put` for each, without a call per value."""
        if len(labels) != len(values):
            raise ValueError(f"{name}: {len(labels)} label sets for {len(values)} values")
        if None in values:  # the absent ones are left out, as `put` leaves them
            present = [i for i, value in enumerate(values) if value is not None]
            labels = [labels[i] for i in present]
            values = [values[i] for i in present]
        if not values:
            return
        column = self._column(name)
        column[0].extend(labels)
        column[1].extend(map(float, cast("Sequence[float]", values)))

    def _column(self, name: str) -> tuple[list[dict[str, str]], list[float | None]]:
        column = self._columns.get(name)
        if column is None:
            if name not in self._specs:
                raise KeyError(f"{name} is not in this builder's specs")
            column = self._columns[name] = ([], [])
        return column

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
        """The same samples as a prometheus_client `Metric`, for generic consumers (the
        exporter itself never calls it, so it does not load prometheus_client)."""
        from prometheus_client.core import Metric

        metric = Metric(self.name, self.documentation, self.type)
        for labels, value in zip(self.labels, self.values, strict=True):
            if value is not None:
                metric.add_sample(self.sample_name, labels, float(value))
        return metric


def series_count(families: Iterable[SeriesFamily]) -> int:
    """Samples in `families` (absent values not counted)."""
    return sum(family.count() for family in families)
