"""The fast lane: which tests start real servers, marked in one place and held to it.

`.venv/bin/pytest -m "not integration"` runs the unit tests alone, on the code as edited
(the editable install; `pytest_configure` stops a run that would test another copy). A test
is `integration` when it starts a real server or tool (Prometheus, Alertmanager,
node_exporter, promtool, Chromium, Helm against an API server), or a slow `fleetwatch` server
process of its own (the signal-handling tests). Two rules keep the mark right without marking
each test by hand:

- a test that uses a fixture named in `SERVER_FIXTURES` is marked at collection, so every
  test of a shared live stack is marked through the fixture that starts it;
- while a test runs, starting one of `SERVER_PROGRAMS` from a test that is not marked
  fails at once, naming the test and the program: a new test cannot slip a server into
  the fast lane unnoticed. A test that starts one itself, with no fixture, carries
  `@pytest.mark.integration`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import pytest

from tests.install import mismatch

INTEGRATION: Final = "integration"

# Fixtures that start a real server (any module's fixture of that name).
SERVER_FIXTURES: Final = frozenset(
    {
        "live",  # exporter/test_exposition: fleetwatch export + Prometheus
        "exporter",  # exporter/test_faults: fleetwatch export
        "stack",  # rules/test_rules_integration, tainter/test_e2e: fleetwatch.sim.overheat
        "firing",  # rules/test_rules_integration: alerts from that stack
        "job",  # rules/test_training_jobs_integration: Prometheus + kube-state stand-in
        "ha",  # tainter/test_ha: tainter replicas + Alertmanager
        "run",  # report/test_report_prometheus: Prometheus + the report + Chromium
        "node_exporter_server",  # infiniband/test_node_exporter
        "kubeconfig",  # deploy/test_chart: Helm installs against an API server
        "releases",
        "slurm",  # slurm/*: munged, slurmctld and two slurmd (fleetwatch.sim.slurm, sim/slurm.py)
    }
)
# Programs that are real servers or their tools, by executable name.
SERVER_PROGRAMS: Final = frozenset(
    {
        "prometheus",
        "alertmanager",
        "prometheus-alertmanager",
        "node_exporter",
        "prometheus-node-exporter",
        "promtool",
        "chromium",
        "chromium-browser",
        "helm",
        "kube-apiserver",
        "etcd",
        "victoria-metrics",
        "victoria-metrics-prod",
        "vmalert",
        "vmalert-prod",
        "munged",
        "slurmctld",
        "slurmd",
    }
)

_running: list[pytest.Item] = []


def pytest_configure(config: pytest.Config) -> None:
    """Stop at once when the imported fleetwatch is not the one this run tests
    (tests/install.py): the checkout's in the everyday loop, the wheel under ./dev.sh test."""
    why = mismatch()
    if why:
        pytest.exit(why, returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if SERVER_FIXTURES.intersection(fixtures):
            item.add_marker(INTEGRATION)


# The modules that start a real Slurm cluster (munged, slurmctld, two slurmd).
REAL_SLURM: Final = ("tests/slurm/", "tests/faults/test_slurmctld_full_disk.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`./dev.sh test`'s schedule (`--dist loadfile`): each module whole on one pytest-xdist
    worker (its servers start once), and the real Slurm clusters' modules all on one, one
    cluster at a time, so their daemons' second-grained timers run as on a cluster of their
    own. Optional: a run without pytest-xdist (`-p no:xdist`) does not know the hook."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class SlurmTogether(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.partition("::")[0]
            return "real-slurm" if module.startswith(REAL_SLURM) else module

    return SlurmTogether(config, log)


def _server_started(argv: Sequence[Any]) -> str | None:
    """The server or tool `argv` starts, or None when it is none of `SERVER_PROGRAMS`."""
    program = Path(os.fsdecode(argv[0])).name if argv else ""
    return program if program in SERVER_PROGRAMS else None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen" or not _running:
        return
    item = _running[-1]
    argv = args[1]
    server = _server_started([argv] if isinstance(argv, str | bytes | os.PathLike) else argv)
    if server is not None and item.get_closest_marker(INTEGRATION) is None:
        raise RuntimeError(
            f"{item.nodeid} starts {server} (a real server or tool) but is not marked integration: "
            "use a fixture from SERVER_FIXTURES (tests/conftest.py) or mark it "
            "@pytest.mark.integration, so the fast lane stays fast"
        )


sys.addaudithook(_audit)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    _running.append(item)
    try:
        yield
    finally:
        _running.pop()
