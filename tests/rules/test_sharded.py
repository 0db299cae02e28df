"""The rule scopes end to end: two Prometheus shards with the node rules, VictoriaMetrics as
the shared store, vmalert with the global rules, against one Prometheus with every rule.

Four simulated nodes: shard A scrapes sim-node-1 and sim-node-2 (and kube-state-metrics,
which `fleetwatch simulate-cluster` plays), shard B sim-node-3 and sim-node-4; each runs
only the node-scope rules (rules/fleetwatch.rules.yaml, rules/fleetwatch.recording.yaml)
and remote-writes its samples, records and ALERTS to VictoriaMetrics, where vmalert
evaluates the global rules (rules/fleetwatch.global.yaml). Two training jobs span both
shards: `llm` (sim-node-1, sim-node-3) with a throttled, hot straggler on sim-node-1 and an
idle GPU on sim-node-3; `eval` (sim-node-2, sim-node-4), whose activity drops by two thirds
after SLOWDOWN_AT seconds. A reference Prometheus scrapes all four nodes with every rule.

The per-job alerts (GPUStraggler, GPUIdleInJob, TrainingJobSlowdown) must fire with the
same labels from vmalert as from the reference; the hot GPU's GPUOverheating, a node rule,
fires from shard A. `for` durations are capped as in the other integration tests.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetwatch.rules.config import GLOBAL_SCOPE, NODE_SCOPE, load_config
from fleetwatch.rules.groups import alert_groups, dump_groups, recording_groups, scope_groups
from fleetwatch.sim.servers import (
    alertmanager,
    fleetwatch_command,
    fleetwatch_export,
    prom_alerts,
    prometheus,
    wait_until,
)
from testbed.victoria import remote_write_endpoint, rules_for_vmalert, victoria_metrics, vmalert
from testbed.victoria import vmalert_alerts as vmalert_held
from tests.rules.live import NAMESPACE, cap_for, job_node_scenario

pytestmark = pytest.mark.integration

SLOWDOWN_AT = 60
"""Seconds after its exporter starts when job `eval`'s GPUs drop from 0.55 to 0.2."""
JOB_ALERTS = frozenset({"GPUStraggler", "GPUIdleInJob", "TrainingJobSlowdown"})
SHARDS = {"a": ("sim-node-1", "sim-node-2"), "b": ("sim-node-3", "sim-node-4")}


def _slowdown() -> list[dict[str, Any]]:
    return [
        {"at": SLOWDOWN_AT, "kind": "tensor_active", "gpu": gpu, "value": 0.2} for gpu in range(4)
    ]


def _eval_scenario(pod: str) -> dict[str, Any]:
    scenario = job_node_scenario(pod, _slowdown())
    scenario["pods"][0]["labels"] = {"jobset.sigs.k8s.io/jobset-name": "eval"}
    return scenario


NODES = {
    "sim-node-1": job_node_scenario(
        "llm-workers-0",
        [
            {"at": 0, "kind": "throttle", "gpu": 2, "reason": "hw_thermal_slowdown"},
            {"at": 0, "kind": "tensor_active", "gpu": 2, "value": 0.9},
            {"at": 0, "kind": "temperature", "gpu": 2, "celsius": 84},
        ],
    ),
    "sim-node-2": _eval_scenario("eval-workers-0"),
    "sim-node-3": job_node_scenario(
        "llm-workers-1", [{"at": 0, "kind": "tensor_active", "gpu": 1, "value": 0.02}]
    ),
    "sim-node-4": _eval_scenario("eval-workers-1"),
}

Key = frozenset[tuple[str, str]]


@dataclass
class Seen:
    """Every alert held firing at any poll: by the reference Prometheus, by vmalert (global
    rules over the shards' data), and by each shard (node rules)."""

    reference: set[Key] = field(default_factory=set)
    vmalert: set[Key] = field(default_factory=set)
    shards: dict[str, set[Key]] = field(default_factory=dict)


def _firing(alerts: list[dict[str, Any]]) -> set[Key]:
    return {frozenset(a["labels"].items()) for a in alerts if a["state"] == "firing"}


def _of(keys: set[Key], names: frozenset[str]) -> set[Key]:
    return {key for key in keys if dict(key)["alertname"] in names}


def _write_rules(workdir: Path) -> dict[str, list[Path]]:
    """Rule files by scope, `for` capped; the reference reads both scopes."""
    config = load_config()
    node_alerts, node_records, global_rules = (
        workdir / "node.rules.yaml",
        workdir / "node.recording.yaml",
        workdir / "global.yaml",
    )
    node_alerts.write_text(dump_groups(alert_groups(config, cap_for, NODE_SCOPE)))
    node_records.write_text(dump_groups(recording_groups(config, cap_for, NODE_SCOPE)))
    global_rules.write_text(dump_groups(scope_groups(config, GLOBAL_SCOPE, cap_for)))
    return {"node": [node_alerts, node_records], "global": [global_rules]}


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seen]:
    workdir = tmp_path_factory.mktemp("sharded")
    config = load_config()
    rules = _write_rules(workdir)
    scenarios = {}
    for node, scenario in NODES.items():
        scenarios[node] = workdir / f"{node}.yaml"
        scenarios[node].write_text(yaml.safe_dump(scenario))
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(
            fleetwatch_command(
                workdir / "cluster",
                command="simulate-cluster",
                ready_path="/metrics",
                args=[
                    *(f"--kubelet.scenario={node}={path}" for node, path in scenarios.items()),
                    f"--kubelet.socket-dir={workdir}",
                    f"--out.kubeconfig={workdir / 'kubeconfig.yaml'}",
                ],
            )
        )
        targets = {}
        for node, path in scenarios.items():
            exporter = stack.enter_context(
                fleetwatch_export(
                    workdir / node,
                    simulate=str(path),
                    args=[
                        "--collector.interval=1s",
                        f"--collector.podresources.socket={workdir / f'{node}.sock'}",
                        "--collector.podresources.refresh-interval=1s",
                    ],
                )
            )
            targets[node] = {
                "targets": [exporter.url.removeprefix("http://")],
                "labels": {"node": node},
            }
        kube_state_metrics = {
            "job_name": "kube-state-metrics",
            "static_configs": [{"targets": [cluster.url.removeprefix("http://")]}],
        }

        def scrape(nodes: tuple[str, ...]) -> list[dict[str, Any]]:
            return [
                {"job_name": "fleetwatch", "static_configs": [targets[n] for n in nodes]},
            ]

        vm = stack.enter_context(victoria_metrics(workdir / "victoria-metrics"))
        shards = {
            name: stack.enter_context(
                prometheus(
                    workdir / f"shard-{name}",
                    # kube-state-metrics is scraped once, by shard A, as by any one shard.
                    scrape_configs=scrape(nodes) + ([kube_state_metrics] if name == "a" else []),
                    rule_files=rules["node"],
                    remote_write_urls=[remote_write_endpoint(vm.url)],
                    scrape_interval=config.scrape_interval,
                    evaluation_interval=config.evaluation_interval,
                )
            )
            for name, nodes in SHARDS.items()
        }
        reference = stack.enter_context(
            prometheus(
                workdir / "reference",
                scrape_configs=[*scrape(tuple(NODES)), kube_state_metrics],
                rule_files=rules["node"] + rules["global"],
                scrape_interval=config.scrape_interval,
                evaluation_interval=config.evaluation_interval,
            )
        )
        am = stack.enter_context(
            alertmanager(
                workdir / "alertmanager",
                config={"route": {"receiver": "nobody"}, "receivers": [{"name": "nobody"}]},
            )
        )
        ruler = stack.enter_context(
            vmalert(
                workdir / "vmalert",
                rule_files=[
                    rules_for_vmalert(p, workdir / "vmalert-rules") for p in rules["global"]
                ],
                datasource_url=vm.url,
                notifier_urls=[am.url],
                remote_write_url=vm.url,
                evaluation_interval=config.evaluation_interval,
            )
        )
        result = Seen(shards={name: set() for name in shards})

        def all_fired() -> bool:
            result.reference |= _firing(prom_alerts(reference))
            result.vmalert |= _firing(vmalert_held(ruler))
            for name, shard in shards.items():
                result.shards[name] |= _firing(prom_alerts(shard))
            fired = [
                {dict(k)["alertname"] for k in keys} >= JOB_ALERTS
                for keys in (result.reference, result.vmalert)
            ]
            return all(fired) and _of(result.vmalert, JOB_ALERTS) == _of(
                result.reference, JOB_ALERTS
            )

        started = time.monotonic()
        wait_until(
            all_fired,
            timeout=SLOWDOWN_AT + 150,
            what="the same job alerts from vmalert and the reference Prometheus",
            interval=1,
        )
        print(f"job alerts on both after {time.monotonic() - started:.0f}s")
        yield result


def test_the_job_alerts_fire_from_the_global_ruler_as_on_one_prometheus(seen: Seen) -> None:
    assert {dict(k)["alertname"] for k in _of(seen.vmalert, JOB_ALERTS)} == JOB_ALERTS
    assert _of(seen.vmalert, JOB_ALERTS) == _of(seen.reference, JOB_ALERTS)


def test_a_job_on_both_shards_gets_its_straggler_idle_gpu_and_slowdown(seen: Seen) -> None:
    found = {
        (labels["alertname"], labels.get("node"), labels.get("gpu"), labels["training_job"])
        for labels in map(dict, _of(seen.vmalert, JOB_ALERTS))
    }
    assert found == {
        ("GPUStraggler", "sim-node-1", "2", "llm"),
        ("GPUIdleInJob", "sim-node-3", "1", "llm"),
        ("TrainingJobSlowdown", None, None, "eval"),
    }
    assert {dict(k)["namespace"] for k in _of(seen.vmalert, JOB_ALERTS)} == {NAMESPACE}


def test_a_node_rule_fires_from_its_shard(seen: Seen) -> None:
    hot = {
        (dict(k)["node"], dict(k)["gpu"])
        for k in _of(seen.shards["a"], frozenset({"GPUOverheating"}))
    }
    assert hot == {("sim-node-1", "2")}
    assert not _of(seen.shards["b"], frozenset({"GPUOverheating"}))
    assert not _of(seen.shards["a"] | seen.shards["b"], JOB_ALERTS)
