"""The collector contract: what the exporter's engine runs, and what it gives them.

A collector turns one hardware source into metric families. The engine calls `collect()`
in a worker thread under a deadline (NVML calls can block in the kernel), so a collector
may block, must be safe to abandon while blocked, and raises to report failure: the
engine marks it down with the exception as the reason and keeps every other collector
serving. Missing hardware is not a failure: return no families.

Collectors never know whether the hardware is real: the exporter's hardware set-up builds
the `CollectorContext` (real `pynvml`, `/sys` and `/dev/kmsg`, or their simulated
stand-ins) and each collector reads only what the context and its own settings give it.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from fleetwatch.catalog.spec import MetricSpec
from fleetwatch.collectors.families import SeriesFamily
from fleetwatch.collectors.sources.kmsg import KernelLog, KmsgReader
from fleetwatch.collectors.sources.mount_calls import MountCaller, MountCalls
from fleetwatch.collectors.sources.nvml import NvmlSource
from fleetwatch.flags import Flags


class Collector(Protocol):
    """One hardware source mapped to metric families."""

    def collect(self) -> Iterable[SeriesFamily]:
        """Read the hardware now and return complete families; raise on failure."""
        ...

    def close(self) -> None:
        """Release handles, threads and sockets; called once at shutdown."""
        ...


def open_kmsg(path: Path) -> KernelLog:
    """The kernel log device (or a text file of log lines) at `path`."""
    return KmsgReader(path=path)


@dataclass(frozen=True, kw_only=True)
class CollectorContext:
    """What every collector may use, built once by the exporter's hardware set-up.

    `nvml` is the `pynvml` module on real hardware or a stand-in with the same call
    surface; `sysfs_root` is `/sys` or a tree shaped like it; `tool_path` is searched
    before `PATH` for infiniband-diags; `open_kernel_log` opens the kernel log a flag
    names; `procfs_root` is `/proc` or a tree shaped like it (the host's, in a DaemonSet);
    `rootfs_root` is where the host's root is reached (`/`, or the host's `/` mounted in a
    DaemonSet): the storage collector's calls on a mount go there.
    `discover_mounts` is False under simulation: the storage collector then watches only
    the mounts and probe directories the command line names (real ones), never the host's
    own network mounts, which a simulated node does not have (only its simulated ones, which
    the set-up names). `mount_calls(rootfs_root)` makes the storage collector's calls on
    mounts (statvfs, the probe): the helper process on a real node, the simulated mounts'
    stand-in under simulation. Collector code does not know which hardware it runs on.
    """

    sysfs_root: Path
    procfs_root: Path = Path("/proc")
    rootfs_root: Path = Path("/")
    discover_mounts: bool = True
    nvml: Any
    tool_path: str | None = None
    open_kernel_log: Callable[[Path], KernelLog] = open_kmsg
    mount_calls: Callable[[Path], MountCaller] = MountCalls

    @functools.cached_property
    def nvml_source(self) -> NvmlSource:
        """The one NVML source of the process, shared by every GPU collector (one nvmlInit)."""
        return NvmlSource(lib=self.nvml)

    def close(self) -> None:
        """Release what the collectors shared (NVML), after every collector closed."""
        source: NvmlSource | None = self.__dict__.get("nvml_source")
        if source is not None:
            source.shutdown()


@dataclass(frozen=True)
class NoSettings:
    """Settings of a collector that has no flags of its own."""


SettingsT = TypeVar("SettingsT")


@dataclass(frozen=True, kw_only=True)
class CollectorSpec(Generic[SettingsT]):
    """A collector as the CLI and engine see it: listed explicitly, never self-registered.

    `settings` is a frozen dataclass whose fields are `fleetwatch.flags.setting()`s: each
    becomes a `--collector.NAME.FIELD-NAME` flag, and the dataclass is built once from the
    parsed flags (`read_settings`) and handed to `create` with the shared context.
    """

    name: str
    help: str
    settings: type[SettingsT]
    create: Callable[[CollectorContext, SettingsT], Collector]
    enabled_by_default: bool = True
    # Every family the collector can emit; the metrics-catalog test checks it against
    # docs/metrics.md in both directions.
    metrics: tuple[MetricSpec, ...] = ()

    @property
    def flag_prefix(self) -> str:
        """`collector.NAME`: every flag of this collector starts with it."""
        return f"collector.{self.name}"

    @property
    def flags(self) -> Flags:
        """This collector's `--collector.NAME.*` settings flags, grouped under its name."""
        return Flags(
            settings=self.settings,
            prefix=self.flag_prefix,
            title=f"collector {self.name}",
            description=self.help,
        )

    def read_settings(self, args: argparse.Namespace) -> SettingsT:
        """This collector's settings, from the flags `flags` declares."""
        settings: SettingsT = self.flags.read(args)
        return settings
