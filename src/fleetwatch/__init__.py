"""fleetwatch: GPU fleet telemetry exporter, alert rules, dashboards and taint controller.

The package root holds what every subcommand shares: the version, the command-line entry
point (`fleetwatch.cli`), flag value types (`fleetwatch.flags`) and logging set-up
(`fleetwatch.logs`). Components are subpackages: `fleetwatch.exporter`,
`fleetwatch.collectors`, `fleetwatch.tainter`, `fleetwatch.report`, `fleetwatch.rules`.

`__version__` is looked up in the installed package's metadata on first use, not when the
package is imported: `importlib.metadata` (with the email, zipfile and csv modules it loads)
is about 2 MiB of a process, and the exporter's mount helper imports this package without
ever needing the version.
"""

from __future__ import annotations

import functools


@functools.cache
def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fleetwatch")
    except PackageNotFoundError:  # imported from a tree that was never installed
        return "0.0.0+unknown"


def __getattr__(name: str) -> str:
    if name == "__version__":
        return _installed_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
