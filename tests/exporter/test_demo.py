"""`fleetwatch demo` and its hidden `simulate-cluster`: bounded flags, and a short run of the
whole stack that stops every server it started."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetwatch.cli import build_parser, main
from fleetwatch.sim.servers import ALERTMANAGER, PROMETHEUS, http_status, require_binary


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--duration=0s"], "invalid duration '0s': must be between 1s and 366d"),
        (["demo", "--duration=-1s"], "invalid duration '-1s'"),
        (["demo", "--duration=nan"], "invalid duration 'nan'"),
        (["demo", "--duration=inf"], "invalid duration 'inf'"),
        (["demo", "--duration=400d"], "invalid duration '400d': must be between 1s and 366d"),
        (["demo", "--duration=60"], "invalid duration '60': use whole numbers with units"),
        (
            ["simulate-cluster", "--kubeconfig-out=k", "--web.listen-address=:70000"],
            "invalid listen address ':70000': port above 65535",
        ),
        (
            ["simulate-cluster", "--kubeconfig-out=k", "--kubelet-dir=/nonexistent"],
            "not a directory: /nonexistent",
        ),
        (
            ["simulate-cluster", "--kubeconfig-out=k", "--node-scenario=demo-node"],
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
