"""`MetricSpec`: one metric family of the contract, and the checks its name must pass.

A spec carries what a scrape shows (name, type, help, label names) and what the catalog
page shows (docs/metrics.md: unit, where the value comes from, the worst-case series
count, what each label holds). It imports nothing but the standard library: the
collectors, the tainter, the rules and the report all read it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

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
    more than the label's name."""

    def __post_init__(self) -> None:
        problems = metric_name_problems(self.name, self.kind, self.labels)
        if not self.help.strip():
            problems.append("has no help text")
        problems.extend(
            f"describes label {label!r}, which it does not have"
            for label in self.label_values
            if label not in self.labels
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
