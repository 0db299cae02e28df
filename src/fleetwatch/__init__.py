"""fleetwatch: GPU fleet telemetry exporter, alert rules, dashboards and taint controller.

The package root holds what every subcommand shares: the version, the command-line entry
point (`fleetwatch.cli`), flag value types (`fleetwatch.flags`) and logging set-up
(`fleetwatch.logs`). Components are subpackages: `fleetwatch.exporter`,
`fleetwatch.collectors`, `fleetwatch.tainter`, `fleetwatch.report`, `fleetwatch.rules`.

`__version__` is written here by `./dev.sh generate` from the version's one home,
`project.version` in pyproject.toml (a drift test fails when they disagree), rather than
looked up in the installed package's metadata: `importlib.metadata`, with the email,
zipfile and csv modules it loads, is about 2 MiB of every process that reads the version,
the exporter's among them.
"""

__version__ = "0.4.0"
