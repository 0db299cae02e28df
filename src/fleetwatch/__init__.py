"""fleetwatch: GPU fleet telemetry exporter, alert rules, dashboards and taint controller.

The package root holds what every subcommand shares: the version, the command-line entry
point (`fleetwatch.cli`), flag value types (`fleetwatch.flags`) and logging set-up
(`fleetwatch.logs`). Components are subpackages: `fleetwatch.exporter`,
`fleetwatch.collectors`, `fleetwatch.tainter`, `fleetwatch.report`, `fleetwatch.rules`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fleetwatch")
except PackageNotFoundError:  # imported from a tree that was never installed
    __version__ = "0.0.0+unknown"
