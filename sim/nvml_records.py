"""What the fake NVML (fake_nvml.py) hands out and takes back, shaped like pynvml's.

Opaque device and MIG handles, field-value results with `.nvmlReturn` and `.value.*`, GPM
samples and a `c_nvmlGpmMetricsGet_t`-like request, event sets and event data, and the small
read-only records (`.gpu`, `.used`, `.busId`, ...) other calls return: the fields and
spellings the collectors read on the real structures, so the same code reads either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml


@dataclass(frozen=True)
class FakeHandle:
    """An opaque device handle, as `nvmlDeviceGetHandleByIndex` returns."""

    index: int


@dataclass(frozen=True)
class FakeMigHandle:
    """A MIG device handle, as `nvmlDeviceGetMigDeviceHandleByIndex` returns."""

    gpu: int
    slot: int


@dataclass
class FakeValue:
    """The `c_nvmlValue_t` union: every member holds the value."""

    dVal: float = 0.0
    uiVal: int = 0
    ulVal: int = 0
    ullVal: int = 0
    sllVal: int = 0
    siVal: int = 0
    usVal: int = 0


@dataclass
class FakeFieldValue:
    """A `c_nvmlFieldValue_t`: one field's result with its own `nvmlReturn`."""

    fieldId: int
    scopeId: int
    nvmlReturn: int
    valueType: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    value: FakeValue = field(default_factory=FakeValue)


@dataclass
class FakeGpmSample:
    """An allocated GPM sample; filled by `nvmlGpmSampleGet` with the GPU and the time."""

    gpu: int | None = None
    at: float | None = None
    gpu_instance: int | None = None
    freed: bool = False


@dataclass
class FakeGpmMetric:
    """One `c_nvmlGpmMetric_t` entry."""

    metricId: int = 0
    nvmlReturn: int = pynvml.NVML_SUCCESS
    value: float = 0.0


class FakeGpmMetricsGet:
    """Shaped like `c_nvmlGpmMetricsGet_t`: version, numMetrics, sample1/2, metrics[]."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: FakeGpmSample | None = None
        self.sample2: FakeGpmSample | None = None
        self.metrics = [FakeGpmMetric() for _ in range(pynvml.NVML_GPM_METRIC_MAX)]


@dataclass
class FakeEventData:
    """A `c_nvmlEventData_t`."""

    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class FakeEventSet:
    """An event set: which GPUs are registered, and which scenario Xids it delivered."""

    created_at: float
    gpus: set[int] = field(default_factory=set)
    delivered: int = 0
    freed: bool = False


@dataclass(frozen=True)
class FakeStruct:
    """Small result records (`.gpu`, `.used`, `.busId`, ...), read-only like the real ones."""

    values: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None
