"""What the GPU collectors share: unit conversions, GPU identity labels, NVML failure counts.

NVML reports milliwatts, millijoules, MHz, percentages, nanoseconds and MiB/s; the metric
contract wants base units (watts, joules, hertz, ratios 0..1, seconds, bytes/s). Each
conversion passes `None` through, because a value the hardware did not report stays absent.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import Final

from fleetwatch.catalog.spec import MetricSpec
from fleetwatch.collectors.families import FamilyBuilder
from fleetwatch.collectors.sources.nvml import GpuIdentity
from fleetwatch.collectors.sources.nvml_calls import CallFailure
from fleetwatch.logs import LogOnce

log = logging.getLogger(__name__)

MIB = 1024 * 1024
GPU_ID: Final = ("gpu", "uuid")
"""The identity label names every per-GPU series starts with (values: `gpu_labels`)."""


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


def gpu_labels(identity: GpuIdentity) -> tuple[str, str]:
    """The identity labels every per-GPU series starts with: `gpu` (NVML index), `uuid`."""
    return (str(identity.index), identity.uuid)


class NvmlFailures:
    """Counts NVML call failures per GPU/call/error across cycles, logging each new kind."""

    def __init__(self, *, collector: str, spec: MetricSpec) -> None:
        self._collector = collector
        self.spec = spec
        self._counts: Counter[tuple[str, str, str, str]] = Counter()
        self._once = LogOnce(log)

    def record(self, identity: GpuIdentity, failures: Iterable[CallFailure], **where: int) -> None:
        """Count each failure; log each new kind once, with `where` (a MIG slot) named."""
        for failure in failures:
            key = (*gpu_labels(identity), failure.call, failure.error)
            self._once.warning(
                (*key, *where.items()),
                "NVML call failed; its values are absent",
                collector=self._collector,
                gpu=identity.index,
                call=failure.call,
                error=failure.error,
                **where,
            )
            self._counts[key] += 1

    def add_to(self, builder: FamilyBuilder) -> None:
        for labels, count in self._counts.items():
            builder.add(self.spec.name, labels, count)


class LostGpus:
    """Logs a GPU falling off the bus once, and again only if it comes back and goes."""

    def __init__(self, *, collector: str) -> None:
        self._collector = collector
        self._once = LogOnce(log)

    def lost(self, identity: GpuIdentity) -> None:
        self._once.log(
            logging.ERROR,
            identity.index,
            "GPU is lost (fallen off the bus, Xid 79): its series are dropped",
            collector=self._collector,
            gpu=identity.index,
            uuid=identity.uuid,
        )

    def seen(self, identity: GpuIdentity) -> None:
        self._once.forget(identity.index)
