"""The real exporter through the real pynvml against NVIDIA's mock NVML.

Where the simulation's fake NVML answers in Python, the mock is a C library with real
structs and return codes: these tests check that every GPU family comes out of the NVML
paths on an H100 and a GB200 profile, and that faults injected into a running exporter
(fabric registration states, a hot GPU, a lost GPU, an Xid, a GPU switching MIG mode) show in
/metrics as the metric contract says. Skipped, saying why, where FLEETWATCH_NVML_MOCK names no mock
(CONTRIBUTING.md: how to build it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from fleetwatch.sim.loopback_servers import wait_until
from testbed.nvmlmock import MissingNvmlMock, MockedExporter, NvmlMock, exporter_on_mock

# Exporter processes on NVIDIA's library, like tests/faults/test_nvml_error_codes.py: not the
# fast lane's.
pytestmark = pytest.mark.integration

GPUS = {str(index) for index in range(8)}
# One sample per GPU (with these labels) on every profile: what the GPU collectors read.
PER_GPU = {
    "fleetwatch_gpu_info": {},
    "fleetwatch_gpu_temperature_celsius": {"sensor": "gpu"},
    "fleetwatch_gpu_temperature_margin_celsius": {},
    "fleetwatch_gpu_power_watts": {},
    "fleetwatch_gpu_energy_joules_total": {},
    "fleetwatch_gpu_clock_hertz": {"clock": "sm"},
    "fleetwatch_gpu_memory_used_bytes": {},
    "fleetwatch_gpu_memory_total_bytes": {},
    "fleetwatch_gpu_ecc_errors_total": {"severity": "uncorrected"},
    "fleetwatch_gpu_remapped_rows": {"cause": "uncorrectable"},
    "fleetwatch_gpu_clock_event_active": {"reason": "hw_thermal_slowdown"},
    "fleetwatch_gpu_tensor_active_ratio": {"pipe": "any"},
    "fleetwatch_nvlink_up": {"link": "0"},
    "fleetwatch_gpu_fabric_info": {},
    "fleetwatch_gpu_fabric_state_id": {},
    "fleetwatch_gpu_fabric_degraded": {},
}
# NVML's fabric registration states (nvmlGpuFabricState_t), as the mock's overrides name
# them, and the value fleetwatch_gpu_fabric_state_id carries for each.
FABRIC_STATES = {
    "not_started": pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
    "in_progress": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    "completed": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
}
TIMEOUT = 15  # the mock re-reads overrides every second; the exporter collects every second


@pytest.fixture(scope="module")
def mock() -> NvmlMock:
    try:
        return NvmlMock.from_environment()
    except MissingNvmlMock as exc:
        pytest.skip(str(exc))


@pytest.fixture(params=["h100", "gb200"])
def exporter(
    request: pytest.FixtureRequest, mock: NvmlMock, tmp_path: Path
) -> Iterator[MockedExporter]:
    with exporter_on_mock(tmp_path, mock=mock, profile=request.param) as running:
        yield running


def _collectors_healthy(exporter: MockedExporter) -> dict[str, float]:
    """Each NVML collector's `up` (the mock runs no InfiniBand or PodResources)."""
    up = {
        labels["collector"]: value for labels, value in exporter.series("fleetwatch_collector_up")
    }
    assert set(up) == {"gpu", "gpm", "mig", "nvlink", "xid"}
    return up


def _missing(exporter: MockedExporter) -> dict[str, list[str]]:
    """PER_GPU families that lack a GPU now, with the GPUs they lack."""
    missing = {
        name: sorted(GPUS - set(exporter.by_gpu(name, **matchers)))
        for name, matchers in PER_GPU.items()
    }
    return {name: gpus for name, gpus in missing.items() if gpus}


def test_every_gpu_family_comes_out(exporter: MockedExporter) -> None:
    # Activity ratios (GPM) need two cycles' samples: the first /metrics may lack them.
    try:
        wait_until(lambda: not _missing(exporter), timeout=TIMEOUT, what="every GPU family")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; missing {_missing(exporter)}") from exc
    assert exporter.by_gpu("fleetwatch_gpu_fabric_state_id") == dict.fromkeys(
        GPUS, float(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)
    )
    assert set(exporter.by_gpu("fleetwatch_gpu_fabric_degraded").values()) == {0.0}
    assert all(value > 0 for value in exporter.by_gpu("fleetwatch_gpu_power_watts").values())
    assert _collectors_healthy(exporter) == dict.fromkeys(
        ("gpu", "gpm", "mig", "nvlink", "xid"), 1.0
    )
    assert exporter.series("fleetwatch_gpu_nvml_errors_total") == []
    assert exporter.series("fleetwatch_nvlink_nvml_errors_total") == []


def _wait_for_fabric_state(exporter: MockedExporter, gpu: str, value: int) -> None:
    wait_until(
        lambda: exporter.by_gpu("fleetwatch_gpu_fabric_state_id").get(gpu) == value,
        timeout=TIMEOUT,
        what=f"GPU {gpu}'s fabric state {value}",
    )


def test_fabric_state_follows_the_driver(exporter: MockedExporter) -> None:
    for state, value in FABRIC_STATES.items():
        exporter.override(gpus={2: {"fabric": {"state": state}}})
        _wait_for_fabric_state(exporter, "2", value)
        others = exporter.by_gpu("fleetwatch_gpu_fabric_state_id")
        assert {gpu: v for gpu, v in others.items() if gpu != "2"} == dict.fromkeys(
            GPUS - {"2"}, float(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)
        )
        assert "2" in exporter.by_gpu("fleetwatch_gpu_fabric_info")
    exporter.override(
        gpus={2: {"fabric": {"state": "completed", "health": {"degraded_bandwidth": True}}}}
    )
    wait_until(
        lambda: exporter.by_gpu("fleetwatch_gpu_fabric_degraded").get("2") == 1,
        timeout=TIMEOUT,
        what="GPU 2's fabric degraded (bandwidth)",
    )
    assert set(exporter.by_gpu("fleetwatch_gpu_fabric_degraded").values()) == {0.0, 1.0}
    # A GPU outside any NVLink domain: its fabric series go (and are not asked for again).
    exporter.override(gpus={2: {"fabric": {"state": "not_supported"}}})
    wait_until(
        lambda: "2" not in exporter.by_gpu("fleetwatch_gpu_fabric_state_id"),
        timeout=TIMEOUT,
        what="GPU 2's fabric series gone",
    )
    assert "2" not in exporter.by_gpu("fleetwatch_gpu_fabric_info")
    assert "2" not in exporter.by_gpu("fleetwatch_gpu_fabric_degraded")
    assert len(exporter.by_gpu("fleetwatch_gpu_fabric_state_id")) == 7


def test_a_hot_gpu_shows(exporter: MockedExporter) -> None:
    before = exporter.by_gpu("fleetwatch_gpu_temperature_celsius", sensor="gpu")
    exporter.override(gpus={3: {"thermal": {"temperature_gpu_c": 91}}})
    wait_until(
        lambda: exporter.by_gpu("fleetwatch_gpu_temperature_celsius", sensor="gpu")["3"] == 91,
        timeout=TIMEOUT,
        what="GPU 3 at 91 °C",
    )
    after = exporter.by_gpu("fleetwatch_gpu_temperature_celsius", sensor="gpu")
    assert {gpu: t for gpu, t in after.items() if gpu != "3"} == {
        gpu: t for gpu, t in before.items() if gpu != "3"
    }
    # Its margin to the slowdown limit (the mock answers nvmlDeviceGetMarginTemperature)
    # shrinks with it.
    slowdown = exporter.by_gpu("fleetwatch_gpu_temperature_threshold_celsius", threshold="slowdown")
    wait_until(
        lambda: (
            exporter.by_gpu("fleetwatch_gpu_temperature_margin_celsius")["3"] == slowdown["3"] - 91
        ),
        timeout=TIMEOUT,
        what=f"GPU 3's margin {slowdown['3'] - 91} °C",
    )


# Families of the GPU and GPM collectors, read through calls the mock fails with
# GPU_IS_LOST for a lost GPU (it still answers the NVLink calls, which a driver does not).
LOST_FAMILIES = (
    "fleetwatch_gpu_info",
    "fleetwatch_gpu_temperature_celsius",
    "fleetwatch_gpu_power_watts",
    "fleetwatch_gpu_clock_hertz",
    "fleetwatch_gpu_tensor_active_ratio",
    "fleetwatch_gpu_fabric_state_id",
)


def test_a_lost_gpu_drops_only_its_series(exporter: MockedExporter) -> None:
    exporter.override(gpus={5: {"failure": {"mode": "lost"}}})
    wait_until(
        lambda: "5" not in exporter.by_gpu("fleetwatch_gpu_temperature_celsius", sensor="gpu"),
        timeout=TIMEOUT,
        what="GPU 5's series dropped",
    )
    for name in LOST_FAMILIES:
        assert {labels["gpu"] for labels, _ in exporter.series(name)} == GPUS - {"5"}, name
    assert exporter.series("fleetwatch_gpus_visible")[0][1] == 7
    assert _collectors_healthy(exporter)["gpu"] == 1


def test_an_xid_the_driver_queues_is_counted(exporter: MockedExporter) -> None:
    """The mock queues an Xid for the event set when its injected failure fires; the
    listener, which takes queued events every second without waiting in NVML, counts it for
    that GPU."""
    exporter.override(
        gpus={2: {"failure": {"mode": "ecc_uncorrectable", "after_calls": 1, "xid": {"code": 48}}}}
    )
    wait_until(
        lambda: exporter.by_gpu("fleetwatch_gpu_xid_errors_total", xid="48") == {"2": 1.0},
        timeout=TIMEOUT,
        what="Xid 48 counted for GPU 2",
    )
    (info,) = [
        labels for labels, _ in exporter.series("fleetwatch_gpu_info") if labels["gpu"] == "2"
    ]
    assert [labels for labels, _ in exporter.series("fleetwatch_gpu_xid_errors_total")] == [
        {"gpu": "2", "uuid": info["uuid"], "xid": "48"}
    ]


@pytest.mark.parametrize("profile", ["h100", "gb200"])
def test_the_exporter_makes_no_call_the_mock_lacks(
    mock: NvmlMock, tmp_path: Path, profile: str
) -> None:
    """With MOCK_NVML_STRICT the mock aborts the process on an NVML call it does not
    implement; three collection cycles of every NVML collector run without one."""
    with exporter_on_mock(tmp_path, mock=mock, profile=profile, strict=True) as running:
        first = running.series("fleetwatch_collector_last_success_timestamp_seconds")
        wait_until(
            lambda: all(
                now[1] >= then[1] + 3
                for now, then in zip(
                    running.series("fleetwatch_collector_last_success_timestamp_seconds"),
                    first,
                    strict=True,
                )
            ),
            timeout=TIMEOUT,
            what="three more cycles of every collector",
        )
        assert running.server.process.poll() is None, running.server.log()
        assert set(_collectors_healthy(running).values()) == {1.0}


@pytest.mark.parametrize("profile", ["a100", "h100"])
def test_a_gpu_switching_mig_mode_is_followed(mock: NvmlMock, tmp_path: Path, profile: str) -> None:
    """The mock's MIG mode follows its overrides (`mig: {mode_current, mode_pending}`), so a
    GPU switching mode under a running exporter is checked here; it creates no MIG devices
    (`nvmlDeviceGetMigDeviceHandleByIndex` answers NotFound in every slot), so the instances
    themselves are checked on the simulation (tests/gpu/test_mig.py)."""
    with exporter_on_mock(tmp_path, mock=mock, profile=profile) as running:
        wait_until(
            lambda: len(running.by_gpu("fleetwatch_gpu_mig_mode", which="current")) == 8,
            timeout=TIMEOUT,
            what="every GPU's MIG mode",
        )
        assert set(running.by_gpu("fleetwatch_gpu_mig_mode", which="current").values()) == {0.0}
        running.override(gpus={3: {"mig": {"mode_current": "enabled", "mode_pending": "enabled"}}})
        wait_until(
            lambda: running.by_gpu("fleetwatch_gpu_mig_mode", which="current").get("3") == 1,
            timeout=TIMEOUT,
            what="GPU 3 in MIG mode",
        )
        modes = running.by_gpu("fleetwatch_gpu_mig_mode", which="current")
        assert {gpu: v for gpu, v in modes.items() if v} == {"3": 1.0}
        assert running.series("fleetwatch_gpu_mig_info") == []
        assert running.series("fleetwatch_gpu_mig_nvml_errors_total") == []
        assert running.by_gpu("fleetwatch_gpu_info")["3"] == 1
        up = {labels["collector"]: v for labels, v in running.series("fleetwatch_collector_up")}
        assert up["mig"] == 1
        assert running.server.process.poll() is None, running.server.log()
