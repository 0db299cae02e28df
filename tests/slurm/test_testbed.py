"""The real-Slurm harness itself (`fleetwatch.sim.slurm`) and fleetwatch's scontrol wrapper
on it: the cluster comes up with GPUs as GRES, a job sees its GPUs, a drain takes, and every way
scontrol fails is told apart and counted."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fleetwatch.sim.slurm import SlurmCluster
from fleetwatch.slurm.scontrol import Scontrol, ScontrolError


def test_cluster_is_up_with_gpus(slurm: SlurmCluster) -> None:
    for name in slurm.nodes:
        fields = slurm.node(name)
        assert fields["State"] == "IDLE", fields
        assert fields["Gres"] == "gpu:2"
    assert slurm.startup_seconds < 60
    assert all(node.has_gpus for node in slurm.scontrol().nodes())  # the breaker's GPU nodes


def test_a_job_gets_its_gpus(slurm: SlurmCluster) -> None:
    done = slurm.run(
        "srun", "-N2", "--gres=gpu:1", "sh", "-c", 'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"'
    )
    assert sorted(done.stdout.split("\n")[:2]) == ["gpu01 0", "gpu02 0"]


def test_drain_and_resume_through_the_wrapper(slurm: SlurmCluster) -> None:
    scontrol = slurm.scontrol()
    scontrol.drain("gpu01", "fleetwatch:xid GPUFallenOffBus")
    try:
        node = scontrol.node("gpu01")
        assert node.drained
        assert node.reason == "fleetwatch:xid GPUFallenOffBus"
        assert node.reason_by == "root"
        refused = slurm.run("srun", "-w", "gpu01", "--immediate=2", "true", check=False)
        assert refused.returncode != 0
        assert {n.name: n.drained for n in scontrol.nodes()} == {"gpu01": True, "gpu02": False}
    finally:
        scontrol.resume("gpu01")
    assert not slurm.wait_for("gpu01", "IDLE").get("Reason")
    assert not scontrol.node("gpu01").drained
    assert not scontrol.errors


def test_unknown_node_is_its_own_error(slurm: SlurmCluster) -> None:
    scontrol = slurm.scontrol()
    with pytest.raises(ScontrolError, match="gpu09") as raised:
        scontrol.node("gpu09")
    assert raised.value.kind == "unknown_node"
    with pytest.raises(ScontrolError) as raised:
        scontrol.drain("gpu09", "fleetwatch:test X")
    assert raised.value.kind == "unknown_node"
    assert scontrol.errors == {"unknown_node": 2}
    assert not any("DRAIN" in slurm.state(name) for name in slurm.nodes)


def _conf_with(slurm: SlurmCluster, tmp_path: Path, old: str, new: str) -> Path:
    text = slurm.conf.read_text()
    assert old in text
    conf = tmp_path / "slurm.conf"
    conf.write_text(text.replace(old, new))
    (tmp_path / "gres.conf").write_text((slurm.conf.parent / "gres.conf").read_text())
    return conf


def test_munge_down_is_an_auth_error(slurm: SlurmCluster, tmp_path: Path) -> None:
    conf = _conf_with(slurm, tmp_path, "AuthInfo=socket=", f"AuthInfo=socket={tmp_path}/gone")
    scontrol = Scontrol(env={"SLURM_CONF": str(conf)})
    with pytest.raises(ScontrolError, match="scontrol update") as raised:
        scontrol.drain("gpu01", "fleetwatch:test X")
    assert raised.value.kind == "auth"
    assert scontrol.errors == {"auth": 1}
    assert "DRAIN" not in slurm.state("gpu01")


def test_a_controller_that_never_answers_times_out(slurm: SlurmCluster, tmp_path: Path) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts connections, never answers
        port = silent.getsockname()[1]
        text = slurm.conf.read_text()
        ctld_port = next(
            line.split("=", 1)[1] for line in text.splitlines() if line.startswith("SlurmctldPort=")
        )
        conf = _conf_with(slurm, tmp_path, f"SlurmctldPort={ctld_port}", f"SlurmctldPort={port}")
        scontrol = Scontrol(timeout=1.5, env={"SLURM_CONF": str(conf)})
        with pytest.raises(ScontrolError, match=r"within 1\.5s") as raised:
            scontrol.nodes()
    assert raised.value.kind == "timeout"
    assert scontrol.errors == {"timeout": 1}


def test_missing_binary_is_named() -> None:
    scontrol = Scontrol(binary="/nonexistent/scontrol")
    with pytest.raises(ScontrolError, match="/nonexistent/scontrol") as raised:
        scontrol.nodes()
    assert raised.value.kind == "missing"
    assert scontrol.errors == {"missing": 1}
