"""Validation of scenario values: each failure names the file, the key path and the reason.

Both the scenario loader and the fault kinds' keys (fault_params.py) validate with one
`Checker`, so a bad value reads the same wherever in a scenario it is.
"""

from __future__ import annotations

import math
from typing import Any

from fleetwatch.shown import shown


class ScenarioError(ValueError):
    """A scenario file is malformed; the message names the file, key and reason."""


class Checker:
    """Carries the file name so every error names file, key path and reason."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, reason: str) -> ScenarioError:
        """The error for `key`; a key or reason quoting a huge value is cut short, so the
        message stays one readable line."""
        return ScenarioError(f"{self.source}: {key[:200]}: {reason[:400]}")

    def mapping(self, value: Any, key: str) -> dict[str, Any]:
        """`value` as a mapping of string keys (YAML reads `4:` or `~:` as an int or null
        key, which no scenario key is: found by the fuzzer, they made sorting keys raise)."""
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {type(value).__name__}")
        for name in value:
            if not isinstance(name, str):
                raise self.fail(key, f"key {shown(name)} is not a string")
        return value

    def keys(
        self, data: dict[str, Any], key: str, required: frozenset[str], allowed: frozenset[str]
    ) -> None:
        for name in sorted(required - data.keys()):
            raise self.fail(f"{key}.{name}" if key else name, "required key is missing")
        for name in sorted(data.keys() - allowed):
            raise self.fail(f"{key}.{name}" if key else str(name), "unknown key")

    def integer(self, value: Any, key: str, *, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {shown(value)}")
        if not low <= value <= high:
            raise self.fail(key, f"{shown(value)} is out of range {low}..{high}")
        return value

    def number(self, value: Any, key: str, *, low: float, high: float) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            # an int is finite, and one of hundreds of digits no float holds is out of range
            or not (isinstance(value, int) or math.isfinite(value))
        ):
            raise self.fail(key, f"expected a number, got {shown(value)}")
        if not low <= value <= high:
            raise self.fail(key, f"{shown(value)} is out of range {low}..{high}")
        return float(value)

    def string(self, value: Any, key: str, *, choices: tuple[str, ...] | None = None) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"expected a non-empty string, got {shown(value)}")
        if choices is not None and value not in choices:
            raise self.fail(key, f"{shown(value)} is not one of {', '.join(choices)}")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {shown(value)}")
        return value
