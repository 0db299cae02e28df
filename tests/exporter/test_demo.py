"""`fleetwatch demo` and its hidden `simulate-cluster`: bounded flags, and a short run of the
whole stack that stops every server it started."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetwatch.cli import build_parser, main, parse_args
from fleetwatch.sim.servers import ALERTMANAGER, PROMETHEUS, http_status, require_binary
from fleetwatch.sim.slurm import BINARIES, SYSTEM_DIRECTORIES, search_path
from fleetwatch.slurm_demo import missing


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--duration=0s"], "invalid duration '0s': must be between 1s and 366d"),
        (["demo", "--duration=-1s"], "invalid duration '-1s'"),
        (["demo", "--duration=nan"], "invalid duration 'nan'"),
        (["demo", "--duration=inf"], "invalid duration 'inf'"),
        (["demo", "--duration=400d"], "invalid duration '400d': must be between 1s and 366d"),
        (["demo", "--duration=60"], "invalid duration '60': use whole numbers with units"),
        (["demo", "--orchestrator=nomad"], "argument --orchestrator: invalid choice: 'nomad'"),
        (
            ["simulate-cluster", "--out.kubeconfig=k", "--web.listen-address=:70000"],
            "invalid listen address ':70000': port above 65535",
        ),
        (
            ["simulate-cluster", "--out.kubeconfig=k", "--kubelet.socket-dir=/nonexistent"],
            "not a directory: /nonexistent",
        ),
        (
            ["simulate-cluster", "--out.kubeconfig=k", "--kubelet.scenario=demo-node"],
            "'demo-node': expected NODE=SCENARIO",
        ),
    ],
)
def test_bad_flags_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"fleetwatch {argv[0]}: error:")
    assert message in err


def test_the_slurm_demo_takes_no_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--orchestrator=slurm", "--scenario=demo"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "fleetwatch demo: error: --scenario is for --orchestrator=kubernetes: "
        "the Slurm demo tells its own story"
    )


def test_the_orchestrator_comes_from_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parse_args(["demo"]).orchestrator == "kubernetes"
    monkeypatch.setenv("FLEETWATCH_ORCHESTRATOR", "slurm")
    assert parse_args(["demo"]).orchestrator == "slurm"
    assert parse_args(["demo", "--orchestrator=kubernetes"]).orchestrator == "kubernetes"


def test_without_slurm_the_slurm_demo_names_the_packages_and_starts_nothing(
    tmp_path: Path,
) -> None:
    """With an empty PATH: every program missing from it and from the system directories, and
    the Debian packages holding them, one error, no traceback, exit 1, nothing started (no
    temporary folder named)."""
    result = subprocess.run(
        [sys.executable, "-m", "fleetwatch", "demo", "--orchestrator=slurm"],
        env={**os.environ, "PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == "fleetwatch demo: error: the Slurm demo needs what this machine lacks:"
    search = f"{tmp_path}{os.pathsep}{SYSTEM_DIRECTORIES}"
    absent = [program for program in BINARIES if shutil.which(program, path=search) is None]
    assert {"scontrol", "srun", "sbatch", "sinfo"} <= set(absent)  # /usr/bin is not searched
    packages = " ".join(dict.fromkeys(BINARIES[program] for program in absent))
    assert f"  - {', '.join(absent)} not on PATH: apt-get install {packages}" in result.stderr


def test_not_root_is_named_among_what_the_slurm_demo_lacks() -> None:
    """As another user (the effective UID switched for the call, then back): root is asked
    for, and the programs this machine has are not."""
    if os.geteuid() != 0:
        problems = missing()
    else:
        os.seteuid(65534)  # nobody
        try:
            problems = missing()
        finally:
            os.seteuid(0)
    assert problems[0] == (
        "it runs as root (slurmd, and mknod for its GPU device files): run as root"
    )
    if all(shutil.which(program, path=search_path()) for program in BINARIES):
        assert not any("not on PATH" in problem for problem in problems), problems


def test_duration_reads_like_every_other_duration_flag() -> None:
    assert build_parser().parse_args(["demo", "--duration=1m30s"]).duration == 90.0
    assert build_parser().parse_args(["demo"]).duration is None


@pytest.mark.integration
def test_a_short_demo_starts_the_whole_stack_and_stops_it() -> None:
    require_binary(PROMETHEUS)
    require_binary(ALERTMANAGER)
    result = subprocess.run(
        [sys.executable, "-m", "fleetwatch", "demo", "--duration=2s"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    banner = result.stdout
    urls = dict(
        re.findall(r"^  (exporter|prometheus|alertmanager|tainter) +(http://[\d.:]+)", banner, re.M)
    )
    assert set(urls) == {"exporter", "prometheus", "alertmanager", "tainter"}, banner
    assert "SIMULATED k8s" in banner
    assert "stopping every process the demo started" in banner
    workdir = re.search(r"^Logs: (\S+)\. Press Ctrl-C", banner, re.M)
    assert workdir is not None
    assert not Path(workdir.group(1)).exists(), "the demo removes its temporary directory"
    for url in urls.values():  # every server the banner named is gone
        with pytest.raises(OSError):
            http_status(url + "/", timeout=2)
