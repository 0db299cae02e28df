"""The one duration syntax of fleetwatch: Prometheus's (`500ms`, `5s`, `1h30m`, `2w`, `1y`).

Flags, the rules config, the report and the chart's values schema all read durations
here, so a value one of them accepts is never refused by another (and never by
Prometheus, which receives the rules config's durations unchanged). The grammar is
Prometheus's `model.ParseDuration`: whole numbers, units `y w d h m s ms` from the largest
down, each at most once, or a bare `0`.
"""

from __future__ import annotations

import re
from typing import Final

# A year is 365 days and a week 7, as Prometheus counts them.
UNIT_SECONDS: Final = {
    "y": 365 * 86400.0,
    "w": 7 * 86400.0,
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}
DURATION_PATTERN: Final = "^" + "".join(f"([0-9]+{unit})?" for unit in UNIT_SECONDS) + "$"
"""The grammar as a regular expression (RE2 and ECMA compatible, for JSON schemas). It also
matches the empty string: a schema pairs it with `minLength: 1`."""

_DURATION: Final = re.compile("".join(rf"(?:(?P<{u}>[0-9]+){u})?" for u in UNIT_SECONDS))
_SHOWN_UNITS: Final = ("d", "h", "m", "s", "ms")
EXAMPLES: Final = "e.g. 500ms, 5s, 1h30m, 2w"


class DurationError(ValueError):
    """Text that is not a Prometheus duration; the message quotes it and shows the syntax."""


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration (`1h30m` → 5400.0); `DurationError` when not one."""
    stripped = text.strip()
    if stripped == "0":
        return 0.0
    match = _DURATION.fullmatch(stripped)
    if not stripped or match is None:
        raise DurationError(
            f"invalid duration {text!r}: use whole numbers with units y, w, d, h, m, s, ms "
            f"from the largest down ({EXAMPLES})"
        )
    try:
        return sum(
            UNIT_SECONDS[unit] * int(count) for unit, count in match.groupdict().items() if count
        )
    except (ValueError, OverflowError) as exc:  # thousands of digits: int() or float() refuses
        raise DurationError(f"invalid duration {text[:40]!r}...: a number too large") from exc


def format_duration(seconds: float) -> str:
    """Seconds as the shortest duration text `parse_duration` reads back: 90 → `1m30s`.

    Days are the largest unit shown (a week reads `7d`); below a millisecond rounds."""
    parts: list[str] = []
    rest = max(0, round(seconds * 1000))
    for unit in _SHOWN_UNITS:
        step = round(UNIT_SECONDS[unit] * 1000)
        count, rest = divmod(rest, step)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
