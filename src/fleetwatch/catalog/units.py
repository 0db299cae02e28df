"""Conversions from a source's native units to the metric contract's base units.

NVML reports milliwatts, millijoules, MHz, percentages, nanoseconds and MiB/s; the contract
wants watts, joules, hertz, ratios 0..1, seconds and bytes/s. A catalog declaration names
the conversion its value needs (`Read(..., convert=milliwatts_to_watts)`), so the collector
that fills it converts without a table of its own. Each passes `None` through: a value the
hardware did not report stays absent.
"""

from __future__ import annotations

from typing import Final

MIB: Final = 1024 * 1024


def scaled(value: float | None, factor: float) -> float | None:
    """`value * factor`, or None when the value is absent."""
    return None if value is None else value * factor


def milliwatts_to_watts(value: float | None) -> float | None:
    return scaled(value, 1e-3)


def millijoules_to_joules(value: float | None) -> float | None:
    return scaled(value, 1e-3)


def megahertz_to_hertz(value: float | None) -> float | None:
    return scaled(value, 1e6)


def percent_to_ratio(value: float | None) -> float | None:
    """NVML percentages (0..100) as ratios clamped to 0..1 (GPM can overshoot by rounding)."""
    if value is None:
        return None
    # Rounded to what NVML's percentages resolve, so 53.27 % is 0.5327, not 0.5327000000000001.
    return min(1.0, max(0.0, round(value / 100.0, 6)))


def nanoseconds_to_seconds(value: float | None) -> float | None:
    return scaled(value, 1e-9)


def mebibytes_to_bytes(value: float | None) -> float | None:
    return scaled(value, MIB)
