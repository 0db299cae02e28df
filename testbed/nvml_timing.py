"""Per-call NVML timing for benchmarks and hardware checks (never in the exporter).

`timed(lib, record)` wraps `pynvml` or the fake NVML so that every `nvml*` call reports
its wall time, which lets a benchmark subtract the time spent inside NVML from a
collector's cost, and a hardware check print per-call latencies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def timed(lib: Any, record: Callable[[str, float], None]) -> Any:
    """`lib` with every `nvml*` call timed into `record(call, seconds)`."""

    class _Timed:
        def __getattr__(self, name: str) -> Any:
            target = getattr(lib, name)
            if not (name.startswith("nvml") and callable(target)):
                return target

            def call(*args: Any) -> Any:
                start = time.perf_counter()
                try:
                    return target(*args)
                finally:
                    record(name, time.perf_counter() - start)

            # Kept: later lookups find it without __getattr__, so the wrapper's own
            # cost (which benches count as ours) stays two clock reads a call.
            setattr(self, name, call)
            return call

    return _Timed()
