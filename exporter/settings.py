"""The exporter's settings: one frozen object built from flags and environment."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class ExportSettings:
    """Everything `fleetwatch export` is configured with, validated."""

    listen_host: str
    listen_port: int
    simulate: str | None
    sysfs_root: Path
    enabled: tuple[str, ...]
    interval: float
    intervals: dict[str, float]
    timeouts: dict[str, float]
    max_staleness: float
    hang_timeout: float

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, collector_names: tuple[str, ...]
    ) -> ExportSettings:
        """Build and cross-check settings; raises ValueError naming the offending flag."""
        enabled = tuple(n for n in collector_names if getattr(args, f"collector_{n}"))
        intervals = {
            n: getattr(args, f"collector_{n}_interval") or args.collection_interval for n in enabled
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
            enabled=enabled,
            interval=args.collection_interval,
            intervals=intervals,
            timeouts=timeouts,
            max_staleness=args.collector_max_staleness,
            hang_timeout=args.collector_hang_timeout,
        )
