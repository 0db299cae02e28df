"""A module's file name says its one job: no two modules share a name while doing different jobs.

Looked at: every module of the package (the folders `pyproject.toml` maps to `fleetwatch.*`)
and of `testbed/`, `dashboards/` and `helm/`. A file name may repeat only when it is
- the same job in each package: `__init__.py`, `__main__.py`, a subcommand's `cli.py`, a
  role's `settings.py` (its flags as settings dataclasses), or a package's `render.py` (its
  output written in its format: the exposition, the report's pages); or
- an area, the same one in each layer: a metric area of the catalog (`catalog/gpu.py`), a
  hardware source (`collectors/sources/pci.py`) or an alert area (`rules/alerts/fabric.py`),
  so `collectors/gpu.py` collects what `catalog/gpu.py` declares and `rules/alerts/gpu.py`
  alerts on. The areas are read from those three folders, not listed here.
"""

from __future__ import annotations

import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
SAME_JOB: Final = frozenset({"__init__", "__main__", "cli", "settings", "render"})
AREA_FOLDERS: Final = ("src/fleetwatch/catalog", "collectors/sources", "rules/alerts")
NOT_AREAS: Final = frozenset({"__init__", "spec", "doc", "nvidia_xids"})
"""Modules of the area folders that are not an area: the catalog's spec type, its docs page
writer and NVIDIA's Xid catalog."""


def module_folders() -> list[Path]:
    """The folders of the package (as pyproject maps them) and testbed, dashboards, helm."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mapped = pyproject["tool"]["setuptools"]["package-dir"].values()
    return [ROOT / folder for folder in (*mapped, "testbed", "dashboards", "helm")]


def modules_by_name() -> dict[str, list[Path]]:
    """Every module of those folders by its file name's stem (each file once)."""
    files = {path for folder in module_folders() for path in folder.rglob("*.py")}
    found: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(files):
        if "__pycache__" not in path.parts:
            found[path.stem].append(path.relative_to(ROOT))
    return found


def areas() -> frozenset[str]:
    """The areas: the modules of the catalog, the hardware sources and the alert areas."""
    stems = {path.stem for folder in AREA_FOLDERS for path in (ROOT / folder).glob("*.py")}
    return frozenset(stems - NOT_AREAS)


def test_the_names_looked_at_and_the_areas_are_found() -> None:
    names = modules_by_name()
    assert Path("src/fleetwatch/cli.py") in names["cli"]
    assert Path("testbed/tool_servers.py") in names["tool_servers"]
    assert {"gpu", "infiniband", "pci", "fabric", "stack", "mounts"} <= areas()


def test_no_two_modules_share_a_name_while_doing_different_jobs() -> None:
    allowed = SAME_JOB | areas()
    shared = {
        name: [str(path) for path in paths]
        for name, paths in modules_by_name().items()
        if len(paths) > 1 and name not in allowed
    }
    assert shared == {}
