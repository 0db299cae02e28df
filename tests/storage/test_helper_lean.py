"""The mount helper is a process on every node with network mounts: it loads only what its
calls need, never the exporter-side modules."""

from __future__ import annotations

import subprocess
import sys

LOADED_BY_THE_HELPER = """
import runpy, sys
runpy.run_module("fleetwatch.collectors.sources.mount_helper", run_name="imported")
print("\\n".join(sorted(sys.modules)))
"""


def test_the_helper_loads_only_what_its_calls_need() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOADED_BY_THE_HELPER],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    modules = set(done.stdout.split())
    assert {"fleetwatch.collectors.sources.probe", "json", "threading"} <= modules
    # What the exporter's side of the calls loads (1 to 2 MiB each in the helper).
    unwanted = {
        "dataclasses",
        "subprocess",
        "pathlib",
        "fleetwatch.collectors.sources.mount_calls",
        "fleetwatch.collectors.sources.mounts",
    }
    assert modules & unwanted == set()
