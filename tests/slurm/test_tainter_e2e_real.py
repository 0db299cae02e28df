"""The tainter on a real Slurm, end to end with every server real (`fleetwatch.sim.slurm`,
`fleetwatch.sim.overheat`): the simulated exporter's GPU 3 on gpu01 overheats, Prometheus fires
GPUOverheating, Alertmanager sends it to `fleetwatch taint --orchestrator=slurm`, which drains
gpu01 with `fleetwatch:gpu-overheat GPUOverheating` so `srun -w gpu01` is refused; an admin's
drain on gpu02 stays exactly as it was (its `[user@time]` too) even when an alert for gpu02
arrives; the GPU cools and gpu01 is resumed on Prometheus' evidence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from fleetwatch.sim.loopback_servers import post_alert, wait_until
from fleetwatch.sim.overheat import overheat_alert, start_overheat_stack
from fleetwatch.sim.slurm import SlurmCluster
from fleetwatch.sim.stack import Stack

pytestmark = pytest.mark.integration

OURS = "fleetwatch:gpu-overheat GPUOverheating"
ADMIN = "admin: fan check"


def drained(slurm: SlurmCluster, node: str) -> bool:
    """The node is drained or draining."""
    return "DRAIN" in slurm.state(node).split("+")


@pytest.fixture(scope="module")
def stack(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    slurm.drain("gpu02", ADMIN)
    with contextlib.ExitStack() as servers:
        yield start_overheat_stack(
            tmp_path_factory.mktemp("e2e-slurm"),
            servers,
            interval="1s",
            hold="3s",
            node="gpu01",
            tainter_args=("--orchestrator=slurm", f"--slurm.conf={slurm.conf}"),
        )
    slurm.resume("gpu02")


def test_overheat_drains_gpu01_leaves_the_admins_gpu02_and_cooling_resumes(
    slurm: SlurmCluster, stack: Stack
) -> None:
    admins = slurm.node("gpu02")["Reason"]  # with Slurm's [root@time]
    assert admins.startswith(ADMIN)
    wait_until(
        lambda: drained(slurm, "gpu01"),
        timeout=90,
        interval=0.25,
        what="gpu01 drained by the tainter",
    )
    reason = slurm.node("gpu01")["Reason"]
    assert reason.startswith(OURS + " [")
    refused = slurm.run("srun", "-w", "gpu01", "--immediate=5", "true", check=False)
    assert refused.returncode != 0
    assert stack.alertmanager is not None
    post_alert(stack.alertmanager.url, overheat_alert("gpu02"))
    wait_until(
        lambda: not drained(slurm, "gpu01"),
        timeout=120,
        interval=0.5,
        what="gpu01 resumed after the GPU cooled",
    )
    assert slurm.node("gpu02")["Reason"] == admins  # never rewritten, not even its time
    assert "fleetwatch" not in slurm.node("gpu01").get("Reason", "")
    ran = slurm.run("srun", "-w", "gpu01", "--immediate=10", "true", check=False)
    assert ran.returncode == 0, ran.stderr
