"""`FamilyBuilder.extend` (a collector's kept label list and a cycle's values, in one call)
adds exactly what `put` adds value by value."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetwatch.catalog.spec import MetricSpec
from fleetwatch.collectors.families import FamilyBuilder, LabelCache

SPEC = MetricSpec(name="fleetwatch_test_total", kind="counter", help="C.", labels=("link",))
VALUES = st.lists(st.one_of(st.none(), st.integers(0, 2**60), st.floats(allow_nan=False)))


@given(VALUES, VALUES)
def test_extend_adds_what_put_adds(first: list[float | None], second: list[float | None]) -> None:
    cache = LabelCache([SPEC])
    labels = [cache.labels(SPEC.name, (str(i),)) for i in range(max(len(first), len(second)))]
    by_put, by_extend = FamilyBuilder(cache), FamilyBuilder(cache)
    for values in (first, second):
        for label, value in zip(labels, values, strict=False):
            by_put.put(SPEC.name, label, value)
        by_extend.extend(SPEC.name, labels[: len(values)], values)
    expected = [(f.labels, list(f.values)) for f in by_put.families()]
    assert [(f.labels, list(f.values)) for f in by_extend.families()] == expected


def test_extend_refuses_lists_of_different_lengths() -> None:
    cache = LabelCache([SPEC])
    with pytest.raises(ValueError, match="1 label sets for 2 values"):
        FamilyBuilder(cache).extend(SPEC.name, [cache.labels(SPEC.name, ("0",))], [1.0, 2.0])
