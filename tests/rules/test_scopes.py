"""Rule scopes: no rule in a node group reads across nodes.

A node group (rules/config.yaml `rule_groups:`) runs on a Prometheus shard that scrapes only
some nodes, so each of its expressions must give the same answer for a node whatever else
the shard holds. `cross_node_reads` parses an expression for what breaks that: an
aggregation that drops `node` (`by (...)` without it, `without (...)` with it, or neither),
`absent()`/`scalar()`, a join `on (...)` without `node` or the GPU's `uuid` (or `ignoring`
node), kube-state-metrics' series, and the records of global groups (in annotations too).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from fleetwatch.rules.config import GLOBAL_SCOPE, NODE_SCOPE, load_config
from fleetwatch.rules.groups import (
    alert_groups,
    group_scopes,
    recording_groups,
    scope_groups,
)
from tests.rules.promql import RULES_DIR

AGGREGATORS = "sum|min|max|avg|group|stddev|stdvar|count_values|count|bottomk|topk|quantile|limitk"
# Labels that pin a series to one node: the node itself, and a GPU's UUID (a GPU sits in
# one node, and every source of its series is scraped with that node).
NODE_KEYS = frozenset({"node", "uuid"})

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_AGGREGATION = re.compile(rf"\b({AGGREGATORS})\b\s*(?:(by|without)\s*\(([^)]*)\)\s*)?\(")
_TRAILING_GROUPING = re.compile(r"\s*(by|without)\s*\(([^)]*)\)")
_JOIN = re.compile(r"\b(on|ignoring)\s*\(([^)]*)\)")
_LABEL_DROPPING = re.compile(r"\b(absent|absent_over_time|scalar)\s*\(")
_NAME = re.compile(r"(?<![\w:])([a-zA-Z_:][\w:]*)(?![\w:(])")


def _labels(text: str) -> set[str]:
    return {label.strip() for label in text.split(",") if label.strip()}


def _closing(text: str, opening: int) -> int:
    """Index just past the parenthesis that closes the one at `opening`."""
    depth = 0
    for index in range(opening, len(text)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return index + 1
    raise ValueError(f"unbalanced parentheses in {text!r}")


def cross_node_reads(expr: str, *, global_records: set[str], kube_state_metrics: str) -> list[str]:
    """What in `expr` reads across nodes (empty when it reads one node's series only)."""
    found = []
    if kube_state_metrics in expr or re.search(r"(?<![\w:])kube_\w+", expr):
        found.append("reads kube-state-metrics")
    text = _MATCHERS.sub("", _STRING.sub('""', expr))
    for match in _AGGREGATION.finditer(text):
        operator, grouping, labels = match.groups()
        if grouping is None:
            trailing = _TRAILING_GROUPING.match(text, _closing(text, match.end() - 1))
            if trailing is not None:
                grouping, labels = trailing.groups()
        kept = _labels(labels or "")
        if grouping is None:
            found.append(f"{operator}() aggregates every node into one")
        elif grouping == "by" and "node" not in kept:
            found.append(f"{operator} by ({labels}) drops node")
        elif grouping == "without" and "node" in kept:
            found.append(f"{operator} without ({labels}) drops node")
    for match in _LABEL_DROPPING.finditer(text):
        found.append(f"{match.group(1)}() drops node")
    for match in _JOIN.finditer(text):
        keyword, labels = match.groups()
        keys = _labels(labels)
        if keyword == "on" and not keys & NODE_KEYS:
            found.append(f"on ({labels}) joins across nodes")
        elif keyword == "ignoring" and "node" in keys:
            found.append(f"ignoring ({labels}) joins across nodes")
    for name in sorted(set(_NAME.findall(text)) & global_records):
        found.append(f"reads the global record {name}")
    return found


def _global_records(config: Any) -> set[str]:
    return {
        rule["record"]
        for group in recording_groups(config, scope=GLOBAL_SCOPE)
        for rule in group["rules"]
    }


def test_no_node_rule_reads_across_nodes() -> None:
    config = load_config()
    global_records = _global_records(config)
    wrong = {}
    for group in scope_groups(config, NODE_SCOPE):
        for rule in group["rules"]:
            reads = cross_node_reads(
                rule["expr"],
                global_records=global_records,
                kube_state_metrics=config.kube_state_metrics_selector,
            )
            # The annotations' lookups run on the same engine: no global record there either.
            text = " ".join(rule.get("annotations", {}).values())
            reads += [f"annotation reads {name}" for name in sorted(global_records) if name in text]
            if reads:
                wrong[f"{group['name']}/{rule.get('alert') or rule['record']}"] = reads
    assert wrong == {}, "node-scope rules that need the whole fleet (make their group global)"


@pytest.mark.parametrize(
    "expr",
    [
        "count(node:fleetwatch_gpu_over_temperature_threshold:count > 0) > 5",
        "sum(x) by (job) > 1",
        "sum by (job, instance) (rate(x[5m]))",
        'max without (node, gpu) (x{job="fleetwatch"})',
        "absent(up)",
        "x\nand on ()\ny",
        "x\n* on (namespace, pod) group_left (training_job)\nz",
        "x / ignoring (node) y",
        'x * on (node) group_left () kube_pod_labels{job="kube-state-metrics"}',
        "fleetwatch:gpu_job:info > 0",
    ],
)
def test_the_checker_finds_a_read_across_nodes(expr: str) -> None:
    assert cross_node_reads(
        expr,
        global_records={"fleetwatch:gpu_job:info"},
        kube_state_metrics='job="kube-state-metrics"',
    )


@pytest.mark.parametrize(
    "expr",
    [
        "sum by (node) (x)",
        "sum(x) by (job, node)",
        "max without (instance, error) (x)",
        "x\nor on (uuid)\ny",
        "x < on (node, device, port) group_left () y",
        'max_over_time(x{sensor="gpu"}[5m]) > 1 and count_over_time(y[1m]) > 0',
        'label_replace(x, "uuid", "$1", "UUID", "(.+)")',
    ],
)
def test_the_checker_passes_one_node_reads(expr: str) -> None:
    assert (
        cross_node_reads(
            expr,
            global_records={"fleetwatch:gpu_job:info"},
            kube_state_metrics='job="kube-state-metrics"',
        )
        == []
    )


def test_a_training_group_declared_node_scope_is_caught(tmp_path: Any) -> None:
    text = (RULES_DIR / "config.yaml").read_text()
    changed = text.replace("fleetwatch-training-jobs: global", "fleetwatch-training-jobs: node")
    assert changed != text
    path = tmp_path / "config.yaml"
    path.write_text(changed)
    config = load_config(path)
    shipped_global = _global_records(load_config())
    reads = [
        cross_node_reads(
            rule["expr"],
            global_records=shipped_global,
            kube_state_metrics=config.kube_state_metrics_selector,
        )
        for group in scope_groups(config, NODE_SCOPE)
        if group["name"] == "fleetwatch-training-jobs"
        for rule in group["rules"]
    ]
    assert all(reads), reads


def test_every_group_has_a_scope_and_the_files_keep_them_apart() -> None:
    config = load_config()
    scopes = group_scopes(config)
    assert set(scopes.values()) == {NODE_SCOPE, GLOBAL_SCOPE}
    in_file = {
        name: [g["name"] for g in yaml.safe_load((RULES_DIR / name).read_text())["groups"]]
        for name in ("fleetwatch.rules.yaml", "fleetwatch.recording.yaml", "fleetwatch.global.yaml")
    }
    assert set(in_file["fleetwatch.global.yaml"]) == {
        name for name, scope in scopes.items() if scope == GLOBAL_SCOPE
    }
    assert {*in_file["fleetwatch.rules.yaml"], *in_file["fleetwatch.recording.yaml"]} == {
        name for name, scope in scopes.items() if scope == NODE_SCOPE
    }
    alerts = {r["alert"] for g in alert_groups(config) for r in g["rules"]}
    assert {"GPUStraggler", "GPUIdleInJob", "GPUOverheatingFleetWide"} <= alerts


def test_a_group_without_a_scope_is_named(tmp_path: Any) -> None:
    text = (RULES_DIR / "config.yaml").read_text()
    path = tmp_path / "config.yaml"
    path.write_text(text.replace("  fleetwatch-tainter: global", "  fleetwatch-tainter: shard"))
    with pytest.raises(ValueError, match=r"rule_groups\.fleetwatch-tainter: 'shard' is not one"):
        load_config(path)
    path.write_text(text.replace("  fleetwatch-tainter: global", ""))
    with pytest.raises(ValueError, match=r"rule_groups\.fleetwatch-tainter: required key"):
        group_scopes(load_config(path))
