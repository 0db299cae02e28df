"""The collector contract: what the exporter's engine runs, and what it gives them.

A collector turns one hardware source into metric families. The engine calls `collect()`
in a worker thread under a deadline (NVML calls can block in the kernel), so a collector
may block, must be safe to abandon while blocked, and raises to report failure: the
engine marks it down with the exception as the reason and keeps every other collector
serving. Missing hardware is not a failure: return no families.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fleetwatch.collectors.metrics import MetricSpec
from fleetwatch.collectors.sim.world import SimulatedNode
from fleetwatch.collectors.sources.nvml import NvmlSource
from prometheus_client.metrics_core import Metric


class Collector(Protocol):
    """One hardware source mapped to metric families."""

    def collect(self) -> Iterable[Metric]:
        """Read the hardware now and return complete families; raise on failure."""
        ...

    def close(self) -> None:
        """Release handles, threads and sockets; called once at shutdown."""
        ...


@dataclass(frozen=True, kw_only=True)
class CollectorContext:
    """What every collector may use, built once by the exporter from its settings.

    `nvml` is the `pynvml` module on real hardware or the fake NVML under simulation: the
    same call surface, so collector code does not know which it runs on. `simulation` is
    set only under `--simulate` (for sources that need simulated inputs beyond NVML and
    sysfs, such as the kernel log); collectors must not branch on it otherwise.
    """

    sysfs_root: Path
    nvml: Any
    simulation: SimulatedNode | None = None
    tool_path: str | None = None

    @functools.cached_property
    def nvml_source(self) -> NvmlSource:
        """The one NVML source of the process, shared by every GPU collector (one nvmlInit)."""
        return NvmlSource(lib=self.nvml)

    def close(self) -> None:
        """Release what the collectors shared (NVML), after every collector closed."""
        source: NvmlSource | None = self.__dict__.get("nvml_source")
        if source is not None:
            source.shutdown()


@dataclass(frozen=True, kw_only=True)
class CollectorSpec:
    """A collector as the CLI and engine see it: listed explicitly, never self-registered.

    `add_flags` adds the collector's own `--collector.NAME.*` flags; `create` builds the
    collector from the shared context and the parsed flags (read them there, once, into
    typed constructor arguments).
    """

    name: str
    help: str
    create: Callable[[CollectorContext, argparse.Namespace], Collector]
    add_flags: Callable[[argparse._ArgumentGroup], None] | None = None
    enabled_by_default: bool = True
    # Every family the collector can emit; the metrics-catalog test checks it against
    # docs/metrics.md in both directions.
    metrics: tuple[MetricSpec, ...] = ()
