"""What the GPU collectors share: GPU identity labels, NVML failure counts, lost GPUs.

The conversions from NVML's units to base units are the catalog's (`fleetwatch.catalog.units`):
each declaration names the one its value needs.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import Final

from fleetwatch.catalog.spec import MetricSpec
from fleetwatch.collectors.families import FamilyBuilder
from fleetwatch.collectors.sources.nvml import GpuIdentity
from fleetwatch.collectors.sources.nvml_calls import CallFailure, NvmlError
from fleetwatch.logs import LogOnce

log = logging.getLogger(__name__)

GPU_ID: Final = ("gpu", "uuid")
"""The identity label names every per-GPU series starts with (values: `gpu_labels`)."""


def gpu_labels(identity: GpuIdentity) -> tuple[str, str]:
    """The identity labels every per-GPU series starts with: `gpu` (NVML index), `uuid`."""
    return (str(identity.index), identity.uuid)


class NvmlFailures:
    """Counts NVML call failures per GPU/call/error across cycles, logging each new kind.

    A call on no GPU (the Xid collector's event set) counts with `gpu` and `uuid` empty."""

    def __init__(
        self,
        *,
        collector: str,
        spec: MetricSpec,
        message: str = "NVML call failed; its values are absent",
    ) -> None:
        self._collector = collector
        self.spec = spec
        self._message = message
        self._counts: Counter[tuple[str, str, str, str]] = Counter()
        self._once = LogOnce(log)

    def record(
        self, identity: GpuIdentity | None, failures: Iterable[CallFailure], **where: int
    ) -> None:
        """Count each failure; log each new kind once, with `where` (a MIG slot) named."""
        labels = ("", "") if identity is None else gpu_labels(identity)
        for failure in failures:
            key = (*labels, failure.call, failure.error)
            self._once.warning(
                (*key, *where.items()),
                self._message,
                collector=self._collector,
                gpu=None if identity is None else identity.index,
                call=failure.call,
                error=failure.error,
                **where,
            )
            self._counts[key] += 1

    def record_error(self, identity: GpuIdentity | None, exc: NvmlError) -> None:
        """Count the one call `exc` says failed (as `record`)."""
        self.record(identity, (CallFailure(call=exc.call, error=exc.error),))

    def counts(self) -> tuple[tuple[tuple[str, str, str, str], int], ...]:
        """A copy of the counts: (gpu, uuid, call, error) and how many."""
        return tuple(self._counts.items())

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
