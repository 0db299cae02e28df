"""End to end with real servers: a simulated exporter whose GPU 3 heats past GPUOverheating's
threshold (`fleetwatch.sim.overheat`), real Prometheus with the repo's rules, real Alertmanager
with the shipped taint route, the tainter and a simulated cluster, all as real processes on
loopback.

The node gets `fleetwatch.io/gpu-overheat`; when the scenario cools the GPU the taint is
removed after the hold time, on Prometheus' positive evidence. Only the rule's
`keep_firing_for` (2m, against flapping) is shortened in the test's copy of the rules, so
the test does not wait minutes for the resolve.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from fleetwatch.sim.loopback_servers import wait_until
from fleetwatch.sim.overheat import start_overheat_stack
from fleetwatch.sim.stack import Stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with contextlib.ExitStack() as servers:
        yield start_overheat_stack(
            tmp_path_factory.mktemp("e2e"), servers, interval="1s", hold="3s"
        )


def test_overheating_gpu_taints_node_then_cooling_untaints_it(stack: Stack) -> None:
    wait_until(
        lambda: "fleetwatch.io/gpu-overheat" in stack.taint_keys(),
        timeout=60,
        interval=0.25,
        what="the gpu-overheat taint on the node",
    )
    node = stack.node()
    taint = next(t for t in node["spec"]["taints"] if t["key"] == "fleetwatch.io/gpu-overheat")
    assert (taint["value"], taint["effect"]) == ("GPUOverheating", "NoSchedule")
    assert node["metadata"]["labels"]["fleetwatch.io/tainted"] == "true"
    assert "unschedulable" not in node["spec"]

    wait_until(
        lambda: stack.taint_keys() == [],
        timeout=90,
        interval=0.5,
        what="the taint to be removed after the GPU cooled",
    )
    assert stack.tainter is not None
    log = stack.tainter.log()
    assert "taint added" in log
    assert "taint removed" in log
