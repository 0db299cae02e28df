"""Helpers shared by the rule and dashboard tests: load the dashboard generator, read the
catalog, and pull metric names out of PromQL.

The dashboard generator is a script in a package at the repository root (dashboards/).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

import yaml

from fleetwatch.catalog import ALL
from testbed.tool_servers import promtool

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "rules"

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_OUR_NAME = re.compile(r"(?<![\w:])((?:[a-z_]+:)?fleetwatch_[a-z0-9_]+(?::[a-z0-9_]+)?)(?![\w:])")
_MATCHERS = re.compile(r"\{[^}]*\}")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def dashboards_generator() -> ModuleType:
    return importlib.import_module("dashboards.write_dashboards")


def metric_names(expr: str) -> set[str]:
    """fleetwatch metric and recording-rule names an expression reads.

    Strings, label matchers (`{...}`) and label lists (`by (...)`, `on (...)`, ...) are
    dropped first, so label names such as `fleetwatch_taint` are not taken for metrics.
    """
    text = _LABEL_LIST.sub(" ", _MATCHERS.sub(" ", _STRING.sub('""', expr)))
    return set(_OUR_NAME.findall(text))


def catalog_names() -> set[str]:
    """Metric names the metric catalog declares (docs/metrics.md is generated from it), with
    the series a histogram family exposes (`_bucket`, `_sum`, `_count`)."""
    names = {spec.name for spec in ALL}
    for spec in ALL:
        if spec.kind == "histogram":
            names |= {f"{spec.name}{suffix}" for suffix in ("_bucket", "_sum", "_count")}
    return names


def recorded_names() -> set[str]:
    """Names the committed recording rules (of both scopes) produce."""
    names = set()
    for name in ("fleetwatch.recording.yaml", "fleetwatch.global.yaml"):
        for group in yaml.safe_load((RULES_DIR / name).read_text())["groups"]:
            names |= {rule["record"] for rule in group["rules"] if "record" in rule}
    return names


def check_exprs_parse(exprs: dict[str, str], workdir: Path) -> str:
    """Run `promtool check rules` on `exprs` as recording rules; return its output on failure."""
    rules = [
        {"record": f"check:expr_{i}:value", "expr": expr} for i, expr in enumerate(exprs.values())
    ]
    path = workdir / "exprs.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "check", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    if result.returncode == 0:
        return ""
    names = "\n".join(f"  expr_{i}: {where}" for i, where in enumerate(exprs))
    return f"{result.stdout}{result.stderr}\nwhere:\n{names}"
