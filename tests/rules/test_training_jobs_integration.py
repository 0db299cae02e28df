"""The training-job rules and dashboard against a real Prometheus scraping a simulated job.

One training job (JobSet `llm` in namespace `ml`) runs on two simulated nodes, four GPUs
each: GPU 2 of sim-node-1 is thermally throttled (hot, a lower SM clock) and the busiest GPU
of the job, GPU 1 of sim-node-2 idles, the others train normally; an NVLink of sim-node-2
and an InfiniBand port of sim-node-1 count errors. `fleetwatch simulate-cluster` plays the
cluster: each node's kubelet (PodResources, read by that node's exporter) and
kube-state-metrics' `kube_pod_labels`.
The tests check that GPUStraggler names the throttled GPU and GPUIdleInJob the idle one,
each with the job's identity, and that every Training job dashboard query returns data (the
hot GPU's node is tainted, the nodes count NVLink and InfiniBand errors).

`for` durations are shortened to 10s through the generator's substitution API (as in
test_rules_integration.py); thresholds stay as shipped.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.write_dashboards import DASHBOARDS_DIR
from fleetwatch.rules.config import load_config
from fleetwatch.rules.groups import alert_groups, dump_groups, recording_groups
from fleetwatch.sim.loopback_servers import (
    Server,
    prom_alerts,
    wait_until,
)
from testbed.tool_servers import prom_query
from tests.rules.live import (
    JOB,
    NAMESPACE,
    NEEDS_CHECKPOINT_MOUNT,
    cap_for,
    cluster_prometheus,
    job_node_scenario,
    simulated_nodes,
)
from tests.rules.promql import dashboards_generator

pytestmark = pytest.mark.integration

NODES = {
    "sim-node-1": job_node_scenario(
        "llm-workers-0",
        [
            {"at": 0, "kind": "throttle", "gpu": 2, "reason": "hw_thermal_slowdown"},
            {"at": 0, "kind": "tensor_active", "gpu": 2, "value": 0.9},
            {"at": 0, "kind": "temperature", "gpu": 2, "celsius": 84},
            {
                "at": 0,
                "kind": "ib_errors",
                "device": "mlx5_0",
                "port": 1,
                "error": "symbol",
                "per_second": 2,
            },
        ],
    ),
    "sim-node-2": job_node_scenario(
        "llm-workers-1",
        [
            {"at": 0, "kind": "tensor_active", "gpu": 1, "value": 0.02},
            {
                "at": 0,
                "kind": "nvlink_errors",
                "gpu": 3,
                "link": 1,
                "error": "crc_flit",
                "per_second": 5,
            },
        ],
    ),
}


@dataclass
class Job:
    prom: Server
    uuids: dict[tuple[str, str], str]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    workdir = tmp_path_factory.mktemp("training-job")
    config = load_config()
    alerts_path = workdir / "alerts.yaml"
    alerts_path.write_text(dump_groups(alert_groups(config, cap_for)))
    recording_path = workdir / "recording.yaml"
    recording_path.write_text(dump_groups(recording_groups(config)))
    scenarios: dict[str, Path] = {}
    for node, scenario in NODES.items():
        scenarios[node] = workdir / f"{node}.yaml"
        scenarios[node].write_text(yaml.safe_dump(scenario))
    with contextlib.ExitStack() as stack:
        cluster, targets = simulated_nodes(stack, workdir, scenarios)
        prom = cluster_prometheus(
            stack, workdir, (cluster, targets), config, [alerts_path, recording_path]
        )
        wait_until(
            lambda: len(prom_query(prom, f'fleetwatch:gpu_job:info{{training_job="{JOB}"}}')) == 8,
            timeout=60,
            what="all eight GPUs in fleetwatch:gpu_job:info, named by their JobSet label",
        )
        uuids = {
            (s["metric"]["node"], s["metric"]["gpu"]): s["metric"]["uuid"]
            for s in prom_query(prom, "fleetwatch:gpu_job:info")
        }
        yield Job(prom=prom, uuids=uuids)


def _firing(prom: Server, name: str) -> list[dict[str, Any]]:
    return [
        a for a in prom_alerts(prom) if a["state"] == "firing" and a["labels"]["alertname"] == name
    ]


def test_every_gpu_belongs_to_the_jobset(job: Job) -> None:
    info = prom_query(job.prom, "fleetwatch:gpu_job:info")
    assert {
        (s["metric"]["node"], s["metric"]["pod"], s["metric"]["training_job"]) for s in info
    } == {("sim-node-1", "llm-workers-0", JOB), ("sim-node-2", "llm-workers-1", JOB)}


@pytest.mark.parametrize(
    ("alertname", "node", "gpu", "pod", "severity"),
    [
        ("GPUStraggler", "sim-node-1", "2", "llm-workers-0", "warning"),
        ("GPUIdleInJob", "sim-node-2", "1", "llm-workers-1", "info"),
    ],
)
def test_the_job_names_its_straggler_and_its_idle_gpu(
    job: Job, alertname: str, node: str, gpu: str, pod: str, severity: str
) -> None:
    wait_until(lambda: bool(_firing(job.prom, alertname)), timeout=90, what=f"{alertname} firing")
    alerts = _firing(job.prom, alertname)
    assert [a["labels"] for a in alerts] == [
        {
            "alertname": alertname,
            "severity": severity,
            "node": node,
            "gpu": gpu,
            "uuid": job.uuids[(node, gpu)],
            "namespace": NAMESPACE,
            "pod": pod,
            "training_job": JOB,
        }
    ]
    assert alerts[0]["annotations"]["runbook_url"].endswith(f"/rules/runbooks/{alertname}.md")


def test_straggler_description_gives_the_clock_gap_and_the_reason(job: Job) -> None:
    wait_until(
        lambda: bool(_firing(job.prom, "GPUStraggler")), timeout=90, what="GPUStraggler firing"
    )
    description = _firing(job.prom, "GPUStraggler")[0]["annotations"]["description"]
    match = re.search(
        rf"training job {NAMESPACE}/{JOB} waits for: its tensor cores are active "
        r"(\S+) of the time, at or above the job's median of (\S+), while its SM clock "
        r"runs at (\S+)GHz \(job median (\S+)GHz\); clock events in the last 5m: "
        r"hw_thermal_slowdown (\S+)%\.$",
        description,
    )
    assert match, description
    # The simulated GPUs wobble by 0.02 around their activity: 0.9 throttled, 0.55 others.
    activity, median, clock, median_clock, throttled = map(float, match.groups())
    assert activity > 0.85 > 0.6 > median > 0.5
    assert clock < median_clock
    assert 0 < throttled <= 100


NEEDS_INTERRUPTION = {
    "Interruptions by kind",
    "Interruptions in the range, and GPUs held",
    "Nodes behind the job's interruptions",
}
"""The Goodput row's panels of interruptions: this job is never interrupted
(rules/tests/goodput.test.yaml tests their records)."""


def test_every_training_job_dashboard_query_returns_data(job: Job) -> None:
    wait_until(
        lambda: bool(_firing(job.prom, "GPUStraggler") and _firing(job.prom, "GPUOverheating")),
        timeout=90,
        what="GPUStraggler and the tainting GPUOverheating firing",
    )
    dashboards = dashboards_generator()
    data = json.loads((DASHBOARDS_DIR / "training-job.json").read_text())
    empty = []
    queries = dashboards.panel_queries(data)
    for title, expr in queries:
        if title in NEEDS_CHECKPOINT_MOUNT | NEEDS_INTERRUPTION:
            continue
        concrete = (
            expr.replace("$namespace", NAMESPACE)
            .replace("$training_job", JOB)
            .replace("$__rate_interval", "1m")
            .replace("$__range_s", "3600")
            .replace("$__range", "1h")
        )
        if not prom_query(job.prom, concrete):
            empty.append(f"{title}: {concrete}")
    assert len(queries) >= 9
    assert empty == []
