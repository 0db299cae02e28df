"""What `pip install` puts on a machine: one import name, every module importable on its
own (not only from a checkout), runtime data inside the package."""

from __future__ import annotations

import importlib.metadata
import pkgutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

import fleetwatch
from fleetwatch.sim.loopback_servers import free_port, http_get, running
from tests.install import WHEEL_RUN, imported_source, mismatch, wheel_run

# Modules that need an extra's dependencies; the rest must import with the base install.
# The simulated fleet history is numpy arrays (the report's extra brings numpy); the rest of
# fleetwatch.sim is the base install's, so `export --simulate` and the demo run from it.
EXTRAS_ONLY = ("fleetwatch.tainter", "fleetwatch.report", "fleetwatch.sim.fleet")
# Top-level import names of the extras' libraries: what a base install lacks.
EXTRA_LIBRARIES = (
    "kubernetes_asyncio",
    "pandas",
    "numpy",
    "pyarrow",
    "matplotlib",
    "tqdm",
    "grafanalib",
)
# Runs the fleetwatch command as a base install would: every import of an extra's library
# fails as it would there, and is logged so that one caught and worked around shows too.
BASE_INSTALL_PROGRAM = f"""
import sys
from importlib.abc import MetaPathFinder

class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {EXTRA_LIBRARIES!r}:
            print(f"base install lacks {{name}}", file=sys.stderr, flush=True)
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from fleetwatch.cli import main
sys.exit(main(sys.argv[1:]))
"""


def installed_top_levels() -> set[str]:
    """Top-level names the distribution installs (from its RECORD)."""
    files = importlib.metadata.files("fleetwatch") or []
    tops = set()
    for file in files:
        first = file.parts[0]
        if first.endswith((".dist-info", ".data")) or first in {"..", "bin"}:
            continue
        tops.add(first.removesuffix(".py"))
    return tops


def all_modules() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.walk_packages(fleetwatch.__path__, prefix="fleetwatch.")
        if not info.name.endswith("__main__")
    )


@pytest.mark.skipif(not wheel_run(), reason="the wheel's RECORD: ./dev.sh test installs it")
def test_one_top_level_import_name() -> None:
    assert installed_top_levels() == {"fleetwatch"}


def test_the_tests_run_the_fleetwatch_their_mode_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wheel under ./dev.sh test, the checkout (editable install) otherwise; the other
    mode's check (tests/conftest.py) would stop this run."""
    assert mismatch() is None
    assert ("site-packages" in imported_source().parts) == wheel_run()
    monkeypatch.setenv(WHEEL_RUN, "0" if wheel_run() else "1")
    assert mismatch() is not None


def test_every_module_imports_outside_a_checkout(tmp_path: Path) -> None:
    """Isolated mode (-I): no checkout on sys.path, so a bare `import collectors` fails."""
    program = (
        "import importlib, sys\n"
        "failed = []\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {exc!r}')\n"
        "print('\\n'.join(failed))\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", program, *all_modules()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout.strip() == ""


def test_base_modules_do_not_need_an_extra() -> None:
    base = [m for m in all_modules() if not m.startswith(EXTRAS_ONLY)]
    assert "fleetwatch.exporter.export" in base
    requires = importlib.metadata.requires("fleetwatch") or []
    base_requirements = {
        r.split(";")[0].split(">")[0].split("<")[0].strip() for r in requires if "extra ==" not in r
    }
    for heavy in ("pandas", "pyarrow", "matplotlib", "kubernetes-asyncio", "grafanalib"):
        assert heavy not in base_requirements


def test_simulated_exporter_runs_from_the_base_install(tmp_path: Path) -> None:
    """`fleetwatch export --simulate dgx-h100`, the process the exporter image runs on a
    laptop, serves GPU and InfiniBand series without importing any extra's library."""
    port = free_port()
    argv = [
        sys.executable,
        "-I",
        "-c",
        BASE_INSTALL_PROGRAM,
        "export",
        "--simulate=dgx-h100",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    url = f"http://127.0.0.1:{port}"
    with running(argv, url=url, ready_path="/readyz", workdir=tmp_path, name="export") as server:
        metrics = http_get(f"{url}/metrics").decode()
        log = server.log()
    assert 'fleetwatch_gpu_temperature_celsius{gpu="0"' in metrics
    assert 'fleetwatch_infiniband_port_up{device="mlx5_0",port="1"} 1' in metrics
    assert "base install lacks" not in log
    assert 'fleetwatch_collector_up{collector="infiniband"} 1' in metrics


@pytest.mark.parametrize(
    ("package", "name"),
    [
        ("fleetwatch.rules", "config.yaml"),
        ("fleetwatch.rules", "fleetwatch.rules.yaml"),
        ("fleetwatch.rules", "fleetwatch.recording.yaml"),
        ("fleetwatch.rules", "fleetwatch.global.yaml"),
        ("fleetwatch.rules", "alertmanager.yml"),
        ("fleetwatch.catalog", "nvidia_xids.yaml"),
        ("fleetwatch.sim.scenarios", "dgx-h100.yaml"),
        ("fleetwatch.sim.scenarios", "demo.yaml"),
        ("fleetwatch.sim", "bin/perfquery"),
        ("fleetwatch.sim", "bin/ibstat"),
    ],
)
def test_runtime_data_ships_in_the_package(package: str, name: str) -> None:
    assert resources.files(package).joinpath(name).is_file()
