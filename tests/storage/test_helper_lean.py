"""The mount helper is a process on every node with network mounts: it loads only what its
calls need, never the exporter-side modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleetwatch.collectors.sources.mount_calls import HelperFailed, MountCalls
from fleetwatch.collectors.sources.probe import PHASES, ProbeResult

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
    assert {"fleetwatch.collectors.sources.probe", "marshal", "threading"} <= modules
    # What the exporter's side of the calls loads (1 to 2 MiB each in the helper), and
    # typing and json (re): 0.5 and 0.7 MiB.
    unwanted = {
        "typing",
        "json",
        "dataclasses",
        "subprocess",
        "pathlib",
        "fleetwatch.collectors.sources.mount_calls",
        "fleetwatch.collectors.sources.mounts",
    }
    assert modules & unwanted == set()


def test_calls_through_the_helper(tmp_path: Path) -> None:
    """A real helper: statvfs and the probe on a directory, the error of a missing path,
    each reply back to its call."""
    calls = MountCalls()
    try:
        found = calls.call(str(tmp_path), (str(tmp_path), 8192))
        missing = calls.call(str(tmp_path / "absent"), None)
    finally:
        calls.close()
    assert found.capacity is not None
    assert found.capacity.size_bytes > 0
    assert found.error is None
    assert isinstance(found.probe, ProbeResult)
    assert (found.probe.size, list(found.probe.seconds)) == (8192, list(PHASES))
    assert (missing.capacity, missing.error, missing.probe) == (None, "ENOENT", None)


def test_a_reply_out_of_step_fails_the_call(tmp_path: Path) -> None:
    """A helper that answers garbage (not a frame) is ended, and the call in flight fails
    with HelperFailed rather than waiting for a reply that cannot come."""
    garbage = tmp_path / "garbage.py"
    garbage.write_text(
        "import sys\nsys.stdin.buffer.read(1)\nsys.stdout.buffer.write(b'\\xff' * 9)\n"
    )
    calls = MountCalls(argv=[sys.executable, str(garbage)])
    try:
        with pytest.raises(HelperFailed):
            calls.call(str(tmp_path), None)
    finally:
        calls.close()
