"""Cross-check against Debian's node_exporter on the same fixture tree.

Every counter both exporters emit must agree after mapping node_exporter's names onto
ours (its data counters are already words x 4, like ours). The test names any mismatch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.exporter.render import Renderer
from fleetwatch.sim.loopback_servers import Server, http_get
from fleetwatch.sim.scenario import parse_scenario
from fleetwatch.sim.sysfs_tree import SimulatedSysfs
from fleetwatch.sim.world import SimulatedNode
from testbed.clock import FixedClock
from testbed.tool_servers import node_exporter
from tests.infiniband.fixtures import FIXTURES, make_collector

E = "fleetwatch_infiniband_port_errors_total"
# node_exporter family -> (our family, extra labels).
NODE_TO_OURS: dict[str, tuple[str, dict[str, str]]] = {
    "node_infiniband_state_id": ("fleetwatch_infiniband_port_state_id", {}),
    "node_infiniband_physical_state_id": ("fleetwatch_infiniband_port_physical_state_id", {}),
    "node_infiniband_rate_bytes_per_second": (
        "fleetwatch_infiniband_port_rate_bytes_per_second",
        {},
    ),
    "node_infiniband_port_data_received_bytes": (
        "fleetwatch_infiniband_port_data_bytes",
        {"direction": "rx"},
    ),
    "node_infiniband_port_data_transmitted_bytes": (
        "fleetwatch_infiniband_port_data_bytes",
        {"direction": "tx"},
    ),
    "node_infiniband_port_packets_received": (
        "fleetwatch_infiniband_port_packets",
        {"direction": "rx"},
    ),
    "node_infiniband_port_packets_transmitted": (
        "fleetwatch_infiniband_port_packets",
        {"direction": "tx"},
    ),
    "node_infiniband_unicast_packets_received": (
        "fleetwatch_infiniband_port_unicast_packets",
        {"direction": "rx"},
    ),
    "node_infiniband_unicast_packets_transmitted": (
        "fleetwatch_infiniband_port_unicast_packets",
        {"direction": "tx"},
    ),
    "node_infiniband_multicast_packets_received": (
        "fleetwatch_infiniband_port_multicast_packets",
        {"direction": "rx"},
    ),
    "node_infiniband_multicast_packets_transmitted": (
        "fleetwatch_infiniband_port_multicast_packets",
        {"direction": "tx"},
    ),
    "node_infiniband_port_transmit_wait": ("fleetwatch_infiniband_port_xmit_wait", {}),
    "node_infiniband_symbol_error": (E[:-6], {"error": "symbol"}),
    "node_infiniband_link_error_recovery": (E[:-6], {"error": "link_error_recovery"}),
    "node_infiniband_link_downed": (E[:-6], {"error": "link_downed"}),
    "node_infiniband_port_errors_received": (E[:-6], {"error": "rcv"}),
    "node_infiniband_port_receive_remote_physical_errors": (
        E[:-6],
        {"error": "rcv_remote_physical"},
    ),
    "node_infiniband_port_receive_switch_relay_errors": (E[:-6], {"error": "rcv_switch_relay"}),
    "node_infiniband_port_discards_transmitted": (E[:-6], {"error": "xmit_discards"}),
    "node_infiniband_port_constraint_errors_transmitted": (E[:-6], {"error": "xmit_constraint"}),
    "node_infiniband_port_constraint_errors_received": (E[:-6], {"error": "rcv_constraint"}),
    "node_infiniband_local_link_integrity_errors": (E[:-6], {"error": "local_link_integrity"}),
    "node_infiniband_excessive_buffer_overrun_errors": (
        E[:-6],
        {"error": "excessive_buffer_overrun"},
    ),
    "node_infiniband_vl15_dropped": (E[:-6], {"error": "vl15_dropped"}),
}

Key = tuple[str, tuple[tuple[str, str], ...]]
# node_exporter 1.5 fails its whole collector on a missing `rate`, a garbage state or a
# device without `counters/`; those fixtures are checked separately below.
READABLE_BY_NODE_EXPORTER = ("cx7_ndr", "roce_bond", "saturated", "einval", "no_pma")
LOST_BY_NODE_EXPORTER = ("missing_rate", "garbage", "no_counters")


def _samples(text: str) -> dict[Key, float]:
    values: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(family.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def _faulty_dgx() -> SimulatedNode:
    """A DGX-like node (names clear of the fixtures') with saturation, a flap, a down port."""
    hcas: list[dict[str, object]] = [{"device": f"mlx5_{n}"} for n in range(10, 18)]
    hcas += [{"device": "mlx5_18", "rate_gbps": 200, "link_layer": "Ethernet"}]
    faults = [
        {"at": 5, "kind": "ib_errors", "device": "mlx5_12", "port": 1, "error": "symbol",
         "per_second": 5000},
        {"at": 5, "kind": "ib_errors", "device": "mlx5_13", "port": 1, "error": "xmit_wait",
         "per_second": 1e8},
        {"at": 10, "kind": "ib_port_down", "device": "mlx5_14", "port": 1, "seconds": 5},
        {"at": 20, "kind": "ib_port_down", "device": "mlx5_15", "port": 1},
    ]  # fmt: skip
    data = {"gpus": 8, "gpu_model": "NVIDIA H100 80GB HBM3", "nvlinks_per_gpu": 18,
            "infiniband": hcas, "faults": faults}  # fmt: skip
    scenario = parse_scenario(data, source="test", name="faulty-dgx")
    return SimulatedNode(scenario=scenario, clock=FixedClock(120.0))


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixtures node_exporter can read plus a simulated DGX with faults, in one tree."""
    root = tmp_path_factory.mktemp("sysfs")
    for name in READABLE_BY_NODE_EXPORTER:
        FIXTURES[name](root)
    SimulatedSysfs(node=_faulty_dgx(), root=root).write()
    return root


@pytest.fixture(scope="module")
def node_exporter_server(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with node_exporter(
        tmp_path_factory.mktemp("node_exporter"), sysfs=tree, collectors=["infiniband"]
    ) as server:
        yield server


@pytest.mark.integration
def test_every_shared_counter_agrees(tree: Path, node_exporter_server: Server) -> None:
    theirs = _samples(http_get(node_exporter_server.url + "/metrics").decode())
    collector = make_collector(tree)
    ours = _samples(Renderer().render(collector.collect()).decode())
    collector.close()

    compared, mismatches, missing_here = 0, [], []
    for (name, labels), value in theirs.items():
        mapped = NODE_TO_OURS.get(name)
        if mapped is None:
            continue
        family, extra = mapped
        key = (family, tuple(sorted({**dict(labels), **extra}.items())))
        if key not in ours:
            missing_here.append(f"{name}{dict(labels)}")
            continue
        compared += 1
        if ours[key] != value:
            mismatches.append(f"{name}{dict(labels)}: node_exporter {value}, ours {ours[key]}")
    assert not mismatches, "\n".join(mismatches)
    assert compared > 300, f"only {compared} values compared"
    # We leave out only rates of ports that are not up (node_exporter reports leftovers).
    assert all("rate_bytes_per_second" in item for item in missing_here), missing_here
    assert ("node_scrape_collector_success", (("collector", "infiniband"),)) in theirs


@pytest.mark.integration
def test_one_bad_file_loses_nothing_else_here(tmp_path: Path) -> None:
    """Where node_exporter drops every InfiniBand series, we keep all readable values."""
    root = tmp_path / "sysfs"
    for name in (*READABLE_BY_NODE_EXPORTER[:1], *LOST_BY_NODE_EXPORTER):
        FIXTURES[name](root)
    with node_exporter(tmp_path / "ne", sysfs=root, collectors=["infiniband"]) as server:
        theirs = _samples(http_get(server.url + "/metrics").decode())
    assert theirs[("node_scrape_collector_success", (("collector", "infiniband"),))] == 0
    assert not any(name.startswith("node_infiniband_") for name, _ in theirs)
    collector = make_collector(root)
    ours = _samples(Renderer().render(collector.collect()).decode())
    collector.close()
    devices = {dict(labels).get("device") for _, labels in ours}
    assert {"mlx5_0", "mlx5_5", "mlx5_6", "hfi1_0", "irdma0"} <= devices
