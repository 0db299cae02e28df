"""The exposition renderer writes exactly what prometheus_client's `generate_latest` writes.

Random families (label values with characters that need escaping, values from -0.0 and
NaN to 1e300, ints and bools as collectors hand them over) are rendered by both;
`SeriesFamily` (labels fixed, values as a list) must render as the same samples built
the ordinary way, skipping absent values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from fleetwatch.catalog.spec import MetricSpec, metric_name_problems
from fleetwatch.collectors.families import FamilyBuilder, SeriesFamily, series_count
from fleetwatch.exporter.render import Renderer, format_value

LABEL_VALUES = st.text(alphabet=st.sampled_from('ab_ 0\\"\n.é'), max_size=6)
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=0, max_value=2**64 - 1).map(float),
    st.booleans(),
    st.sampled_from([0.0, -0.0, 1.0, 999_999.0, 1_000_000.0, 1e21]),
    st.sampled_from([999_999, 1_000_000, -999_999, -1_000_000, 10**15, 2**53 - 1, 2**53]),
)
SPECS = (
    MetricSpec(
        name="fleetwatch_test_gauge",
        kind="gauge",
        help="A gauge with \\ and \n in its help.",
        labels=("device", "port"),
    ),
    MetricSpec(
        name="fleetwatch_test_things_total", kind="counter", help="A counter.", labels=("device",)
    ),
)


Rows = list[tuple[tuple[str, ...], float | None]]
Table = list[Rows]


class _Fixed:
    def __init__(self, families: Sequence[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def _reference(families: Sequence[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families))
    return generate_latest(registry)


def _rows(draw: st.DrawFn, spec: MetricSpec) -> Rows:
    count = draw(st.integers(min_value=0, max_value=5))
    rows = {}
    for _ in range(count):
        labels = tuple(draw(LABEL_VALUES) for _ in spec.labels)
        rows[labels] = draw(st.one_of(st.none(), VALUES))
    return list(rows.items())


@st.composite
def _tables(draw: st.DrawFn) -> Table:
    return [_rows(draw, spec) for spec in SPECS]


def _ordinary(table: Table) -> list[Metric]:
    """prometheus_client's own families, filled with `add_metric`."""
    families: list[Metric] = []
    for spec, rows in zip(SPECS, table, strict=True):
        kind = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
        family = kind(spec.name, spec.help, labels=spec.labels)
        for labels, value in rows:
            if value is not None:
                family.add_metric(list(labels), float(value))
        if family.samples:
            families.append(family)
    return families


def _built(table: Table) -> list[SeriesFamily]:
    """What collectors hand over through `FamilyBuilder` (label lists new each cycle)."""
    builder = FamilyBuilder(SPECS)
    for spec, rows in zip(SPECS, table, strict=True):
        for labels, value in rows:
            builder.add(spec.name, labels, value)
    return builder.families()


def _series(table: Table) -> list[SeriesFamily]:
    return [
        SeriesFamily(
            spec,
            [dict(zip(spec.labels, labels, strict=True)) for labels, _ in rows],
            [value for _, value in rows],
        )
        for spec, rows in zip(SPECS, table, strict=True)
    ]


@given(_tables())
def test_renderer_matches_generate_latest(table: Table) -> None:
    """Series families render as generate_latest writes the same samples built the
    ordinary way (`add_metric`), directly and through `FamilyBuilder`."""
    ordinary = _ordinary(table)
    for families in (_series(table), _built(table)):
        renderer = Renderer()
        assert renderer.render(families) == _reference(ordinary)
        assert renderer.render(families) == _reference(ordinary)  # through the caches
        assert series_count(families) == sum(len(family.samples) for family in ordinary)
        present = [family.to_metric() for family in families if family.count()]
        assert present == ordinary  # what generic consumers get is the ordinary family


@given(
    st.one_of(
        st.integers(min_value=-(2**64), max_value=2**64),
        st.integers(min_value=0, max_value=2**53).map(lambda n: n * 10**6),
        st.booleans(),
    )
)
def test_integers_are_written_as_their_double_is(number: int) -> None:
    """Counters arrive as Python ints (the kernel's and NVML's): every one written as
    prometheus_client writes the double it converts to, trailing zeros and all."""
    assert format_value(number) == floatToGoString(float(number))  # type: ignore[no-untyped-call]


def test_cached_prefixes_follow_the_label_list() -> None:
    spec = SPECS[0]
    renderer = Renderer()
    first = [{"device": "mlx5_0", "port": "1"}]
    assert renderer.render([SeriesFamily(spec, first, [1])]).endswith(
        b'fleetwatch_test_gauge{device="mlx5_0",port="1"} 1.0\n'
    )
    # Another list for the same family (re-discovery) must not reuse the old prefixes.
    second = [{"device": "mlx5_1", "port": "2"}, {"device": "mlx5_2", "port": "1"}]
    text = renderer.render([SeriesFamily(spec, second, [None, 2])]).decode()
    assert 'device="mlx5_2"' in text
    assert "mlx5_0" not in text
    assert "mlx5_1" not in text
    # Same length, another dict in place; and a list changed in place after rendering.
    third = [{"device": "mlx5_3", "port": "1"}]
    assert b'device="mlx5_3"' in renderer.render([SeriesFamily(spec, third, [3])])
    third[0] = {"device": "mlx5_4", "port": "1"}
    assert b'device="mlx5_4"' in renderer.render([SeriesFamily(spec, third, [3])])


def test_series_family_without_values_is_left_out() -> None:
    family = SeriesFamily(SPECS[1], [{"device": "a"}, {"device": "b"}], [None, None])
    assert Renderer().render([family]) == b""
    assert family.count() == 0


def test_series_family_rejects_mismatched_lists() -> None:
    with pytest.raises(ValueError, match="fleetwatch_test_gauge"):
        SeriesFamily(SPECS[0], [{"device": "a", "port": "1"}], [1, 2])


@pytest.mark.parametrize(
    ("name", "kind", "labels", "reason"),
    [
        ("gpu_power_watts", "gauge", (), "does not start with 'fleetwatch_'"),
        ("fleetwatch_gpu-power", "gauge", (), "is not a Prometheus metric name"),
        ("fleetwatch_xid_errors", "counter", (), "does not end in '_total'"),
        ("fleetwatch_gpu_up_total", "gauge", (), "ends in '_total' but is a gauge"),
        ("fleetwatch_gpu_power_milliwatts", "gauge", (), "non-base unit (milliwatts)"),
        ("fleetwatch_gpu_utilization_percent", "gauge", (), "non-base unit (percent)"),
        ("fleetwatch_gpus_count", "gauge", (), "suffix promtool reserves"),
        ("fleetwatch_nvlink_counter_total", "counter", (), "contains 'counter'"),
        ("fleetwatch_gpu_up", "gauge", ("gpu", "gpu"), "repeats a label"),
        ("fleetwatch_gpu_up", "gauge", ("pci-bus",), "'pci-bus' is not a valid label name"),
        ("fleetwatch_gpu_up", "gauge", ("__name__",), "is not a valid label name"),
        ("fleetwatch_gpu_up", "gauge", ("le",), "reserved for histograms"),
    ],
)
def test_metric_spec_refuses_names_outside_the_contract(
    name: str, kind: str, labels: tuple[str, ...], reason: str
) -> None:
    assert any(reason in problem for problem in metric_name_problems(name, kind, labels))
    with pytest.raises(ValueError, match=f"metric '{name}': .*{re.escape(reason)}"):
        MetricSpec(name, kind, "Help.", labels)  # type: ignore[arg-type]


def test_every_shipped_metric_name_passes_the_contract() -> None:
    """The check accepts every family fleetwatch defines (they are built at import)."""
    from fleetwatch.collectors import COLLECTORS
    from fleetwatch.exporter.engine import SELF_METRICS

    specs = [*SELF_METRICS, *(m for spec in COLLECTORS for m in spec.metrics)]
    assert specs
    assert [s.name for s in specs if metric_name_problems(s.name, s.kind, s.labels)] == []
