"""The live lemon rule end to end on a real Slurm (`testbed.lemon_stack`): real Prometheus
evaluating the shipped rules with the live windows shortened by a rules-config override.

gpu01 fails under Slurm job 101, comes back, runs job 102 and fails again: it is behind
interruptions (`node_fail`: its exporter silent while it held the job's GPUs) of two
different jobs within the lemon window. gpu02 fails twice under the same job 103. Through
Alertmanager and `fleetwatch taint --orchestrator=slurm`, gpu01 is drained with
`fleetwatch:lemon-node NodeInterruptsJobs` (and stays drained when the alert resolves,
until `fleetwatch untaint`) and gpu02 is left alone; and, as the remediation
contract declares for this alert (it needs Prometheus' history), `fleetwatch slurm
healthcheck --prometheus.url` run as slurmd runs it does the same on its own node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fleetwatch.cli import main
from fleetwatch.rules.alerts.goodput import LEMON_REASON
from fleetwatch.rules.interruptions import JOB_NODE_GPUS_RECORD, NODE_INTERRUPTION_RECORD
from fleetwatch.sim.loopback_servers import wait_until
from fleetwatch.sim.slurm import SlurmCluster
from testbed.lemon_stack import LEMON_WINDOW_SECONDS, LemonStack, lemon_stack
from testbed.tool_servers import prom_query

pytestmark = pytest.mark.integration

LEMON, TWICE = "gpu01", "gpu02"
ALERT = "NodeInterruptsJobs"
OURS = f"fleetwatch:{LEMON_REASON} {ALERT}"


def drained(slurm: SlurmCluster, node: str) -> bool:
    """The node is drained or draining."""
    return "DRAIN" in slurm.state(node).split("+")


@pytest.fixture
def clean(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """Every node undrained before and after the test."""
    for node in slurm.nodes:
        if drained(slurm, node):
            slurm.resume(node)
    yield slurm
    for node in slurm.nodes:
        if drained(slurm, node):
            slurm.resume(node)


def failed_jobs(stack: LemonStack, node: str) -> set[str]:
    """The Slurm jobs `node` is behind a node failure of, as the rules record it now."""
    rows = prom_query(
        stack.prometheus, f'{NODE_INTERRUPTION_RECORD}{{node="{node}",kind="node_fail"}}'
    )
    return {r["metric"]["training_job"] for r in rows}


def held(stack: LemonStack) -> set[tuple[str, str]]:
    """(node, Slurm job) of the GPUs the rules see held now."""
    rows = prom_query(stack.prometheus, f'{JOB_NODE_GPUS_RECORD}{{namespace="slurm"}}')
    return {(r["metric"]["node"], r["metric"]["training_job"]) for r in rows}


def fail(stack: LemonStack, jobs: set[tuple[str, str]]) -> None:
    """Each node of `jobs` fails while holding its job: its exporter falls silent until the
    rules record the failure, then answers again."""
    wait_until(lambda: held(stack) == jobs, timeout=30, interval=0.25, what=f"{sorted(jobs)} held")
    nodes = {node for node, _ in jobs}
    for node in nodes:
        stack.target.silence(node)
    wait_until(
        lambda: all(job in failed_jobs(stack, node) for node, job in jobs),
        timeout=30,
        interval=0.25,
        what=f"the failures of {sorted(jobs)} recorded",
    )
    for node in nodes:
        stack.target.silence(node, silent=False)
    wait_until(
        lambda: not any(failed_jobs(stack, node) for node in nodes),
        timeout=30,
        interval=0.25,
        what="the failures' records over (one run each)",
    )


def lemon_story(stack: LemonStack) -> None:
    """gpu01 fails under job 101, then under job 102; gpu02 twice under job 103."""
    target = stack.target
    target.run_slurm_job("101", LEMON)
    target.run_slurm_job("103", TWICE)
    fail(stack, {(LEMON, "101"), (TWICE, "103")})
    target.end_slurm_job("101", LEMON)  # Slurm requeued it elsewhere
    target.run_slurm_job("102", LEMON)
    fail(stack, {(LEMON, "102"), (TWICE, "103")})


def firing(stack: LemonStack) -> set[str]:
    """The nodes NodeInterruptsJobs fires for now."""
    rows = prom_query(stack.prometheus, f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}')
    return {r["metric"]["node"] for r in rows}


def test_the_tainter_drains_the_node_behind_two_jobs_failures_and_nothing_else(
    clean: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with lemon_stack(
        tmp_path_factory.mktemp("lemon-slurm"),
        nodes=clean.nodes,
        tainter_args=("--orchestrator=slurm", f"--slurm.conf={clean.conf}"),
    ) as stack:
        lemon_story(stack)
        wait_until(
            lambda: drained(clean, LEMON),
            timeout=60,
            interval=0.25,
            what="gpu01 drained by the tainter",
        )
        assert clean.node(LEMON)["Reason"].startswith(OURS + " [")
        assert firing(stack) == {LEMON}
        assert not drained(clean, TWICE)
        refused = clean.run("srun", "-w", LEMON, "--immediate=5", "true", check=False)
        assert refused.returncode != 0
        # The failures leave the lemon window: the alert resolves, and gpu01 stays drained
        # until a person releases it.
        wait_until(
            lambda: stack.untaint_deferred("manual") > 0,
            timeout=LEMON_WINDOW_SECONDS + 60,
            interval=0.5,
            what="the resolved lemon alert's release deferred to a person",
        )
        assert firing(stack) == set()
        assert clean.node(LEMON)["Reason"].startswith(OURS + " [")
        released = main(["untaint", "--orchestrator=slurm", f"--slurm.conf={clean.conf}", LEMON])
        assert released == 0
        assert not drained(clean, LEMON)
        assert not drained(clean, TWICE)


def healthcheck(slurm: SlurmCluster, node: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`fleetwatch slurm healthcheck` as slurmd runs it on `node` (SLURMD_NODENAME set)."""
    return subprocess.run(
        [sys.executable, "-m", "fleetwatch", "slurm", "healthcheck", *args],
        env={**os.environ, **slurm.env, "SLURMD_NODENAME": node},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_health_check_asks_prometheus_and_drains_only_the_lemon(
    clean: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with lemon_stack(
        tmp_path_factory.mktemp("lemon-hc"), nodes=clean.nodes, tainter_args=None
    ) as stack:
        lemon_story(stack)
        wait_until(
            lambda: firing(stack) == {LEMON},
            timeout=30,
            interval=0.25,
            what="NodeInterruptsJobs firing for gpu01",
        )
        flags = (
            f"--prometheus.url={stack.prometheus.url}",
            f"--rules.config-file={stack.override}",
        )
        flags = (
            f"--prometheus.url={stack.prometheus.url}",
            f"--rules.config-file={stack.override}",
        )
        left = healthcheck(clean, TWICE, *flags)
        assert left.returncode == 0, left.stderr
        assert ALERT not in left.stdout
        taken = healthcheck(clean, LEMON, *flags)
        assert taken.returncode == 0, taken.stderr
        assert ALERT in taken.stdout
        assert clean.node(LEMON)["Reason"].startswith(OURS + " [")
        assert not drained(clean, TWICE)
