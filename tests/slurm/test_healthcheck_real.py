"""`fleetwatch slurm healthcheck` on a real Slurm cluster: it drains its node with the
drain controller's reason format when the local exporter shows a critical condition, leaves
a healthy node and a node someone else drained as they are, never resumes, and finishes
well inside Slurm's 60 s."""

from __future__ import annotations

import importlib.resources
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from fleetwatch.sim.servers import Server, fleetwatch_export
from fleetwatch.sim.slurm import SlurmCluster, slurm_cluster

SLURM_LIMIT = 60.0


@pytest.fixture(scope="module")
def degraded_scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in GB200 tray with GPU 2's NVLink fabric degraded from the start
    (GPUFabricDegraded, taint reason gpu-fabric), not from 60 s on."""
    text = (importlib.resources.files("fleetwatch.sim.scenarios") / "gb200.yaml").read_text()
    assert "{at: 60, kind: fabric_degraded" in text
    path = tmp_path_factory.mktemp("scenario") / "gb200-degraded.yaml"
    path.write_text(text.replace("{at: 60, kind: fabric_degraded", "{at: 0, kind: fabric_degraded"))
    return path


@pytest.fixture(scope="module")
def degraded(tmp_path_factory: pytest.TempPathFactory, degraded_scenario: Path) -> Iterator[Server]:
    """An exporter on that tray."""
    with fleetwatch_export(
        tmp_path_factory.mktemp("gb200"), simulate=str(degraded_scenario)
    ) as server:
        yield server


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A simulated healthy DGX H100."""
    with fleetwatch_export(tmp_path_factory.mktemp("h100"), simulate="dgx-h100") as server:
        yield server


def healthcheck(
    slurm: SlurmCluster, node: str, *args: str, env: Mapping[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """The health check as slurmd runs it (SLURMD_NODENAME set), and how long it took."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "fleetwatch", "slurm", "healthcheck", *args],
        env={**os.environ, **slurm.env, "SLURMD_NODENAME": node, **(env or {})},
        capture_output=True,
        text=True,
        timeout=SLURM_LIMIT,
        check=False,
    )
    return done, time.monotonic() - started


@pytest.fixture
def clean(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """Every node idle and undrained before and after the test."""
    yield slurm
    for node in slurm.nodes:
        if "DRAIN" in slurm.state(node):
            slurm.resume(node)


def test_critical_condition_drains_this_node(clean: SlurmCluster, degraded: Server) -> None:
    done, seconds = healthcheck(clean, "gpu02", f"--exporter.url={degraded.url}")
    assert done.returncode == 0, done.stderr
    assert "GPUFabricDegraded" in done.stdout
    node = clean.wait_for("gpu02", "DRAIN", timeout=10)
    assert node["Reason"].startswith("fleetwatch:gpu-fabric GPUFabricDegraded [root@")
    assert "DRAIN" not in clean.state("gpu01")
    assert seconds < SLURM_LIMIT / 2
    # Run again: drained already, left as it is (and never resumed).
    again, _ = healthcheck(clean, "gpu02", f"--exporter.url={degraded.url}")
    assert "already drained" in again.stderr
    assert clean.node("gpu02")["Reason"] == node["Reason"]


def test_healthy_node_is_left_alone(clean: SlurmCluster, healthy: Server) -> None:
    done, _ = healthcheck(clean, "gpu01", f"--exporter.url={healthy.url}")
    assert done.returncode == 0, done.stderr
    assert "healthy" in done.stdout
    assert "DRAIN" not in clean.state("gpu01")


def test_a_persons_drain_is_kept(clean: SlurmCluster, degraded: Server) -> None:
    clean.drain("gpu01", "bad PSU, ticket 123")
    done, _ = healthcheck(clean, "gpu01", f"--exporter.url={degraded.url}")
    assert done.returncode == 0
    assert "already drained" in done.stderr
    assert clean.node("gpu01")["Reason"].startswith("bad PSU, ticket 123 [root@")


def test_without_an_exporter_it_collects_once(clean: SlurmCluster, degraded_scenario: Path) -> None:
    """Nothing answers at --exporter.url (a socket that accepts and never answers, as a
    wedged exporter does): the check runs the collectors once itself (here on the simulated
    GB200), still drains, and stays inside Slurm's limit."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        done, seconds = healthcheck(
            clean,
            "gpu02",
            f"--exporter.url={url}",
            env={"FLEETWATCH_SIMULATE": str(degraded_scenario)},
        )
    assert done.returncode == 0, done.stderr
    assert "one-shot exporter" in done.stdout + done.stderr
    assert clean.node("gpu02")["Reason"].startswith("fleetwatch:gpu-fabric GPUFabricDegraded")
    assert seconds < SLURM_LIMIT


def test_unknown_node_is_named_and_nothing_drains(clean: SlurmCluster, degraded: Server) -> None:
    done, _ = healthcheck(clean, "gpu09", f"--exporter.url={degraded.url}")
    assert done.returncode == 0
    assert "gpu09" in done.stderr
    assert "unknown_node" in done.stderr
    assert not any("DRAIN" in clean.state(n) for n in clean.nodes)


@pytest.mark.integration  # starts its own cluster: slurmd runs the health check itself
def test_slurmd_runs_it_as_health_check_program(degraded: Server, tmp_path: Path) -> None:
    """slurm.conf HealthCheckProgram: slurmd runs the check (SLURMD_NODENAME set by slurmd,
    almost no environment) and the node it judges on a degraded fabric is drained."""
    check = [sys.executable, "-m", "fleetwatch", "slurm", "healthcheck"]
    with slurm_cluster(
        tmp_path / "cluster",
        health_check=[*check, f"--exporter.url={degraded.url}"],
        health_check_interval=5,
    ) as cluster:
        for name in cluster.nodes:
            node = cluster.wait_for(name, "DRAIN", timeout=60)
            assert node["Reason"].startswith("fleetwatch:gpu-fabric GPUFabricDegraded [root@")
