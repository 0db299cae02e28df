"""On a real Slurm cluster: a job's prolog writes the mapping the exporter reads, the
exporter exports the job on the allocation series, and the epilog takes it away."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from fleetwatch.catalog.allocation import GPU_ALLOCATION_INFO
from fleetwatch.catalog.slurm import SLURM_JOB_INFO, SLURM_NAMESPACE
from fleetwatch.sim.loopback_servers import fleetwatch_export, http_get, wait_until
from fleetwatch.sim.slurm import SlurmCluster
from fleetwatch.slurm.findings import parse_exposition
from tests.slurm.cluster import MAPS


def _job_files(slurm: SlurmCluster, node: str) -> list[Path]:
    return sorted((slurm.workdir / MAPS / node).glob("job-*.json"))


def test_prolog_mapping_is_what_the_exporter_exports(slurm: SlurmCluster, tmp_path: Path) -> None:
    release = tmp_path / "release"
    job = subprocess.Popen(
        ["srun", "-N2", "--gres=gpu:2", "sh", "-c", f"until [ -e {release} ]; do sleep 0.1; done"],
        env={**os.environ, **slurm.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        files = wait_until(
            lambda: all(_job_files(slurm, n) for n in slurm.nodes) or None,
            timeout=60,
            what="both nodes' prolog mappings",
        )
        assert files
        record = json.loads(_job_files(slurm, "gpu01")[0].read_text())
        job_id = record["job_id"]
        assert record["gpus"] == ["0", "1"]
        assert (record["user"], record["partition"], record["nodes"]) == ("root", "main", 2)
        with fleetwatch_export(
            tmp_path / "exporter",
            simulate="dgx-h100",
            args=[f"--slurm.mapping-dir={slurm.workdir / MAPS / 'gpu01'}"],
        ) as exporter:
            samples = parse_exposition(http_get(exporter.url + "/metrics").decode())
        allocated = [
            labels
            for labels, value in samples[GPU_ALLOCATION_INFO.name]
            if labels["namespace"] == SLURM_NAMESPACE and value == 1
        ]
        assert sorted(a["gpu"] for a in allocated) == ["0", "1"]
        assert {a["pod"] for a in allocated} == {job_id}
        assert all(a["uuid"].startswith("GPU-") for a in allocated)
        info = [labels for labels, _ in samples[SLURM_JOB_INFO.name]]
        assert info == [{"job_id": job_id, "user": "root", "partition": "main", "nodes": "2"}]
    finally:
        release.touch()
        out, _ = job.communicate(timeout=60)
    assert job.returncode == 0, out
    wait_until(
        lambda: not any(_job_files(slurm, n) for n in slurm.nodes),
        timeout=60,
        what="the epilog to remove both mappings",
    )
