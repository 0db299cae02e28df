"""The exporter's settings: one frozen object built from flags and environment."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fleetwatch.collectors.base import CollectorSpec

from fleetwatch.flags import read_settings
from fleetwatch.listener import ListenerSettings

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
        given = vars(args)
        enabled = tuple(spec.name for spec in specs if given[f"collector_{spec.name}"])
        intervals = {
            n: given[f"collector_{n}_interval"] or args.collection_interval for n in enabled
        }
        # Default deadline: most of the interval, so a slow run is reported before the next.
        timeouts = {n: args.collector_timeout or 0.8 * intervals[n] for n in enabled}
        if any(args.collector_hang_timeout <= t for t in timeouts.values()):
            raise ValueError(
                f"--collector.hang-timeout={args.collector_hang_timeout:g}s must be longer "
                f"than every collector deadline (longest {max(timeouts.values()):g}s)"
            )
        host, port = args.web_listen_address
        return cls(
            listen_host=host,
            listen_port=port,
            simulate=args.simulate,
            sysfs_root=args.path_sysfs,
            procfs_root=args.path_procfs,
            enabled=enabled,
            intervals=intervals,
            timeouts=timeouts,
            max_staleness=args.collector_max_staleness,
            hang_timeout=args.collector_hang_timeout,
            collectors={
                spec.name: spec.read_settings(args) for spec in specs if spec.name in enabled
            },
            listener=read_settings(args, "web", ListenerSettings),
            shutdown_timeout=args.shutdown_timeout,
        )
