"""Cost of DRA attribution's ResourceSlice watch on a node with 8 GPUs and 56 MIG devices.

A real kube-apiserver (KUBEBUILDER_ASSETS, as the tests use) holds the slices NVIDIA's DRA
driver publishes for one node: one slice of 8 GPUs, one of 56 MIG devices (7 per GPU), a
ComputeDomain channel slice, and the same again for 49 other nodes, which the field
selector must keep out. The watcher lists and watches them as the exporter does. Printed:
the first list's time, the Python heap the watcher holds after it (tracemalloc), the
events it receives while nothing changes, and the events it receives while the driver
republishes this node's MIG slice and another node's `--changes` times each (a health or
MIG layout change): only this node's arrive.

Run: KUBEBUILDER_ASSETS=... .venv/bin/python bench/bench_resourceslices.py [--idle 60]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetwatch.collectors.sources.resourceslices import KubeAccess, ResourceSliceWatcher
from fleetwatch.sim.kubelet import resource_slice
from fleetwatch.sim.scenario import load_scenario
from testbed.kube_apiserver import api_server

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PROFILES = ("1g.10gb",) * 7


def mig_slice(node: str, generation: int) -> dict[str, Any]:
    devices = [
        {
            "name": f"gpu-{gpu}-mig-{index}",
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": f"MIG-{node}-{gpu}-{index}-{generation}"},
                "parentUUID": {"string": f"GPU-{node}-{gpu}"},
                "profile": {"string": profile},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
            },
        }
        for gpu in range(8)
        for index, profile in enumerate(PROFILES)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-mig"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": f"{node}-mig", "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle", type=float, default=60.0, help="seconds watched unchanged")
    parser.add_argument("--changes", type=int, default=60, help="republishes of the MIG slice")
    args = parser.parse_args()
    scenario = load_scenario("dgx-h100")
    with tempfile.TemporaryDirectory() as folder, api_server(Path(folder)) as server:
        for n in range(50):
            node = f"gpu-node-{n}"
            gpus = [f"GPU-{node}-{gpu}" for gpu in range(8)]
            server.call("POST", SLICES, resource_slice(scenario, node, gpus))
            server.call("POST", SLICES, mig_slice(node, 1))
        access = KubeAccess.from_kubeconfig(server.kubeconfig())
        tracemalloc.start()
        before, _ = tracemalloc.get_traced_memory()
        watcher = ResourceSliceWatcher(access=access, node="gpu-node-0", mode="on")
        started = time.perf_counter()
        watcher.start()
        while not watcher.synced:
            time.sleep(0.001)
        listed = time.perf_counter() - started
        devices = watcher.devices()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        print(f"devices held: {len(devices)} (of 50 nodes' {50 * 64})")
        print(f"first list: {listed * 1000:.1f} ms")
        print(f"heap held after the list (watcher, its thread, its slices): {held / 1024:.1f} KiB")
        time.sleep(args.idle)
        print(f"events while unchanged for {args.idle:.0f} s: {watcher.events}")
        base_events = watcher.events
        started = time.perf_counter()
        for generation in range(2, args.changes + 2):
            server.call("PUT", f"{SLICES}/gpu-node-0-mig", with_version(server, generation))
            server.call("PUT", f"{SLICES}/gpu-node-1-mig", with_version(server, generation, 1))
        deadline = time.monotonic() + 30
        while watcher.events - base_events < args.changes and time.monotonic() < deadline:
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
        received = watcher.events - base_events
        print(
            f"republishes of this node's MIG slice: {args.changes} (and {args.changes} of "
            f"another node's): events received {received}, in {elapsed:.2f} s"
        )
        _, peak = tracemalloc.get_traced_memory()
        print(f"heap peak while watching (whole process): {peak / 1024:.0f} KiB")
        watcher.close()


def with_version(server: Any, generation: int, node: int = 0) -> dict[str, Any]:
    name = f"gpu-node-{node}"
    current = server.call("GET", f"{SLICES}/{name}-mig")
    obj = mig_slice(name, generation)
    obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    return obj


if __name__ == "__main__":
    main()
