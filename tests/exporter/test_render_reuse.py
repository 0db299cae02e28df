"""A renderer that reuses a family's bytes while its readings stand still never serves a
stale reading: every render of a run of cycles is what a fresh render writes.

Cycles keep their label sets (one `LabelCache`, as collectors do) and draw values that
often repeat, flip between 0.0 and -0.0 (equal, rendered differently), are NaN (unequal to
itself, rendered the same), go absent and come back; label sets appear and vanish between
cycles.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fleetwatch.catalog.spec import MetricSpec
from fleetwatch.collectors.families import FamilyBuilder, LabelCache, SeriesFamily
from fleetwatch.exporter import render
from fleetwatch.exporter.render import Renderer, format_value

SPECS = (
    MetricSpec(name="fleetwatch_test_state", kind="gauge", help="A gauge.", labels=("gpu",)),
    MetricSpec(
        name="fleetwatch_test_errors_total", kind="counter", help="A counter.", labels=("gpu",)
    ),
)
VALUES = st.one_of(
    st.none(), st.sampled_from([0.0, -0.0, 1.0, 2, True, 1e6, -0.5, float("inf"), float("nan")])
)
# A cycle: for each family, a value (or None) for each of up to 4 GPUs that exist then.
CYCLE = st.lists(st.dictionaries(st.sampled_from("0123"), VALUES), min_size=2, max_size=2)


def _families(cache: LabelCache, cycle: list[dict[str, float | None]]) -> list[SeriesFamily]:
    builder = FamilyBuilder(cache)
    for spec, values in zip(SPECS, cycle, strict=True):
        for gpu, value in sorted(values.items()):
            builder.add(spec.name, (gpu,), value)
    return builder.families()


# No deadline: what is asserted is the bytes, not how fast a loaded machine renders them.
@settings(deadline=None)
@given(st.lists(CYCLE, min_size=2, max_size=8))
# Found by Hypothesis: 0.0 after -0.0 compares equal as a float, so a cache keyed on float
# equality kept writing "-0" (values are compared bit for bit now).
@example([[{}, {"0": -0.0}], [{}, {"0": 0.0}]])
# Two families of the same label sets share their prefixes; then one gains a GPU.
@example([[{"0": 1.0}, {"0": 2.0}], [{"0": 1.0, "1": 1.0}, {"0": 2.0}], [{"0": 1.0}, {"0": 3.0}]])
def test_every_render_is_what_a_fresh_render_writes(
    cycles: list[list[dict[str, float | None]]],
) -> None:
    cache = LabelCache(SPECS)
    kept = Renderer()
    for cycle in cycles:
        families = _families(cache, cycle)
        assert kept.render(families) == Renderer().render(families)


@settings(deadline=None)
@given(st.lists(st.lists(VALUES, min_size=3, max_size=3), min_size=2, max_size=8))
def test_a_family_with_absent_values_renders_fresh_too(cycles: list[list[float | None]]) -> None:
    """A family handed over with absent values in its list (as the InfiniBand collector's
    pick makes them), on the same label dicts every cycle."""
    labels = [{"gpu": gpu} for gpu in "012"]
    kept = Renderer()
    for values in cycles:
        family = [SeriesFamily(SPECS[1], labels, values)]
        assert kept.render(family) == Renderer().render(family)


def test_an_unchanged_family_reuses_its_bytes_and_a_changed_one_does_not() -> None:
    cache = LabelCache(SPECS)
    renderer = Renderer()
    first = renderer.render(_families(cache, [{"0": 1.0}, {"0": 0.0}]))
    again = renderer.render(_families(cache, [{"0": 1.0}, {"0": 0.0}]))
    changed = renderer.render(_families(cache, [{"0": 1.0}, {"0": 3.0}]))
    assert again == first
    assert b'fleetwatch_test_errors_total{gpu="0"} 3.0\n' in changed
    assert b'fleetwatch_test_errors_total{gpu="0"} 0.0\n' not in changed


# A large family (40 series on the same label dicts every cycle) of which a few values
# change a cycle: only their lines are formatted again, the rest taken from the last render.
WIDE = [{"gpu": str(n)} for n in range(40)]
PRESENT = st.sampled_from(
    [0.0, -0.0, 1.0, 7, True, 999_999.0, 1_000_000, 2**53 + 1, 1e300, -0.5, float("nan"),
     float("inf")]
)  # fmt: skip


@settings(deadline=None)
@given(
    st.lists(PRESENT, min_size=40, max_size=40),
    st.lists(st.dictionaries(st.integers(0, 39), PRESENT, max_size=12), min_size=1, max_size=8),
)
def test_a_wide_family_with_a_few_changes_renders_fresh(
    first: list[float], changes: list[dict[int, float]]
) -> None:
    kept = Renderer()
    values = list(first)
    kept.render([SeriesFamily(SPECS[1], WIDE, tuple(values))])
    for change in changes:
        for index, value in change.items():
            values[index] = value
        family = [SeriesFamily(SPECS[1], WIDE, tuple(values))]
        assert kept.render(family) == Renderer().render(family)


def test_only_the_lines_of_changed_values_are_formatted(monkeypatch: pytest.MonkeyPatch) -> None:
    renderer = Renderer()
    values = [float(n) for n in range(40)]
    renderer.render([SeriesFamily(SPECS[1], WIDE, tuple(values))])
    formatted: list[float] = []

    def counting(value: float) -> str:
        formatted.append(value)
        return format_value(value)

    monkeypatch.setattr(render, "format_value", counting)
    values[3], values[30] = 999_999.0, 1_000_000.0  # a longer line, then a shorter one
    changed = renderer.render([SeriesFamily(SPECS[1], WIDE, tuple(values))])
    assert formatted == [999_999.0, 1_000_000.0]
    assert b'fleetwatch_test_errors_total{gpu="3"} 999999.0\n' in changed
    assert b'fleetwatch_test_errors_total{gpu="30"} 1e+06\n' in changed
    values[0] = -0.0  # equal to the 0.0 before it, written differently
    values[31] = -0.0
    again = renderer.render([SeriesFamily(SPECS[1], WIDE, tuple(values))])
    assert formatted[2:] == [-0.0, -0.0]
    assert again == Renderer().render([SeriesFamily(SPECS[1], WIDE, tuple(values))])
    formatted.clear()
    everything = [value + 1 for value in values]  # most changed: one whole render
    renderer.render([SeriesFamily(SPECS[1], WIDE, tuple(everything))])
    assert len(formatted) == 40


def test_the_same_tuple_again_is_reused_without_a_look_and_a_list_is_always_compared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A collector that hands over the same values tuple again (the InfiniBand collector's
    memoised families) gets the last bytes without its values being keyed; a list, which
    its owner may have changed in place since, is keyed and compared every time."""
    renderer = Renderer()
    values = tuple(float(n) for n in range(40))
    first = renderer.render([SeriesFamily(SPECS[1], WIDE, values)])
    keyed: list[object] = []
    real_key = render._values_key

    def counting(found: object) -> object:
        keyed.append(found)
        return real_key(found)  # type: ignore[arg-type]

    monkeypatch.setattr(render, "_values_key", counting)
    assert renderer.render([SeriesFamily(SPECS[1], WIDE, values)]) == first
    assert keyed == []
    # An equal tuple that is another object is compared (and reused, being equal).
    equal = tuple(float(n) for n in range(40))
    assert equal is not values
    assert renderer.render([SeriesFamily(SPECS[1], WIDE, equal)]) == first
    assert len(keyed) == 1
    moving = list(values)
    renderer.render([SeriesFamily(SPECS[1], WIDE, moving)])
    moving[5] = 55.0  # changed in place, handed over again as the same list
    changed = renderer.render([SeriesFamily(SPECS[1], WIDE, moving)])
    assert b'fleetwatch_test_errors_total{gpu="5"} 55.0\n' in changed
    assert changed == Renderer().render([SeriesFamily(SPECS[1], WIDE, moving)])
