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

# Modules that need an extra's dependencies; the rest must import with the base install.
EXTRAS_ONLY = ("fleetwatch.tainter", "fleetwatch.report")


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


def test_one_top_level_import_name() -> None:
    assert installed_top_levels() == {"fleetwatch"}


def test_the_tests_use_the_installed_package_not_the_tree() -> None:
    assert "site-packages" in Path(fleetwatch.__file__).resolve().parts


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


@pytest.mark.parametrize(
    ("package", "name"),
    [
        ("fleetwatch.rules", "config.yaml"),
        ("fleetwatch.rules", "fleetwatch.rules.yaml"),
        ("fleetwatch.rules", "fleetwatch.recording.yaml"),
        ("fleetwatch.rules", "alertmanager.yml"),
        ("fleetwatch.rules", "xid_catalog.yaml"),
        ("fleetwatch.collectors.sim.scenarios", "dgx-h100.yaml"),
        ("fleetwatch.collectors.sim.scenarios", "demo.yaml"),
        ("fleetwatch.collectors.sim", "bin/perfquery"),
        ("fleetwatch.collectors.sim", "bin/ibstat"),
    ],
)
def test_runtime_data_ships_in_the_package(package: str, name: str) -> None:
    assert resources.files(package).joinpath(name).is_file()
