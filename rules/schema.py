"""The one schema of the rules config's thresholds: what each key holds, and its range.

The keys and their kinds are those of the config the schema is taken from (`derive`: the
shipped rules/config.yaml, or the file a checkout edits): a number, a duration, a list of
codes or of words, or a table of them. A number's range follows its unit, as its name
says: `_ratio` and `_fraction` 0..1, `_celsius` 0..150, any other number 0 or more. The
same schema judges the config it was taken from, an override file merged over it
(`fleetwatch.rules.config.load_config`) and, as JSON Schema, the chart's `thresholds`
values (helm/generate.py), so a threshold is refused for the same reason wherever it is
set. `overheat_policy` is a list of per-model entries, not a threshold: `POLICY_ENTRY`
holds its schema.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from fleetwatch.durations import DurationError, parse_duration
from fleetwatch.shown import shown

WORD: Final = re.compile(r"[A-Za-z0-9_]+")
"""A word of a word list (counter names, clock-event reasons): it goes into a PromQL regex."""
MODEL_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]*")
"""A GPU model name as NVML gives it; it goes into a PromQL regex unescaped."""
_UNIT_RANGES: Final = (("_ratio", 1.0), ("_fraction", 1.0), ("_celsius", 150.0))
"""The largest value of a number whose name ends so, or is the unit (every number is 0 or
more)."""


class SchemaError(ValueError):
    """A value the schema refuses: `key` is its dotted path, `reason` says why."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class Number:
    """A finite number from `minimum` to `maximum` (no upper bound when None)."""

    minimum: float = 0.0
    maximum: float | None = None

    def check(self, value: Any, key: str) -> None:
        """SchemaError unless `value` is a number in range."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SchemaError(key, f"expected a number, got {shown(value)}")
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an integer of hundreds of digits: no float holds it
            finite = False
        if not finite:
            raise SchemaError(key, f"{shown(value)} is not a finite number")
        if value < self.minimum or (self.maximum is not None and value > self.maximum):
            bounds = (
                f"{self.minimum:g} or more"
                if self.maximum is None
                else f"{self.minimum:g}..{self.maximum:g}"
            )
            raise SchemaError(key, f"{shown(value)} is out of range ({bounds})")

    def json(self) -> dict[str, Any]:
        """As JSON Schema."""
        schema: dict[str, Any] = {"type": "number", "minimum": self.minimum}
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        return schema


@dataclass(frozen=True)
class Duration:
    """A Prometheus duration (`5m`, `1h30m`)."""

    def check(self, value: Any, key: str) -> None:
        """SchemaError unless `value` is a duration."""
        if not isinstance(value, str) or not value:
            raise SchemaError(key, f"expected a duration, got {shown(value)}")
        try:
            parse_duration(value)
        except DurationError as exc:
            raise SchemaError(key, str(exc)) from exc

    def json(self) -> dict[str, Any]:
        """As JSON Schema: the chart's `duration` definition."""
        return {"$ref": "#/definitions/duration"}


@dataclass(frozen=True)
class Codes:
    """A non-empty list of whole numbers 0 or more (Xid codes)."""

    def check(self, value: Any, key: str) -> None:
        """SchemaError unless `value` is such a list."""
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        ):
            raise SchemaError(
                key, f"expected a non-empty list of whole numbers, got {shown(value)}"
            )

    def json(self) -> dict[str, Any]:
        """As JSON Schema."""
        return {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}


@dataclass(frozen=True)
class Words:
    """A non-empty list of words (letters, digits and `_`)."""

    def check(self, value: Any, key: str) -> None:
        """SchemaError unless `value` is such a list."""
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, str) and WORD.fullmatch(v) for v in value)
        ):
            raise SchemaError(
                key, f"expected a non-empty list of words (letters, digits, _), got {shown(value)}"
            )

    def json(self) -> dict[str, Any]:
        """As JSON Schema."""
        word = {"type": "string", "pattern": f"^{WORD.pattern}$"}
        return {"type": "array", "items": word, "minItems": 1}


@dataclass(frozen=True)
class Table:
    """A mapping with exactly these keys, each of its own kind."""

    fields: Mapping[str, Node]

    def check(self, value: Any, key: str) -> None:
        """SchemaError naming the first unknown, missing or refused key."""
        if not isinstance(value, dict):
            raise SchemaError(key, f"expected a mapping, got {type(value).__name__}")
        for unknown in sorted(set(value) - set(self.fields), key=str):
            raise SchemaError(f"{key}.{unknown}", "unknown key")
        for name, node in self.fields.items():
            if name not in value:
                raise SchemaError(f"{key}.{name}", "required key is missing")
            node.check(value[name], f"{key}.{name}")

    def json(self) -> dict[str, Any]:
        """As JSON Schema."""
        return {
            "type": "object",
            "properties": {name: node.json() for name, node in self.fields.items()},
            "required": list(self.fields),
            "additionalProperties": False,
        }


Node = Number | Duration | Codes | Words | Table
"""What one key of the thresholds holds."""


def number_of(key: str) -> Number:
    """The range of the number at dotted `key`, from its unit suffix."""
    name = key.rsplit(".", 1)[-1]
    for suffix, maximum in _UNIT_RANGES:
        if name.endswith(suffix) or name == suffix.removeprefix("_"):
            return Number(maximum=maximum)
    return Number()


def derive(value: Any, key: str) -> Node:
    """The schema of `value` at dotted `key`, from its kind: the config it comes from defines
    which keys exist and what each holds. SchemaError for a value of no kind, or one out of
    its own range."""
    node: Node
    if isinstance(value, dict):
        node = table_of(value, key)
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        node = Words()
    elif isinstance(value, list):
        node = Codes()
    elif isinstance(value, str):
        node = Duration()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        node = number_of(key)
    else:
        raise SchemaError(key, f"expected a number, a duration or a list, got {shown(value)}")
    node.check(value, key)
    return node


def table_of(value: Mapping[str, Any], key: str) -> Table:
    """The schema of the mapping `value` at dotted `key`: each of its keys by `derive`."""
    return Table({str(name): derive(item, f"{key}.{name}") for name, item in value.items()})


CELSIUS: Final = number_of("celsius")
"""An overheat policy's temperature or margin."""
POLICY_KINDS: Final = ("celsius", "margin_celsius")
"""An overheat policy entry holds exactly one of these."""


def policy_entry_json() -> dict[str, Any]:
    """JSON Schema of one `overheat_policy` entry: a model and one of its limits."""
    return {
        "type": "object",
        "properties": {
            "model": {"type": "string", "pattern": f"^{MODEL_NAME.pattern}$"},
            **{kind: CELSIUS.json() for kind in POLICY_KINDS},
        },
        "oneOf": [{"required": ["model", kind]} for kind in POLICY_KINDS],
        "additionalProperties": False,
    }
