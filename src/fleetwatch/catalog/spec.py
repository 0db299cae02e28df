"""`MetricSpec`: one metric family of the contract, and the checks its name must pass.

A spec carries what a scrape shows (name, type, help, label names), what the catalog
page shows (docs/metrics.md: unit, where the value comes from, the worst-case series
count, what each label holds) and what the exporter needs to fill it: the collectors that
emit it and, for a plain value, where each series is read (`Read`: a field of the source's
reading, the label values it gets, the conversion to base units). An area's specs are
declared once, in order, through its `Families`: the area's family list, each collector's
list (`fleetwatch.catalog.collected_by`), the docs and everything that imports a name derive
from that one declaration. It imports nothing but the standard library: the collectors,
the tainter, the rules and the report all read it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, overload

MetricKind = Literal["gauge", "counter", "histogram"]

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
    if kind not in ("gauge", "counter", "histogram"):
        problems.append(f"has kind {kind!r}, not 'gauge', 'counter' or 'histogram'")
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


Convert = Callable[[float | None], float | None]
"""A conversion from the source's native unit to the contract's base unit (None stays None:
a value the hardware did not report stays absent); `fleetwatch.catalog.units` has them."""


@dataclass(frozen=True)
class Read:
    """One series of a family that a collector fills straight from its source's reading.

    `field` names what the collector's source reports: an attribute of the reading
    (`GpuReading.power_milliwatts` for the `gpu` collector) or a key of the source's table
    (`GPM_METRICS["tensor_any"]` for `gpm` and `mig`); the collector checks at import that
    it exists. `labels` are the values of the family's labels after the device's identity
    labels (`("memory",)` for `sensor="memory"`); `convert` turns the native unit into the
    base unit (None: the value as read).
    """

    field: str
    labels: tuple[str, ...] = ()
    convert: Convert | None = None

    def value(self, raw: float | None) -> float | None:
        """`raw` (the source's value) in the family's unit."""
        return raw if self.convert is None else self.convert(raw)


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
    unit: str = ""
    """The unit as docs/metrics.md shows it (`°C`, `0/1`, `info (1)`, `bytes/s`, ...)."""
    source: str = ""
    """Where the value comes from (markdown): the NVML call, sysfs file, kernel record."""
    series: str = ""
    """The worst-case series count on one node, as text (`G`, `2G`, `G × L`, `1`)."""
    label_values: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    """What a label holds, by label (markdown, e.g. "(`gpu`, `memory`)"), where it says
    more than the label's name and `reads` do not say it already (`described_labels`)."""
    collectors: tuple[str, ...] = ()
    """The collectors that emit the family (none: the exporter's or the tainter's own)."""
    reads: tuple[Read, ...] = ()
    """Where the collector reads each series of a plain value (none: filled by its code)."""

    def __post_init__(self) -> None:
        problems = metric_name_problems(self.name, self.kind, self.labels)
        if not self.help.strip():
            problems.append("has no help text")
        problems.extend(
            f"describes label {label!r}, which it does not have"
            for label in self.label_values
            if label not in self.labels
        )
        if self.reads and not self.collectors:
            problems.append("says where it is read but names no collector")
        problems.extend(
            f"reads {read.field!r} with labels {read.labels}: more than its {self.labels}"
            for read in self.reads
            if len(read.labels) > len(self.labels)
        )
        if problems:
            raise ValueError(f"metric {self.name!r}: " + "; ".join(problems))

    def __str__(self) -> str:
        """The metric name, so a spec reads as its name in PromQL f-strings."""
        return self.name

    @functools.cached_property
    def family_name(self) -> str:
        """The family's name as prometheus_client has it: a counter's without `_total`."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name

    @functools.cached_property
    def described_labels(self) -> dict[str, str]:
        """What each label holds, for the docs: `label_values`, and for the last label the
        values its `reads` give it (`gpu`, `memory` for `sensor`) where those are all it takes."""
        described = dict(self.label_values)
        read = [r.labels[-1] for r in self.reads if r.labels]
        if read and len(read) == len(self.reads) and self.labels[-1] not in described:
            described[self.labels[-1]] = "(" + ", ".join(f"`{value}`" for value in read) + ")"
        return described


class Families(Sequence[MetricSpec]):
    """The families of one catalog area, in the order the area declares them.

    Each area module makes one, `FAMILIES`, and declares every family through it:
    `GPU_POWER_WATTS: Final = FAMILIES.declare("fleetwatch_gpu_power_watts", ...)`. That one
    statement is the family's only declaration: the area's list (this sequence, in
    declaration order: docs/metrics.md's order), each collector's list (`collectors`,
    `collected_by`) and the name everything else imports all come from it. A name declared
    twice is refused when the module loads.
    """

    def __init__(self, *, collectors: tuple[str, ...] = ()) -> None:
        self._collectors = collectors
        self._specs: list[MetricSpec] = []

    def declare(
        self,
        name: str,
        kind: MetricKind,
        help: str,
        labels: tuple[str, ...] = (),
        *,
        collectors: tuple[str, ...] | None = None,
        reads: tuple[Read, ...] = (),
        unit: str = "",
        source: str = "",
        series: str = "",
        label_values: Mapping[str, str] | None = None,
    ) -> MetricSpec:
        """Declare one family (emitted by the area's collectors unless `collectors` says
        otherwise) and return its spec."""
        if any(spec.name == name for spec in self._specs):
            raise ValueError(f"metric {name!r} is declared twice")
        spec = MetricSpec(
            name,
            kind,
            help,
            labels,
            unit=unit,
            source=source,
            series=series,
            label_values=label_values or {},
            collectors=self._collectors if collectors is None else collectors,
            reads=reads,
        )
        self._specs.append(spec)
        return spec

    @overload
    def __getitem__(self, index: int) -> MetricSpec: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[MetricSpec]: ...

    def __getitem__(self, index: int | slice) -> MetricSpec | Sequence[MetricSpec]:
        return self._specs[index]

    def __len__(self) -> int:
        return len(self._specs)

    def __iter__(self) -> Iterator[MetricSpec]:
        return iter(self._specs)
