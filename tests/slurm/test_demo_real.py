"""`fleetwatch demo --orchestrator=slurm` end to end on this machine's real Slurm: the demo's
own output tells the story the end-to-end test proves (gpu01 drained with fleetwatch's
reason while it overheats, `srun -w gpu01` refused, then resumed and running jobs again; the
admin's drain on gpu02 never changed), and Ctrl-C stops every process it started."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleetwatch.sim.demo_slurm import missing
from fleetwatch.sim.loopback_servers import wait_until

pytestmark = pytest.mark.integration

OURS = "fleetwatch:gpu-overheat GPUOverheating"
TOLD = "the admin's drain on gpu02:"  # the demo's last line of the story
LINE = re.compile(r"^\[t= *\d+s\] ([^:]+): (.*)$", re.M)


def running_under(folder: str) -> list[str]:
    """The command lines of the processes that name `folder` (the demo's daemons do)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:  # the process ended while we looked
            continue
        text = " ".join(word.decode(errors="replace") for word in words)
        if folder in text:
            found.append(text)
    return found


def test_the_slurm_demo_drains_gpu01_leaves_the_admins_gpu02_and_resumes(tmp_path: Path) -> None:
    problems = missing()
    if problems:
        pytest.skip("no real Slurm demo: " + "; ".join(problems))
    out = tmp_path / "demo.out"
    with out.open("wb") as sink:
        demo = subprocess.Popen(
            [sys.executable, "-m", "fleetwatch", "demo", "--orchestrator=slurm", "--duration=10m"],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: TOLD in out.read_text() or demo.poll() is not None,
            timeout=300,
            interval=0.5,
            what="the Slurm demo's story told",
        )
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            code = demo.wait(timeout=90)
        except subprocess.TimeoutExpired:
            demo.kill()
            raise
    text = out.read_text()
    assert code == 0, text
    said: dict[str, list[str]] = {}
    for key, value in LINE.findall(text):
        said.setdefault(key, []).append(value)
    assert "GPUOverheating" in said["firing alerts"], text
    hot = said["gpu01"]
    assert hot[0] == "IDLE", text
    drained = [value for value in hot if "DRAIN" in value]
    assert len(drained) == 1, text
    assert drained[0].startswith(f"IDLE+DRAIN, reason '{OURS} ["), text
    # Resumed, no reason left (IDLE+NOT_RESPONDING until slurmctld's next ping of it).
    assert hot[-1].split("+")[0] == "IDLE", text
    assert "DRAIN" not in hot[-1], text
    assert "reason" not in hot[-1], text
    srun = said["srun -w gpu01 true"]
    assert srun[0] == "ran", text
    assert srun[-1] == "ran", text
    assert any(value.startswith("refused (") for value in srun), text
    spare = said["gpu02"]
    assert len(spare) == 1, text  # never changed while the demo watched
    assert spare[0].startswith("IDLE+DRAIN, reason 'admin: fan check ["), text
    assert said["GPUOverheating for gpu02"] == ["posted to Alertmanager; its drain is the admin's"]
    assert said["the admin's drain on gpu02"] == ["untouched, its reason as the admin wrote it"]
    assert "stopping every process the demo started" in text
    workdir = re.search(r"^Logs: (\S+)\. Press Ctrl-C", text, re.M)
    assert workdir is not None, text
    assert not Path(workdir.group(1)).exists(), "the demo removes its temporary folder"
    assert running_under(workdir.group(1)) == []
