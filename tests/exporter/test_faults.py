"""Fault injection through the simulator, on a real `fleetwatch export` process.

A GPU falls off the bus, then NVML's field-value call hangs like a wedged driver. The
exporter must keep answering, keep the other GPUs and collectors intact, report the hung
collector with its reason, never stack a second call behind the hung one, and fail
/healthz once the hang outlasts the configured time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from fleetwatch.sim import servers

SCENARIO = {
    "gpus": 8,
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "nvlinks_per_gpu": 4,
    "infiniband": [{"device": "mlx5_0", "ports": 1, "rate_gbps": 400}],
    "faults": [
        {"at": 3, "kind": "xid", "gpu": 6, "xid": 79},
        {"at": 3, "kind": "gpu_lost", "gpu": 6},
        {"at": 8, "kind": "hang", "call": "nvmlDeviceGetFieldValues", "seconds": 600},
    ],
}


def sample(text: str, prefix: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Server]:
    workdir = tmp_path_factory.mktemp("faults")
    scenario = workdir / "faults.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    args = ["--collector.interval=1s", "--collector.hang-timeout=4s"]
    with servers.fleetwatch_export(workdir / "run", simulate=str(scenario), args=args) as server:
        yield server


def metrics(server: servers.Server) -> str:
    # A 2 s client timeout: a scrape must never wait on a collector.
    return servers.http_get(server.url + "/metrics", timeout=2).decode()


def metrics_when(server: servers.Server, series: str, check: Callable[[float], bool]) -> str:
    """Poll /metrics until the value of `series` passes `check`; return that exposition."""

    def probe() -> str | None:
        text = metrics(server)
        value = sample(text, series)
        return text if value is not None and check(value) else None

    return servers.wait_until(probe, timeout=30, what=f"{series} to change")


@pytest.mark.integration
def test_lost_gpu_then_hang(exporter: servers.Server) -> None:
    # The lost GPU disappears from the count and its series go; the others stay.
    text = metrics_when(exporter, "fleetwatch_gpus_visible", lambda v: v == 7)
    assert 'fleetwatch_gpu_temperature_celsius{gpu="6"' not in text
    assert 'fleetwatch_gpu_temperature_celsius{gpu="0"' in text
    servers.wait_until(
        lambda: 'fleetwatch_gpu_xid_errors_total{gpu="6"' in metrics(exporter),
        timeout=30,
        what="the lost GPU's Xid counter to stay visible",
    )
    assert re.search(
        r'fleetwatch_gpu_xid_errors_total\{gpu="6",[^}]*xid="79"\} 1.0', metrics(exporter)
    )

    # The hang: the gpu collector goes down with its reason, and is never stacked.
    metrics_when(exporter, 'fleetwatch_collector_up{collector="gpu"}', lambda v: v == 0)
    text = metrics_when(
        exporter, 'fleetwatch_collector_skipped_runs_total{collector="gpu"}', lambda v: v >= 2
    )
    # Other collectors are intact.
    assert sample(text, 'fleetwatch_collector_up{collector="infiniband"}') == 1.0
    assert 'fleetwatch_infiniband_port_up{device="mlx5_0",port="1"} 1.0' in text

    # Liveness fails once the hang outlasts --collector.hang-timeout, and the metric says
    # hung from then on (one definition for both).
    servers.wait_until(
        lambda: servers.http_status(exporter.url + "/healthz") == 503,
        timeout=30,
        what="/healthz to fail",
    )
    assert sample(metrics(exporter), 'fleetwatch_collector_hung{collector="gpu"}') == 1.0
    assert servers.http_status(exporter.url + "/readyz") == 200

    # The log names the collector and the reason, and shows no second call started.
    records = [json.loads(line) for line in exporter.log().splitlines() if line.startswith("{")]
    failures = [
        r for r in records if r.get("collector") == "gpu" and r["msg"] == "collector failed"
    ]
    assert failures, "no 'collector failed' log line for gpu"
    assert any("deadline" in r["reason"] for r in failures)
    assert any(r["msg"] == "collector still blocked, not starting another run" for r in records)


@pytest.mark.integration
def test_missing_driver_uses_real_pynvml(tmp_path: Path) -> None:
    """Without --simulate the real pynvml runs; this machine has no NVIDIA driver."""
    sysfs = tmp_path / "sys"
    (sysfs / "class").mkdir(parents=True)
    with servers.fleetwatch_command(
        tmp_path, command="export", args=[f"--path.sysfs={sysfs}"], ready_path="/readyz"
    ) as server:
        text = metrics(server)
        assert sample(text, 'fleetwatch_collector_up{collector="gpu"}') == 1.0
        assert sample(text, 'fleetwatch_collector_up{collector="infiniband"}') == 1.0
        assert "fleetwatch_gpu_temperature_celsius" not in text
        log = server.log()
    driver_lines = [line for line in log.splitlines() if "no NVIDIA driver" in line]
    assert len(driver_lines) == 1, log
