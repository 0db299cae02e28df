"""Helpers of the chart tests: lint and render helm/fleetwatch with the real Helm library.

Rendering goes through helm-sdkpy's install against the stand-in API server of
fakekube.py (helm-sdkpy has no client-only template action).
Helm keeps its release record in the stand-in server too, so nothing else is touched.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import importlib
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_sdkpy  # type: ignore[import-untyped]
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "fleetwatch"
NAMESPACE = "monitoring"
RELEASE = "fw"
LINT_WARNING = 2  # Helm's support.WarningSev; 1 is INFO


def chart_generator() -> Any:
    """helm/write_chart.py, the chart generator."""
    return importlib.import_module("helm.write_chart")


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's values merge: maps merge key by key, everything else is replaced."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def default_values() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return data


@dataclass(frozen=True)
class Release:
    """What Helm rendered for one install."""

    objects: list[dict[str, Any]]
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, component: str | None = None) -> dict[str, Any]:
        found = [
            o
            for o in self.of_kind(kind)
            if component is None
            or o["metadata"]["labels"].get("app.kubernetes.io/component") == component
        ]
        assert len(found) == 1, f"expected one {kind} {component or ''}, got {len(found)}"
        return found[0]


def install(kubeconfig: Path, values: Mapping[str, Any] | None = None) -> Release:
    """Install the chart with `values` (over values.yaml) into the stand-in API server."""
    config = helm_sdkpy.Configuration(namespace=NAMESPACE, kubeconfig=str(kubeconfig))
    result = asyncio.run(
        helm_sdkpy.Install(config).run(
            RELEASE, str(CHART), values=dict(values or {}), wait=False, timeout=60
        )
    )
    objects = [doc for doc in yaml.safe_load_all(result["manifest"]) if doc]
    return Release(objects=objects, notes=result.get("info", {}).get("notes", ""))


def lint(tmp_path: Path, values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Helm lint of the chart with `values` merged into a copy's values.yaml.

    helm-sdkpy's Lint takes no values, so the override goes into the copy's values.yaml.
    Returns the messages at WARNING severity or above.
    """
    copy_dir = tmp_path / "fleetwatch"
    shutil.copytree(CHART, copy_dir)
    merged = deep_merge(default_values(), values or {})
    (copy_dir / "values.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    config = helm_sdkpy.Configuration(namespace=NAMESPACE)
    result = asyncio.run(helm_sdkpy.Lint(config).run(str(copy_dir)))
    messages: list[dict[str, Any]] = result.get("Messages") or []
    return [m for m in messages if m.get("Severity", 0) >= LINT_WARNING]


# The RBAC verb of each generated-client method prefix.
_VERBS = {
    "read": "get",
    "list": "list",
    "patch": "patch",
    "create": "create",
    "replace": "update",
}


def tainter_api_calls(api: str = "_core") -> set[tuple[str, str]]:
    """(resource, verb) of every generated API method tainter/kube.py calls via `self.<api>`
    (`_core`: CoreV1Api, `_coordination`: CoordinationV1Api, `_batch`: BatchV1Api)."""
    tree = ast.parse((ROOT / "tainter" / "kube.py").read_text())
    calls = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == api
        ):
            match = re.fullmatch(
                r"(read|list|patch|create|replace)_(?:namespaced_)?([a-z]+)(?:_([a-z]+))?"
                r"(?:_for_all_namespaces)?",
                node.attr,
            )
            assert match, f"tainter/kube.py calls {node.attr}: map it to RBAC here"
            verb, kind, subresource = match.groups()
            calls.add((kind + "s" + (f"/{subresource}" if subresource else ""), _VERBS[verb]))
    return calls
