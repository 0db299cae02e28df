"""What the rule tests on live engines (Prometheus, VictoriaMetrics) share.

`cap_for` shortens the shipped `for` durations so an alert fires within the test's deadline;
`job_node_scenario` is a simulated node running one pod of the training job `NAMESPACE/JOB`.
Test modules import these from here, never from each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from fleetwatch.durations import parse_duration
from fleetwatch.rules.config import Config
from fleetwatch.sim.servers import Server, fleetwatch_command, fleetwatch_export, prometheus

# The longest `for` a live test waits out; the shipped thresholds themselves stay as they are.
MAX_FOR_SECONDS = 10
NAMESPACE = "ml"
JOB = "llm"


def cap_for(name: str, default: str) -> str:
    """Shorten long `for` durations so the test is quick; thresholds stay as shipped.

    GPUOverheating keeps its own: the tests that heat a GPU wait it out on purpose.
    """
    if name.endswith(".for") and name != "alerts.GPUOverheating.for":
        return f"{min(int(parse_duration(default)), MAX_FOR_SECONDS)}s"
    return default


def job_node_scenario(pod: str, faults: list[dict[str, Any]]) -> dict[str, Any]:
    """A four-GPU node whose GPUs all belong to `pod`, a worker of the job `NAMESPACE/JOB`."""
    return {
        "gpus": 4,
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "nvlinks_per_gpu": 4,
        "infiniband": [{"device": "mlx5_0", "ports": 1, "rate_gbps": 400}],
        "baseline": {"temperature_celsius": 62, "tensor_active": 0.55},
        "pods": [
            {
                "namespace": NAMESPACE,
                "name": pod,
                "container": "trainer",
                "gpus": [0, 1, 2, 3],
                "labels": {"jobset.sigs.k8s.io/jobset-name": JOB},
            }
        ],
        "faults": faults,
    }


# Dashboard panels whose data these stacks' scenarios do not produce: the simulated nodes here
# have no checkpoint mount and sit on no NVLink fabric. Their series and records are exercised
# where those exist: tests/storage/test_simulation.py (a simulated mount under the real
# collector), rules/tests/storage.test.yaml and rules/tests/domains.test.yaml (the records
# and alerts the panels read), tests/dashboards (the panels' PromQL parses).
NEEDS_CHECKPOINT_MOUNT: Final = frozenset(
    {
        "Checkpoint mounts: hung, read-only",
        "Checkpoint mount throughput",
        "Checkpoint mount space available",
        "NFS WRITE round trip",
        "Mount hung",
        "Checkpoint write throughput and saves",
        "Checkpoint write rate per node of the job",
        "Checkpoint alerts on the job's nodes",
    }
)
NEEDS_NVL72_DOMAIN: Final = frozenset({"NVLink domains", "Training jobs in degraded domains"})


def simulated_nodes(
    stack: contextlib.ExitStack,
    workdir: Path,
    scenarios: Mapping[str, Path],
    exporter_args: Callable[[str], Sequence[str]] = lambda _node: (),
) -> tuple[Server, list[dict[str, Any]]]:
    """The simulated cluster of `scenarios` (node -> scenario file) and an exporter per node
    reading its kubelet's PodResources socket, entered on `stack`: the cluster (its /metrics is the
    simulated kube-state-metrics) and the exporters' scrape targets, labelled with each node.
    `exporter_args` adds a node's own exporter flags."""
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
    targets = []
    for node, path in scenarios.items():
        exporter = stack.enter_context(
            fleetwatch_export(
                workdir / node,
                simulate=str(path),
                args=[
                    "--collector.interval=1s",
                    f"--collector.podresources.socket={workdir / f'{node}.sock'}",
                    "--collector.podresources.refresh-interval=1s",
                    *exporter_args(node),
                ],
            )
        )
        address = exporter.url.removeprefix("http://")
        targets.append({"targets": [address], "labels": {"node": node}})
    return cluster, targets


def cluster_prometheus(
    stack: contextlib.ExitStack,
    workdir: Path,
    nodes: tuple[Server, list[dict[str, Any]]],
    config: Config,
    rule_files: Sequence[Path],
) -> Server:
    """A real Prometheus, entered on `stack`, scraping what `simulated_nodes` started (the
    exporters as job fleetwatch, the cluster as kube-state-metrics) and evaluating
    `rule_files` at the config's intervals."""
    cluster, targets = nodes
    return stack.enter_context(
        prometheus(
            workdir / "prometheus",
            scrape_configs=[
                {"job_name": "fleetwatch", "static_configs": targets},
                {
                    "job_name": "kube-state-metrics",
                    "static_configs": [{"targets": [cluster.url.removeprefix("http://")]}],
                },
            ],
            rule_files=rule_files,
            scrape_interval=config.scrape_interval,
            evaluation_interval=config.evaluation_interval,
        )
    )
