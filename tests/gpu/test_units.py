"""Unit conversions NVML units → base units, property-based."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from fleetwatch.catalog.units import (
    MIB,
    mebibytes_to_bytes,
    megahertz_to_hertz,
    millijoules_to_joules,
    milliwatts_to_watts,
    nanoseconds_to_seconds,
    percent_to_ratio,
)

counts = st.integers(min_value=0, max_value=2**64 - 1)


@given(counts)
def test_milli_to_base(value: int) -> None:
    for convert in (milliwatts_to_watts, millijoules_to_joules):
        result = convert(value)
        assert result is not None
        assert math.isclose(result * 1000, value, rel_tol=1e-12)


@given(st.integers(min_value=0, max_value=10**6))
def test_megahertz(value: int) -> None:
    assert megahertz_to_hertz(value) == value * 1_000_000


@given(counts)
def test_nanoseconds(value: int) -> None:
    result = nanoseconds_to_seconds(value)
    assert result is not None
    assert math.isclose(result * 1e9, value, rel_tol=1e-12)


@given(st.floats(min_value=-50, max_value=200, allow_nan=False))
def test_percent_to_ratio_is_clamped_and_monotonic(value: float) -> None:
    ratio = percent_to_ratio(value)
    assert ratio is not None
    assert 0.0 <= ratio <= 1.0
    if 0 <= value <= 100:
        assert abs(ratio - value / 100) <= 1e-6
    higher = percent_to_ratio(value + 1)
    assert higher is not None
    assert higher >= ratio


@given(st.floats(min_value=0, max_value=1e9, allow_nan=False))
def test_mebibytes(value: float) -> None:
    assert mebibytes_to_bytes(value) == value * MIB


def test_absent_stays_absent() -> None:
    for convert in (
        milliwatts_to_watts,
        millijoules_to_joules,
        megahertz_to_hertz,
        nanoseconds_to_seconds,
        percent_to_ratio,
        mebibytes_to_bytes,
    ):
        assert convert(None) is None
