"""The mapping directory (fleetwatch.slurm.mapping), the prolog and epilog commands, and
the `slurmjobs` collector, without Slurm: both formats, expiry, and bad input that is
named and changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetwatch.catalog.allocation import GPU_ALLOCATION_INFO
from fleetwatch.catalog.slurm import SLURM_JOB_INFO, SLURM_JOB_RESTARTS, SLURM_MAPPING_FILES
from fleetwatch.collectors.slurm_allocation import SlurmJobsCollector
from fleetwatch.slurm import mapping
from fleetwatch.slurm.cli import epilog, prolog

JOB_ENV = {
    "SLURM_JOB_ID": "1234",
    "SLURM_JOB_GPUS": "0,1",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_PARTITION": "train",
    "SLURM_JOB_NUM_NODES": "16",
}


def test_prolog_writes_what_read_returns_and_epilog_removes_it(tmp_path: Path) -> None:
    assert prolog(tmp_path, dict(JOB_ENV)) == 0
    reading = mapping.read(tmp_path)
    assert reading.jobs == (
        mapping.JobGpus(
            job_id="1234", gpus=("0", "1"), user="alice", partition="train", nodes=16, restarts=0
        ),
    )
    assert (reading.malformed, reading.expired) == ((), 0)
    assert epilog(tmp_path, {"SLURM_JOB_ID": "1234"}) == 0
    assert mapping.read(tmp_path).jobs == ()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SLURM_STEP_GPUS", "GPU-8c0a1b2c-0000-1111-2222-333344445555"),
        ("CUDA_VISIBLE_DEVICES", "2,3"),
    ],
)
def test_gpus_from_the_other_variables(tmp_path: Path, variable: str, value: str) -> None:
    environ = {k: v for k, v in JOB_ENV.items() if k != "SLURM_JOB_GPUS"} | {variable: value}
    prolog(tmp_path, environ)
    assert mapping.read(tmp_path).jobs[0].gpus == tuple(value.split(","))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"SLURM_JOB_ID": ""}, "SLURM_JOB_ID"),
        ({"SLURM_JOB_ID": "12; rm -rf /"}, "SLURM_JOB_ID"),
        ({"SLURM_JOB_GPUS": "NoDevFiles"}, "SLURM_JOB_GPUS"),
        ({"SLURM_JOB_GPUS": "0-3"}, "SLURM_JOB_GPUS"),
        ({"SLURM_JOB_NUM_NODES": "two"}, "SLURM_JOB_NUM_NODES"),
        ({"SLURM_RESTART_COUNT": "-1"}, "SLURM_RESTART_COUNT"),
    ],
)
def test_bad_environment_is_named_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, str], named: str
) -> None:
    assert prolog(tmp_path, JOB_ENV | change) == 0  # never fails the job
    assert named in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_requeued_job_records_its_restart_count(tmp_path: Path) -> None:
    prolog(tmp_path, JOB_ENV | {"SLURM_RESTART_COUNT": "3"})
    assert mapping.read(tmp_path).jobs[0].restarts == 3


def test_a_mapping_without_a_restart_count_reads_as_unknown(tmp_path: Path) -> None:
    prolog(tmp_path, dict(JOB_ENV))
    path = tmp_path / "job-1234.json"
    record = json.loads(path.read_text())
    del record["restarts"]
    path.write_text(json.dumps(record))
    reading = mapping.read(tmp_path)
    assert (reading.jobs[0].restarts, reading.malformed) == (None, ())
    record["restarts"] = "two"
    path.write_text(json.dumps(record))
    assert "restarts" in mapping.read(tmp_path).malformed[0][1]


def test_a_job_without_gpus_writes_nothing(tmp_path: Path) -> None:
    environ = {k: v for k, v in JOB_ENV.items() if k != "SLURM_JOB_GPUS"}
    assert prolog(tmp_path, environ) == 0
    assert list(tmp_path.iterdir()) == []


def test_dcgm_exporter_format(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("77\n")
    (tmp_path / "1").write_text("77\n78\n")
    (tmp_path / "3.2").write_text("79\n")
    reading = mapping.read(tmp_path)
    by_job = {job.job_id: job for job in reading.jobs}
    assert by_job["77"].gpus == ("0", "1")
    assert by_job["78"].gpus == ("1",)
    assert by_job["79"].gpus == ("3",)
    assert by_job["79"].mig_instance == {"3": "2"}
    assert {job.source for job in reading.jobs} == {"dcgm"}


def test_malformed_files_are_named_and_the_rest_is_read(tmp_path: Path) -> None:
    prolog(tmp_path, dict(JOB_ENV))
    (tmp_path / "job-55.json").write_text("{not json")
    (tmp_path / "job-56.json").write_text(json.dumps({"version": 1, "job_id": "57", "gpus": []}))
    (tmp_path / "2").write_text("abc\n")
    (tmp_path / "README").write_text("ignored: not a mapping name")
    reading = mapping.read(tmp_path)
    assert [job.job_id for job in reading.jobs] == ["1234"]
    problems = dict(reading.malformed)
    assert set(problems) == {"job-55.json", "job-56.json", "2"}
    assert "not JSON" in problems["job-55.json"]
    assert "57" in problems["job-56.json"]
    assert "'abc'" in problems["2"]


def test_mappings_from_an_earlier_boot_expire(tmp_path: Path) -> None:
    prolog(tmp_path, dict(JOB_ENV))
    assert len(mapping.read(tmp_path, boot="another-boot").jobs) == 0
    assert mapping.read(tmp_path, boot="another-boot").expired == 1
    # A dcgm-exporter file last written before this boot.
    old = tmp_path / "0"
    old.write_text("88\n")
    booted = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    os.utime(old, (booted - 3600, booted - 3600))
    reading = mapping.read(tmp_path)
    assert [job.job_id for job in reading.jobs] == ["1234"]
    assert reading.expired == 1


def test_max_age_expires_old_mappings(tmp_path: Path) -> None:
    prolog(tmp_path, dict(JOB_ENV))
    later = time.time() + 7200
    assert mapping.read(tmp_path, max_age=3600, now=later).expired == 1
    assert mapping.read(tmp_path, max_age=None, now=later).expired == 0


class _Gpu:
    def __init__(self, index: int) -> None:
        self.index = index
        self.identity = type("Identity", (), {"index": index, "uuid": f"GPU-{index:04d}"})()


class _Source:
    def gpus(self) -> tuple[_Gpu, ...]:
        return (_Gpu(0), _Gpu(1))


def test_collector_series(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    prolog(tmp_path, dict(JOB_ENV))
    (tmp_path / "1").write_text("99\n")
    (tmp_path / "job-5.json").write_text("[]")
    collector = SlurmJobsCollector(directory=tmp_path, source=_Source(), max_age=None)  # type: ignore[arg-type]
    families = {
        f.spec.name: list(zip(f.labels, f.values, strict=True)) for f in collector.collect()
    }
    allocated = sorted(
        (labels["gpu"], labels["uuid"], labels["pod"], labels["namespace"])
        for labels, _ in families[GPU_ALLOCATION_INFO.name]
    )
    assert allocated == [
        ("0", "GPU-0000", "1234", "slurm"),
        ("1", "GPU-0001", "1234", "slurm"),
        ("1", "GPU-0001", "99", "slurm"),
    ]
    info = [labels for labels, _ in families[SLURM_JOB_INFO.name]]
    assert info == [{"job_id": "1234", "user": "alice", "partition": "train", "nodes": "16"}]
    restarts = [(labels, value) for labels, value in families[SLURM_JOB_RESTARTS.name]]
    assert restarts == [({"job_id": "1234"}, 0)]
    files = {labels["state"]: value for labels, value in families[SLURM_MAPPING_FILES.name]}
    assert files == {"live": 2, "expired": 0, "malformed": 1}
    assert "job-5.json" in caplog.text
    caplog.clear()
    collector.collect()
    assert "job-5.json" not in caplog.text  # logged once while it stays malformed


def test_collector_restart_count_and_its_absence(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prolog(tmp_path, JOB_ENV | {"SLURM_RESTART_COUNT": "2"})
    prolog(tmp_path, JOB_ENV | {"SLURM_JOB_ID": "77"})
    old = tmp_path / "job-77.json"
    record = json.loads(old.read_text())
    del record["restarts"]
    old.write_text(json.dumps(record))
    collector = SlurmJobsCollector(directory=tmp_path, source=_Source(), max_age=None)  # type: ignore[arg-type]
    with caplog.at_level("INFO"):
        families = {f.spec.name: f for f in collector.collect()}
    restarts = families[SLURM_JOB_RESTARTS.name]
    assert sorted(
        zip((lab["job_id"] for lab in restarts.labels), restarts.values, strict=True)
    ) == [
        ("1234", 2),
        ("77", 0),
    ]
    assert "job 77 has no restart count" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):
        collector.collect()
    assert "no restart count" not in caplog.text  # noted once


def test_no_directory_no_series(tmp_path: Path) -> None:
    collector = SlurmJobsCollector(directory=tmp_path / "absent", source=_Source(), max_age=None)  # type: ignore[arg-type]
    assert collector.collect() == []


def test_prolog_command_imports_almost_nothing(tmp_path: Path) -> None:
    """The prolog runs for every job: `fleetwatch slurm prolog` loads no exporter, tainter,
    report, NVML, HTTP, YAML or Prometheus client module."""
    script = (
        "import sys\n"
        "from fleetwatch.cli import main\n"
        f"main(['slurm', 'prolog', '--slurm.mapping-dir={tmp_path}'])\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **JOB_ENV},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    loaded = set(done.stdout.split())
    heavy = {"aiohttp", "pynvml", "yaml", "prometheus_client", "grpc", "kubernetes_asyncio"}
    assert not heavy & {name.split(".")[0] for name in loaded}
    assert not {n for n in loaded if n.startswith(("fleetwatch.exporter", "fleetwatch.tainter"))}
    assert (tmp_path / "job-1234.json").exists()
