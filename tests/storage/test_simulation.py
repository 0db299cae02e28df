"""Simulated checkpoint mounts: the scenario's `mounts:` and `mount_*` faults, read by the
storage collector through the exporter's simulated hardware as it reads real ones."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetwatch.catalog.storage import (
    STORAGE_FREE_BYTES,
    STORAGE_HUNG,
    STORAGE_MOUNT_INFO,
    STORAGE_PROBE_FAILURES_TOTAL,
    STORAGE_PROBE_READ_BYTES_PER_SECOND,
    STORAGE_PROBE_WRITE_BYTES_PER_SECOND,
    STORAGE_PROBES_TOTAL,
    STORAGE_READ_ONLY,
    STORAGE_SIZE_BYTES,
    STORAGE_WRITTEN_BYTES_TOTAL,
)
from fleetwatch.cli import build_parser
from fleetwatch.collectors import COLLECTORS
from fleetwatch.collectors.base import Collector
from fleetwatch.collectors.storage import SPEC
from fleetwatch.exporter.render import Renderer
from fleetwatch.exporter.settings import ExportSettings
from fleetwatch.sim.demo import story
from fleetwatch.sim.demo_session import NODE as NODE_NAME
from fleetwatch.sim.exporter_hardware import simulated_hardware
from fleetwatch.sim.scenario import ScenarioError, load_scenario, parse_scenario
from fleetwatch.sim.world import SimulatedNode, WallClock
from testbed.clock import FixedClock

MOUNT = "/checkpoints"  # also the demo scenario's mount
NODE: dict[str, Any] = {
    "gpus": 2,
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "nvlinks_per_gpu": 18,
    "infiniband": [],
    "mounts": [
        {
            "mountpoint": MOUNT,
            "server": "ckpt-nfs",
            "size_bytes": 1e12,
            "free_bytes": 5e11,
            "write_bytes_per_second": 1e9,
            "checkpoint_every_seconds": 60,
            "checkpoint_seconds": 20,
        }
    ],
}


def node_at(t: float, faults: list[dict[str, Any]] | None = None) -> SimulatedNode:
    scenario = parse_scenario({**NODE, "faults": faults or []}, source="t.yaml", name="t")
    return SimulatedNode(scenario=scenario, clock=FixedClock(t))


def test_saves_write_at_the_mounts_rate_in_bursts() -> None:
    assert node_at(10).mount_written(MOUNT)[0] == 10e9
    assert node_at(30).mount_written(MOUNT)[0] == 20e9  # the save ended at 20 s
    assert node_at(70).mount_written(MOUNT)[0] == 30e9  # the next started at 60 s
    _, rtt_ms = node_at(10).mount_written(MOUNT)
    assert rtt_ms == pytest.approx(10e9 / (1 << 20) * 2.0)


def test_faults_slow_stop_and_fill_the_mount() -> None:
    slow = [{"at": 10, "kind": "mount_slow", "mountpoint": MOUNT, "factor": 4, "seconds": 30}]
    written, rtt_ms = node_at(70, slow).mount_written(MOUNT)
    assert written == 10e9 + 10e9 / 4 + 10e9  # a quarter of the rate from 10 s to 20 s
    assert rtt_ms / (written / (1 << 20)) > 2.0  # the slow WRITEs took longer each
    hung = [{"at": 5, "kind": "mount_hung", "mountpoint": MOUNT, "seconds": 60}]
    assert node_at(70, hung).mount_written(MOUNT)[0] == 5e9 + 5e9  # nothing from 5 s to 65 s
    assert node_at(30, hung).mount_hang_remaining(MOUNT) == 35.0
    read_only = [{"at": 0, "kind": "mount_read_only", "mountpoint": MOUNT}]
    assert node_at(70, read_only).mount_written(MOUNT)[0] == 0
    assert node_at(70, read_only).mount_read_only(MOUNT)
    filling = [{"at": 10, "kind": "mount_filling", "mountpoint": MOUNT, "bytes_per_second": 1e10}]
    assert node_at(20, filling).mount_free_bytes(MOUNT) == 5e11 - 1e11
    assert node_at(1000, filling).mount_free_bytes(MOUNT) == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mounts": [{"mountpoint": "ckpt"}]}, r"mounts\[0\]\.mountpoint: 'ckpt' is not a"),
        ({"mounts": [{"mountpoint": "/a"}, {"mountpoint": "/a"}]}, r"mounts\[1\]\.mountpoint"),
        ({"mounts": [{"mountpoint": "/a", "size": 1}]}, r"mounts\[0\]\.size: unknown key"),
        (
            {"mounts": [{"mountpoint": "/a", "size_bytes": 10, "free_bytes": 20}]},
            r"mounts\[0\]\.free_bytes: more than size_bytes",
        ),
        (
            {"mounts": [{"mountpoint": "/a", "checkpoint_seconds": 200}]},
            r"mounts\[0\]\.checkpoint_seconds: a save must end",
        ),
        (
            {"faults": [{"at": 1, "kind": "mount_hung", "mountpoint": "/elsewhere"}]},
            r"faults\[0\]\.mountpoint: '/elsewhere' is not one of /checkpoints",
        ),
    ],
)
def test_malformed_mounts_name_the_key(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=rf"^t\.yaml: {message}"):
        parse_scenario({**NODE, **change}, source="t.yaml", name="t")


def scrape(collector: Collector) -> dict[tuple[str, str], float]:
    """(family, mountpoint) -> value of the collector's mount series now."""
    values: dict[tuple[str, str], float] = {}
    for line in Renderer().render(collector.collect()).decode().splitlines():
        if line.startswith("#") or 'mountpoint="' not in line:
            continue
        name = line.split("{", 1)[0]
        point = line.split('mountpoint="', 1)[1].split('"', 1)[0]
        values[(name, point)] = float(line.rsplit(" ", 1)[1])
    return values


class Simulated:
    """The storage collector on a scenario file's simulated hardware."""

    def __init__(self, node: SimulatedNode, root: Path, scenario: Path, *flags: str) -> None:
        args = build_parser().parse_args(["export", f"--simulate={scenario}", *flags])
        hardware = simulated_hardware(node, root, ExportSettings.from_args(args, COLLECTORS))
        assert hardware.refresh is not None
        self.refresh = hardware.refresh
        self.collector = SPEC.create(hardware.context, hardware.settings.collectors["storage"])

    def wait_for(
        self, family: str, value: float, point: str = MOUNT
    ) -> dict[tuple[str, str], float]:
        """Refresh and collect until `point`'s `family` reads `value` (fail after 20 s)."""
        deadline = time.monotonic() + 20.0
        while True:
            self.refresh()
            values = scrape(self.collector)
            if values.get((family, point)) == value:
                return values
            assert time.monotonic() < deadline, f"{family} never read {value}: {values}"
            time.sleep(0.05)


def write_scenario(path: Path, faults: list[dict[str, Any]]) -> SimulatedNode:
    path.write_text(yaml.safe_dump({**NODE, "faults": faults}))
    return SimulatedNode(scenario=load_scenario(str(path)), clock=WallClock())


def test_the_collector_reads_a_simulated_mount(tmp_path: Path) -> None:
    scenario = tmp_path / "ro.yaml"
    node = write_scenario(scenario, [{"at": 0, "kind": "mount_read_only", "mountpoint": MOUNT}])
    # A real mount named on the command line stays the real one beside the simulated.
    sim = Simulated(node, tmp_path / "sysfs", scenario, "--collector.storage.mounts=/")
    try:
        root = os.statvfs("/")
        sim.wait_for(STORAGE_SIZE_BYTES.name, root.f_blocks * root.f_frsize, "/")
        values = sim.wait_for(STORAGE_SIZE_BYTES.name, 1e12)
        text = Renderer().render(sim.collector.collect()).decode()
    finally:
        sim.collector.close()
    assert values[(STORAGE_FREE_BYTES.name, MOUNT)] == 5e11
    assert (
        values[(STORAGE_SIZE_BYTES.name, "/")]
        == os.statvfs("/").f_blocks * os.statvfs("/").f_frsize
    )
    assert values[(STORAGE_READ_ONLY.name, MOUNT)] == 1
    assert values[(STORAGE_HUNG.name, MOUNT)] == 0
    assert values[(STORAGE_WRITTEN_BYTES_TOTAL.name, MOUNT)] == 0  # read-only from the start
    labels = f'device="ckpt-nfs:/export/checkpoints",fstype="nfs4",mountpoint="{MOUNT}"'
    assert f'{STORAGE_MOUNT_INFO.name}{{{labels},server="ckpt-nfs"}} 1.0' in text


def test_a_probe_directory_on_a_simulated_mount_is_probed_by_the_node(tmp_path: Path) -> None:
    scenario = tmp_path / "probe.yaml"
    slow = {"at": 0, "kind": "mount_slow", "mountpoint": MOUNT, "factor": 4}
    node = write_scenario(scenario, [slow])
    flags = (
        f"--collector.storage.probe-dir={MOUNT}/.fleetwatch",
        "--collector.storage.probe-bytes=1048576",
    )
    sim = Simulated(node, tmp_path / "sysfs", scenario, *flags)
    try:
        values = sim.wait_for(STORAGE_PROBES_TOTAL.name, 1)
    finally:
        sim.collector.close()
    # 1 MiB at 1e9 bytes/s and a 2 ms round trip, everything 4 times slower.
    transfer, round_trip = (1 << 20) / 1e9 * 4, 0.002 * 4
    assert values[(STORAGE_PROBE_WRITE_BYTES_PER_SECOND.name, MOUNT)] == pytest.approx(
        (1 << 20) / (transfer + round_trip)
    )
    assert values[(STORAGE_PROBE_READ_BYTES_PER_SECOND.name, MOUNT)] == pytest.approx(
        (1 << 20) / transfer
    )


def test_a_probe_on_a_read_only_simulated_mount_fails_read_only(tmp_path: Path) -> None:
    scenario = tmp_path / "probe-ro.yaml"
    node = write_scenario(scenario, [{"at": 0, "kind": "mount_read_only", "mountpoint": MOUNT}])
    sim = Simulated(node, tmp_path / "sysfs", scenario, f"--collector.storage.probe-dir={MOUNT}/fw")
    try:
        values = sim.wait_for(STORAGE_PROBE_FAILURES_TOTAL.name, 1)
        text = Renderer().render(sim.collector.collect()).decode()
    finally:
        sim.collector.close()
    assert values[(STORAGE_PROBES_TOTAL.name, MOUNT)] == 0
    assert (
        f'{STORAGE_PROBE_FAILURES_TOTAL.name}{{mountpoint="{MOUNT}",reason="read_only"}} 1.0'
        in text
    )


def test_writes_move_then_a_hung_mount_goes_hung_after_the_deadline(tmp_path: Path) -> None:
    scenario = tmp_path / "hung.yaml"
    node = write_scenario(scenario, [{"at": 1.5, "kind": "mount_hung", "mountpoint": MOUNT}])
    sim = Simulated(node, tmp_path / "sysfs", scenario, "--collector.storage.hung-timeout=500ms")
    try:
        written = sim.wait_for(STORAGE_HUNG.name, 0)[(STORAGE_WRITTEN_BYTES_TOTAL.name, MOUNT)]
        later = sim.wait_for(STORAGE_HUNG.name, 0)[(STORAGE_WRITTEN_BYTES_TOTAL.name, MOUNT)]
        values = sim.wait_for(STORAGE_HUNG.name, 1)
        assert node.now() >= 2.0  # hung only once a call blocked past the deadline
    finally:
        node.release_hangs()
        sim.collector.close()
    assert 0 < written <= later <= 1.5e9
    assert (STORAGE_FREE_BYTES.name, MOUNT) not in values  # its statvfs never answered


def test_the_demo_tells_its_checkpoint_mount_hanging_and_the_mount_goes_hung(
    tmp_path: Path,
) -> None:
    demo = load_scenario("demo")
    text = "\n".join(story(demo, tmp_path))
    assert "  Mount /checkpoints (nfs4 from ckpt-nfs): a checkpoint save every 60s" in text
    line = next(line for line in text.splitlines() if "checkpoint mount hung" in line)
    assert line.startswith(
        f"  t=240s  checkpoint mount hung on {NODE_NAME}: CheckpointMountHung → the tainter "
        "takes the node out (/checkpoints blocks every call for 300s"
    )
    node = SimulatedNode(scenario=demo, clock=FixedClock(250))
    sim = Simulated(
        node, tmp_path / "sysfs", Path("demo"), "--collector.storage.hung-timeout=500ms"
    )
    try:
        values = sim.wait_for(STORAGE_HUNG.name, 1)
    finally:
        node.release_hangs()
        sim.collector.close()
    assert values[(STORAGE_READ_ONLY.name, "/checkpoints")] == 0
    before = SimulatedNode(scenario=demo, clock=FixedClock(230))
    assert before.mount_hang_remaining("/checkpoints") == 0  # the GPU story is told by then


def test_every_mount_fault_tells_its_story(tmp_path: Path) -> None:
    faults = [
        {"at": 10, "kind": "mount_slow", "mountpoint": MOUNT, "factor": 8, "seconds": 60},
        {"at": 20, "kind": "mount_read_only", "mountpoint": MOUNT},
        {"at": 30, "kind": "mount_filling", "mountpoint": MOUNT, "bytes_per_second": 1e9},
    ]
    scenario = parse_scenario({**NODE, "faults": faults}, source="t.yaml", name="t")
    lines = story(scenario, tmp_path)
    assert "  t=10s   checkpoint mount /checkpoints writes 8 times slower for 60s: this node " in (
        "\n".join(lines)
    )
    assert any(
        line.startswith("  t=20s   checkpoint mount /checkpoints turns read-only: ")
        and "CheckpointMountReadOnly" in line
        for line in lines
    )
    assert any(
        line.startswith("  t=30s   checkpoint mount /checkpoints fills by 1000 MB/s: ")
        and line.endswith("CheckpointStorageFillingUp")
        for line in lines
    )
