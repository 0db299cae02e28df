"""The storage collector's exposition as samples by name and labels, for the storage tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.collectors.storage import StorageCollector
from fleetwatch.exporter.render import Renderer

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def collect_samples(collector: StorageCollector) -> Samples:
    """One collection of `collector`, rendered and parsed back as a client would read it."""
    text = Renderer().render(collector.collect()).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of series `name{labels}` (exactly those labels), None when absent."""
    return samples.get((name, tuple(sorted(labels.items()))))


def label_values(samples: Samples, name: str, label: str) -> set[str]:
    """Every value of `label` on the series of `name`."""
    return {dict(key[1])[label] for key in samples if key[0] == name}


def collect_and_close(collector: StorageCollector, cycles: int = 1) -> list[Samples]:
    """`cycles` collections of `collector`, which is closed after them whatever happens."""
    try:
        return [collect_samples(collector) for _ in range(cycles)]
    finally:
        collector.close()
