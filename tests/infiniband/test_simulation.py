"""The simulated DGX tree and fake tools: golden exposition, in-place updates, faults."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetwatch.exporter.render import Renderer
from fleetwatch.sim import tool_dir
from fleetwatch.sim.scenario import load_scenario, parse_scenario
from fleetwatch.sim.sysfs_tree import SimulatedSysfs
from fleetwatch.sim.world import SimulatedNode
from tests.golden import assert_golden
from tests.infiniband.fixtures import make_collector

SIM_BIN = str(tool_dir())


class StepClock:
    """Simulated time that the test moves."""

    def __init__(self, at: float) -> None:
        self.at = at

    def elapsed(self) -> float:
        return self.at


def _node(faults: list[dict[str, object]], clock: StepClock) -> SimulatedNode:
    data = {
        "gpus": 2,
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "nvlinks_per_gpu": 18,
        "infiniband": [{"device": "mlx5_0"}, {"device": "mlx5_1"}],
        "faults": faults,
    }
    return SimulatedNode(scenario=parse_scenario(data, source="test", name="test"), clock=clock)


def _value(text: str, prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {prefix!r} in:\n{text}")


def test_dgx_h100_tree_matches_golden(tmp_path: Path) -> None:
    node = SimulatedNode(scenario=load_scenario("dgx-h100"), clock=StepClock(600.0))
    SimulatedSysfs(node=node, root=tmp_path).write()
    collector = make_collector(tmp_path, tool_path=SIM_BIN)
    text = Renderer().render(collector.collect()).decode()
    collector.close()
    assert_golden("infiniband/dgx-h100.prom", text)
    # GPU↔HCA rails: HCA i shares a PCIe switch with GPU i; storage HCAs with none.
    assert 'device="mlx5_3",firmware_version="28.39.1002",gpus="3"' in text
    assert 'gpus="",hca_type="MT4129",link_layer="Ethernet"' in text


def test_counters_update_in_place_under_open_descriptors(tmp_path: Path) -> None:
    clock = StepClock(10.0)
    tree = SimulatedSysfs(node=_node([], clock), root=tmp_path)
    tree.write()
    data_file = tmp_path / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data"
    inode = data_file.stat().st_ino
    collector = make_collector(tmp_path)
    prefix = 'fleetwatch_infiniband_port_data_bytes_total{device="mlx5_0",direction="tx",port="1"}'
    before = _value(Renderer().render(collector.collect()).decode(), prefix)
    clock.at = 20.0
    tree.write()
    after = _value(Renderer().render(collector.collect()).decode(), prefix)
    assert data_file.stat().st_ino == inode
    # 400 Gb/s at 35% load for 10 s.
    assert after - before == pytest.approx(400e9 / 8 * 0.35 * 10, rel=1e-6)
    collector.close()
    tree.close()


def test_saturated_errors_come_from_perfquery_extended(tmp_path: Path) -> None:
    clock = StepClock(100.0)
    faults = [{"at": 0, "kind": "ib_errors", "device": "mlx5_1", "port": 1,
               "error": "symbol", "per_second": 1000}]  # fmt: skip
    tree = SimulatedSysfs(node=_node(faults, clock), root=tmp_path)
    tree.write()
    symbol = 'fleetwatch_infiniband_port_errors_total{device="mlx5_1",error="symbol",port="1"}'
    pinned = 'error_saturated{device="mlx5_1",error="symbol",port="1"}'

    alone = make_collector(tmp_path)
    text = Renderer().render(alone.collect()).decode()
    assert _value(text, symbol) == 65535
    assert _value(text, "fleetwatch_infiniband_port_" + pinned) == 1

    now = StepClock(0.0)
    with_tools = make_collector(tmp_path, tool_path=SIM_BIN, monotonic=now.elapsed)
    text = Renderer().render(with_tools.collect()).decode()
    assert _value(text, symbol) == 100_000
    assert _value(text, "fleetwatch_infiniband_port_" + pinned) == 0
    # sysfs stays pinned while the 64-bit counter moves on; perfquery runs again only
    # once its interval (30 s by default) has passed, not every cycle.
    clock.at = 200.0
    tree.write()
    now.at = 10.0
    assert _value(Renderer().render(with_tools.collect()).decode(), symbol) == 100_000
    now.at = 30.0
    assert _value(Renderer().render(with_tools.collect()).decode(), symbol) == 200_000
    alone.close()
    with_tools.close()
    tree.close()


def test_flap_shorter_than_an_interval_counts_two_transitions(tmp_path: Path) -> None:
    clock = StepClock(5.0)
    faults = [{"at": 10, "kind": "ib_port_down", "device": "mlx5_0", "port": 1, "seconds": 2},
              {"at": 30, "kind": "ib_port_down", "device": "mlx5_1", "port": 1}]  # fmt: skip
    tree = SimulatedSysfs(node=_node(faults, clock), root=tmp_path)
    tree.write()
    collector = make_collector(tmp_path)
    changes = "fleetwatch_infiniband_port_state_changes_total{device="
    assert _value(Renderer().render(collector.collect()).decode(), changes + '"mlx5_0"') == 0
    clock.at = 20.0  # mlx5_0 went down at 10 and came back at 12: never seen down.
    tree.write()
    assert _value(Renderer().render(collector.collect()).decode(), changes + '"mlx5_0"') == 2
    clock.at = 40.0  # mlx5_1 went down at 30 and stays down.
    tree.write()
    text = Renderer().render(collector.collect()).decode()
    assert _value(text, changes + '"mlx5_1"') == 1
    assert _value(text, 'fleetwatch_infiniband_port_up{device="mlx5_1"') == 0
    assert 'rate_bytes_per_second{device="mlx5_1"' not in text
    collector.close()
    tree.close()


def test_fake_tools_agree_with_the_tree(tmp_path: Path) -> None:
    node = SimulatedNode(scenario=load_scenario("dgx-h100"), clock=StepClock(60.0))
    SimulatedSysfs(node=node, root=tmp_path).write()
    collector = make_collector(tmp_path, tool_path=SIM_BIN)
    collector.collect()
    tools = collector.tools
    assert tools is not None
    cas, error = tools.ibstat()
    assert error is None
    assert [ca.name for ca in cas][:3] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert cas[0].ports[0].rate_gbps == 400
    counters = tools.perfquery_extended("mlx5_0", 1)
    words = int((tmp_path / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data").read_text())
    assert counters.values["PortXmitData"] == words
    assert counters.has_64bit_errors
    assert os.access(Path(SIM_BIN) / "ibstat", os.X_OK)
    collector.close()
