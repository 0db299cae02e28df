"""Slurm input, fuzzed: `scontrol show node -o` lines (Slurm 22.05's, as the Slurm backend
tests hold them), `scontrol show config` (where the tainter finds slurmctld's
StateSaveLocation), `squeue -h -o %i` (the running jobs the tainter requeues or cancels), the
job-to-GPU mapping files the prolog writes (fleetwatch's JSON, and dcgm-exporter's
one-job-ID-a-line files) in a mapping directory, and Prometheus' answer to the health check's
query for a node's firing alerts. A line is a node or `ScontrolError(malformed)`; the config is
one absolute path or `ScontrolError(malformed)`; squeue's output is job IDs, never anything
else, and the lines that are none, named; a directory is jobs plus named malformed files, never
an error; an answer is samples of string labels and a float, or `PrometheusClientError`."""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path
from typing import Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetwatch.promclient import PrometheusClientError, Sample, _samples
from fleetwatch.slurm.mapping import JobGpus, Reading, read
from fleetwatch.slurm.scontrol import PATH_MAX, Node, ScontrolError, state_save_location
from fleetwatch.tainter.slurm_requeue import JOB_ID, job_ids
from tests.fuzz.harness import FUZZ, FUZZ_COSTLY, bounded_label, exercise, finite_counts, named
from tests.fuzz.mutations import MIB, mutated_bytes, mutated_text, mutated_tree

LINES: Final = (
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=1 CPUTot=1 "
    "CPULoad=0.01 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 "
    "NodeAddr=127.0.0.1 NodeHostName=host Version=22.05.8 OS=Linux 6.1.0 RealMemory=1 "
    "AllocMem=0 FreeMem=1000 Sockets=1 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 "
    "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=main "
    "BootTime=2026-12-03T05:00:00 SlurmdStartTime=2026-12-03T06:00:00 "
    "LastBusyTime=2026-12-03T06:00:00 CfgTRES=cpu=1,billing=1 AllocTRES= CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=fleetwatch:gpu-overheat GPUOverheating [root@2026-12-03T06:10:00]",
    "NodeName=gpu02 Gres=gpu:h100:8(S:0-1) State=MIXED+DRAIN Reason=bad fan, ticket 42 "
    "[admin@2026-12-03T06:10:00] Comment=rack 7 Extra=x InstanceId=i-1",
    "NodeName=gpu03 Gres=(null) State=DOWN*",
)


def node_holds(node: Node) -> None:
    assert node.name
    assert node.state
    assert all(isinstance(flag, str) for flag in node.flags)
    assert isinstance(node.drained, bool)
    assert isinstance(node.has_gpus, bool)


@FUZZ
@given(mutated_text(LINES))
def test_scontrol_node_line(text: str) -> None:
    for line in text.splitlines() or [text]:
        exercise(
            "scontrol show node line", Node.parse, line, errors=(ScontrolError,), holds=node_holds
        )


# Slurm 22.05's `scontrol show config`, cut to a few of its ~200 lines (a header, `Key = value`
# padded to one column, sections of plugin settings, the controllers' state at the end).
CONFIGS: Final = (
    "Configuration data as of 2026-12-03T06:00:00\n"
    "AccountingStorageBackupHost = (null)\n"
    "AccountingStorageEnforce = none\n"
    "ClusterName             = fleet\n"
    "SlurmctldHost[0]        = ctl(127.0.0.1)\n"
    "SlurmUser               = slurm(64030)\n"
    "StateSaveLocation       = /var/spool/slurmctld\n"
    "SuspendExcNodes         = (null)\n"
    "TmpFS                   = /tmp\n"
    "\n"
    "Cgroup Support Configuration:\n"
    "AllowedRAMSpace         = 100.0%\n"
    "\n"
    "MPI Plugins Configuration:\n"
    "PMIxCliTmpDirBase       = (null)\n"
    "\n"
    "Slurmctld(primary) at ctl is UP\n",
    "StateSaveLocation = /shared/slurm state/ctl-a\nSlurmctld(primary) at ctl is UP\n",
    "StateSaveLocation       = (null)\n",
)
# `squeue -h -w NODE -t RUNNING -o %i`: job IDs, array tasks, heterogeneous job components.
SQUEUE: Final = ("4242\n", "4242\n77_3\n9+0\n9+1\n", "", "123456789\n")


def config_holds(location: str) -> None:
    """An absolute path, printable, no longer than Linux takes."""
    assert location.startswith("/"), location
    assert location.isprintable(), location
    assert len(location.encode("utf-8", "surrogatepass")) <= PATH_MAX


@FUZZ
@given(mutated_text(CONFIGS))
def test_scontrol_show_config(text: str) -> None:
    exercise(
        "scontrol show config",
        state_save_location,
        text,
        errors=(ScontrolError,),
        holds=config_holds,
    )


def jobs_hold(found: tuple[list[str], list[str]]) -> None:
    """Only job IDs (never an option-like word), each once; each other line named briefly."""
    jobs, bad = found
    assert len(set(jobs)) == len(jobs)
    for job in jobs:
        assert JOB_ID.fullmatch(job), job
        assert not job.startswith("-")
    for line in bad:
        named(line)


@FUZZ
@given(mutated_text(SQUEUE))
def test_squeue_job_ids(text: str) -> None:
    exercise(
        "squeue job IDs (tainter)",
        job_ids,
        text,
        malformed=lambda found: bool(found[1]),
        holds=jobs_hold,
    )


def test_the_state_save_location_must_be_one_absolute_path() -> None:
    assert state_save_location(CONFIGS[0]) == "/var/spool/slurmctld"
    assert state_save_location(CONFIGS[1]) == "/shared/slurm state/ctl-a"
    for text, words in (
        (CONFIGS[2], "no absolute path: '(null)'"),
        ("StateSaveLocation = spool\n", "no absolute path: 'spool'"),
        ("StateSaveLocation = /a\x1b[2J\n", "no absolute path"),
        ("StateSaveLocation = /" + "d" * PATH_MAX + "\n", "no absolute path: '/ddd"),
        ("StateSaveLocation = /a\nStateSaveLocation = /b\n", "names 2 StateSaveLocations"),
        ("ClusterName = fleet\n", "names no StateSaveLocation"),
    ):
        with pytest.raises(ScontrolError, match=re.escape(words)) as raised:
            state_save_location(text)
        assert raised.value.kind == "malformed"
        named(str(raised.value))


def test_squeue_lines_that_are_no_job_id_never_reach_scancel() -> None:
    jobs, bad = job_ids("4242\n--user=root\n77_3\n4242\nslurm_load_jobs error: Socket timed out\n")
    assert jobs == ["4242", "77_3"]
    assert bad == ["'--user=root'", "'slurm_load_jobs error: Socket timed out'"]


def _job_file(job_id: str, gpus: list[str], **extra: object) -> str:
    record = {
        "version": 1,
        "job_id": job_id,
        "user": "alice",
        "partition": "main",
        "nodes": 2,
        "gpus": gpus,
        "boot_id": "",
        "written": 1764720000.0,
    }
    return json.dumps(record | extra)


JOB_FILES: Final = (
    _job_file("4242", ["0", "1", "2", "3"]),
    _job_file("77", ["GPU-0b7e3c1a-6f1e-4c8a-9d2e-000000000003"], user="bob", nodes=1),
    _job_file("9", ["MIG-1b2c3d4e-0000-0000-0000-000000000000"]),
)
DCGM_FILES: Final = ("4242\n", "4242\n77\n", "\n12345678901234567890\n")
_JOB_ID: Final = re.compile(r"[0-9]{1,20}")


def reading_holds(found: Reading) -> None:
    for job in found.jobs:
        assert isinstance(job, JobGpus)
        assert _JOB_ID.fullmatch(job.job_id)
        assert job.gpus
        for gpu in job.gpus:
            bounded_label(gpu, 128)
        for text in (job.user, job.partition):
            bounded_label(text, 4 * 256)
        finite_counts((job.nodes,))
    for name, why in found.malformed:
        assert name
        named(why)


@FUZZ_COSTLY
@given(
    st.lists(
        st.tuples(st.sampled_from(("job-4242.json", "job-77.json", "job-9.json")), st.none())
        | st.tuples(st.sampled_from(("0", "1", "3.1", "7.0")), st.none()),
        min_size=1,
        max_size=4,
        unique=True,
    ),
    st.lists(mutated_text(JOB_FILES, huge=MIB // 4), min_size=4, max_size=4),
    st.lists(mutated_text(DCGM_FILES, huge=MIB // 4), min_size=4, max_size=4),
)
def test_job_mapping_directory(
    names: list[tuple[str, None]], jobs: list[str], dcgm: list[str]
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder)
        for index, (name, _) in enumerate(names):
            text = jobs[index] if name.startswith("job-") else dcgm[index]
            (directory / name).write_text(text, errors="surrogateescape")
        exercise(
            "Slurm and dcgm-exporter job mapping files",
            lambda path: read(path, now=time.time(), boot=""),
            directory,
            malformed=lambda found: bool(found.malformed),
            holds=reading_holds,
        )


def test_a_job_file_nested_too_deep_is_malformed() -> None:
    """Found by `./dev.sh fuzz --examples 600`: json.loads raised RecursionError."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "job-1.json").write_text("[" * 100000)
        found = read(Path(folder), now=time.time(), boot="")
    assert [name for name, _ in found.malformed] == ["job-1.json"]


ALERTS_ANSWERS: Final = (
    {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {
                    "metric": {
                        "__name__": "ALERTS",
                        "alertname": "GPUOverheating",
                        "alertstate": "firing",
                        "fleetwatch_taint": "gpu-overheat",
                        "node": "gpu01",
                        "gpu": "3",
                    },
                    "value": [1764720000.123, "1"],
                }
            ],
        },
    },
    {"status": "success", "data": {"resultType": "vector", "result": []}},
    {"status": "error", "errorType": "bad_data", "error": "1:8: parse error: unexpected '}'"},
)
_URL: Final = "http://prometheus:9090"


def _alerts_answer(raw: bytes) -> list[Sample]:
    return _samples(raw, _URL)


def samples_hold(samples: list[Sample]) -> None:
    """Each sample: string labels and a float value (Prometheus writes NaN and infinities)."""
    for labels, value in samples:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
        assert isinstance(value, float)


@FUZZ
@given(mutated_tree(ALERTS_ANSWERS))
def test_prometheus_answer_to_the_health_check(body: object) -> None:
    exercise(
        "Prometheus answer (Slurm health check)",
        _alerts_answer,
        json.dumps(body, allow_nan=True).encode(),
        errors=(PrometheusClientError,),
        holds=samples_hold,
    )


@FUZZ
@given(mutated_bytes([json.dumps(body).encode() for body in ALERTS_ANSWERS], huge=65536))
def test_prometheus_answer_bytes_to_the_health_check(raw: bytes) -> None:
    exercise(
        "Prometheus answer bytes (Slurm health check)",
        _alerts_answer,
        raw,
        errors=(PrometheusClientError,),
        holds=samples_hold,
    )


def test_a_malformed_node_line_is_named_by_an_excerpt() -> None:
    """Found by the fuzzer (`named`): a line without NodeName was quoted whole (1 MiB) in the
    ScontrolError the tainter logs."""
    with pytest.raises(ScontrolError) as raised:
        Node.parse("State=IDLE " + "x" * MIB)
    named(str(raised.value))
    assert raised.value.kind == "malformed"


def test_a_node_line_of_many_reasons_and_many_words_parses_in_one_pass() -> None:
    """Found by the fuzzer: each `Reason=` followed by a field Slurm prints after it was
    parsed by a recursive call (3,000 of them raised RecursionError), and a value's words were
    appended to a string the dict held (a 1 MiB line of words took seconds)."""
    node = Node.parse("NodeName=gpu01 State=IDLE+DRAIN" + " Reason=fan [root@x] Comment=c" * 3000)
    assert (node.reason, node.reason_by, node.fields["Comment"]) == ("fan", "root", "c")
    words = Node.parse("NodeName=gpu01 State=IDLE OS=Linux" + " w" * (MIB // 2))
    assert words.fields["OS"] == "Linux" + " w" * (MIB // 2)
    assert words.state == "IDLE"


def test_a_vector_whose_result_is_not_a_list_is_a_client_error() -> None:
    """Found by the fuzzer: `"result": true` raised TypeError out of the health check's
    Prometheus client."""
    raw = b'{"status": "success", "data": {"resultType": "vector", "result": true}}'
    with pytest.raises(PrometheusClientError, match="not a list"):
        _alerts_answer(raw)


def test_a_malformed_mapping_file_is_named_by_an_excerpt() -> None:
    """Found by the fuzzer (`named`): a dcgm-exporter line or a job file's field of 256 KiB
    was quoted whole in the reason the collector logs."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "7").write_text("4" * (MIB // 4) + "\n")
        (Path(folder) / "job-1.json").write_text(_job_file("1", ["0"], user="u" * (MIB // 4)))
        found = read(Path(folder), now=time.time(), boot="")
    assert sorted(name for name, _ in found.malformed) == ["7", "job-1.json"]
    for _, why in found.malformed:
        named(why)


def test_an_error_answer_to_the_health_check_is_named_by_an_excerpt() -> None:
    """Found by the fuzzer (`named`): an error answer's `error` of 8 KiB went whole into the
    PrometheusClientError the health check prints."""
    raw = json.dumps({"status": "error", "errorType": "bad_data", "error": "1" * 8192}).encode()
    with pytest.raises(PrometheusClientError, match="query failed: bad_data: 111") as raised:
        _alerts_answer(raw)
    named(str(raised.value))


def test_an_answer_nested_too_deep_is_a_client_error() -> None:
    """Found by `./dev.sh fuzz --examples 1000`: json.loads raised RecursionError out of the
    health check's Prometheus client."""
    with pytest.raises(PrometheusClientError, match="not a Prometheus API answer"):
        _alerts_answer(b'{"status":' * 100000)
