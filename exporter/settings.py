"""The exporter's settings: its flags as frozen dataclasses, and the one frozen object
`fleetwatch export` runs with, built from them."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fleetwatch.collectors.base import CollectorSpec
from fleetwatch.flags import (
    Flags,
    bounded_duration,
    duration_setting,
    listen_address,
    setting,
    shown_address,
)
from fleetwatch.listener import ListenerSettings

# Bounds of the engine's durations: below them a collector would spin, above them a
# failure would go unseen for longer than anyone would wait.
INTERVAL_BOUNDS: Final = (0.1, 3600.0)

# The lean profile (chart value `exporter.profile: lean`): the flags that drop the detail a
# large fleet may not want to store, while every alert, dashboard and the report still read
# what they need (docs/deploy.md, "Lean profile"; the chart renders the same list).
LEAN_PROFILE_FLAGS: Final = (
    "--no-collector.infiniband.hw-stats",
    "--no-collector.infiniband.saturation-zeros",
    "--no-collector.nvlink.zero-errors",
    "--no-collector.storage.all-operations",
)


@dataclass(frozen=True, kw_only=True)
class ExportFlags:
    """The exporter's own flags (each collector's are its settings and `CollectorSchedule`)."""

    listen_address: tuple[str, int] = setting(
        listen_address(":9842"),
        parse=listen_address,
        shown=shown_address,
        metavar="HOST:PORT",
        flag="web.listen-address",
        help="address to serve /metrics on",
    )
    shutdown_timeout: float = duration_setting(
        10.0,
        minimum=1.0,
        maximum=300.0,
        flag="shutdown.timeout",
        deprecated=("shutdown-timeout",),
        help="on SIGTERM, exit with status 3 if stopping takes longer",
    )
    simulate: str | None = setting(
        None,
        metavar="SCENARIO",
        help="simulate the hardware: a built-in scenario name or a scenario file "
        "('list' prints the built-ins)",
    )
    sysfs: Path = setting(
        Path("/sys"),
        parse=Path,
        metavar="DIR",
        flag="path.sysfs",
        help="sysfs mount point (ignored under --simulate)",
    )
    procfs: Path = setting(
        Path("/proc"),
        parse=Path,
        metavar="DIR",
        flag="path.procfs",
        help="procfs mount point, for the mounts: pid 1's mount table, the host's when this is "
        "the host's /proc (the DaemonSet mounts it; read under --simulate too: mounts are "
        "always the real ones)",
    )
    rootfs: Path = setting(
        Path("/"),
        parse=Path,
        metavar="DIR",
        flag="path.rootfs",
        help="where the host's root is reached: the storage collector's calls on a mount "
        "(statvfs, the probe) go to the host's mount point under it, labels keep the host's "
        "path (the DaemonSet mounts the host's mounts under /host/root)",
    )
    collection_interval: float = duration_setting(
        5.0,
        minimum=INTERVAL_BOUNDS[0],
        maximum=INTERVAL_BOUNDS[1],
        flag="collector.interval",
        deprecated=("collection-interval",),
        help="how often each collector runs",
    )
    collector_timeout: float | None = setting(
        None,
        parse=bounded_duration(0.01, 3600.0),
        metavar="DURATION",
        flag="collector.timeout",
        help="deadline of one collector run (default 80% of its interval)",
    )
    max_staleness: float = duration_setting(
        30.0,
        minimum=1.0,
        maximum=86400.0,
        flag="collector.max-staleness",
        help="drop a failing collector's last good series after this age",
    )
    hang_timeout: float = duration_setting(
        120.0,
        minimum=1.0,
        maximum=86400.0,
        flag="collector.hang-timeout",
        help="/healthz fails when a collector run has been blocked this long",
    )


@dataclass(frozen=True, kw_only=True)
class CollectorSchedule:
    """Whether a collector runs (`--collector.NAME`), and how often (`.interval`)."""

    enabled: bool = setting(True, flag="{prefix}", help="enable this collector")
    interval: float | None = setting(
        None,
        parse=bounded_duration(*INTERVAL_BOUNDS),
        metavar="DURATION",
        help="collection interval of this collector (default --collector.interval)",
    )


EXPORT_FLAGS: Final = Flags(settings=ExportFlags)
LISTENER_FLAGS: Final = Flags(settings=ListenerSettings, prefix="web")


def schedule_flags(spec: CollectorSpec[Any]) -> Flags:
    """A collector's `--collector.NAME` and `--collector.NAME.interval`."""
    return Flags(
        settings=CollectorSchedule,
        prefix=spec.flag_prefix,
        title=spec.flags.title,
        description=spec.flags.description,
        defaults={"enabled": spec.enabled_by_default},
    )


def flags_of(specs: Sequence[CollectorSpec[Any]]) -> tuple[Flags, ...]:
    """Every flag of `fleetwatch export` with these collectors, in `--help` order."""
    return (
        EXPORT_FLAGS,
        LISTENER_FLAGS,
        *(flags for spec in specs for flags in (schedule_flags(spec), spec.flags)),
    )


@dataclass(frozen=True, kw_only=True)
class ExportSettings:
    """Everything `fleetwatch export` is configured with, validated.

    `collectors` holds each enabled collector's own settings object, by name, built once
    from its `--collector.NAME.*` flags (`CollectorSpec.read_settings`).
    """

    listen_host: str
    listen_port: int
    simulate: str | None
    sysfs_root: Path
    procfs_root: Path
    rootfs_root: Path
    enabled: tuple[str, ...]
    intervals: dict[str, float]
    timeouts: dict[str, float]
    max_staleness: float
    hang_timeout: float
    collectors: Mapping[str, Any]
    listener: ListenerSettings
    shutdown_timeout: float

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, specs: Sequence[CollectorSpec[Any]]
    ) -> ExportSettings:
        """Build and cross-check settings; raises ValueError naming the offending flag."""
        flags: ExportFlags = EXPORT_FLAGS.read(args)
        schedules: dict[str, CollectorSchedule] = {
            spec.name: schedule_flags(spec).read(args) for spec in specs
        }
        enabled = tuple(name for name, schedule in schedules.items() if schedule.enabled)
        intervals = {n: schedules[n].interval or flags.collection_interval for n in enabled}
        # Default deadline: most of the interval, so a slow run is reported before the next.
        timeouts = {n: flags.collector_timeout or 0.8 * intervals[n] for n in enabled}
        if any(flags.hang_timeout <= t for t in timeouts.values()):
            raise ValueError(
                f"--collector.hang-timeout={flags.hang_timeout:g}s must be longer "
                f"than every collector deadline (longest {max(timeouts.values()):g}s)"
            )
        host, port = flags.listen_address
        return cls(
            listen_host=host,
            listen_port=port,
            simulate=flags.simulate,
            sysfs_root=flags.sysfs,
            procfs_root=flags.procfs,
            rootfs_root=flags.rootfs,
            enabled=enabled,
            intervals=intervals,
            timeouts=timeouts,
            max_staleness=flags.max_staleness,
            hang_timeout=flags.hang_timeout,
            collectors={
                spec.name: spec.read_settings(args) for spec in specs if spec.name in enabled
            },
            listener=LISTENER_FLAGS.read(args),
            shutdown_timeout=flags.shutdown_timeout,
        )
