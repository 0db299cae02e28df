"""Per-error behaviour through the fake NVML: each failure costs exactly what it should."""

from __future__ import annotations

import ast
import logging
import threading
from pathlib import Path

import pynvml
import pytest

from fleetwatch import collectors
from fleetwatch.collectors.families import SeriesFamily
from fleetwatch.collectors.gpm import GpmCollector
from fleetwatch.collectors.gpu import GpuCollector
from fleetwatch.collectors.nvlink import NvLinkCollector
from fleetwatch.collectors.sources.nvml import NvmlSource
from fleetwatch.collectors.sources.nvml_calls import GpuLostError, NvmlError
from fleetwatch.collectors.sources.nvml_events import (
    create_event_set,
    free_events,
    ready_xids,
    register_xids,
)
from fleetwatch.collectors.sources.nvml_gpm import gpm_sample
from fleetwatch.sim.fabric_faults import NvlinkDown, NvlinkErrors
from fleetwatch.sim.gpu_faults import GpuLost, Hang, TensorActive, Xid
from tests.gpu.simnode import samples, simulated

TEMP = "fleetwatch_gpu_temperature_celsius"


def gpus_in(families: list[SeriesFamily], name: str) -> set[str]:
    return {dict(labels)["gpu"] for labels in samples(families, name)}


def test_not_supported_leaves_just_that_value_absent() -> None:
    fake, source = simulated()
    fake.fail("nvmlDeviceGetPowerUsage", gpu=2, error=pynvml.NVMLError_NotSupported)
    families = GpuCollector(source=source, expected_count=8).collect()
    assert gpus_in(families, "fleetwatch_gpu_power_watts") == {"0", "1", "3", "4", "5", "6", "7"}
    assert "2" in gpus_in(families, "fleetwatch_gpu_power_limit_watts")
    assert samples(families, "fleetwatch_gpu_nvml_errors_total") == {}


def test_gpu_lost_drops_that_gpu_only(caplog: pytest.LogCaptureFixture) -> None:
    _, source = simulated(at=100.0)
    collector = GpuCollector(source=source, expected_count=8)
    assert samples(collector.collect(), "fleetwatch_gpus_visible") == {(): 8.0}
    lost, lost_source = simulated(at=100.0, faults=(GpuLost(at=50, gpu=6),))
    # The same source after GPU 6 fell off the bus mid-run: identities known, calls fail.
    lost_source._gpus, lost_source._started = source.gpus(), True
    lost_source.lib = lost
    collector = GpuCollector(source=lost_source, expected_count=8)
    with caplog.at_level(logging.ERROR):
        families = collector.collect()
        collector.collect()
    assert samples(families, "fleetwatch_gpus_visible") == {(): 7.0}
    assert samples(families, "fleetwatch_gpus_expected") == {(): 8.0}
    assert gpus_in(families, TEMP) == {"0", "1", "2", "3", "4", "5", "7"}
    assert len([r for r in caplog.records if "GPU is lost" in r.getMessage()]) == 1


def test_timeout_is_counted_and_other_gpus_keep_reporting() -> None:
    fake, source = simulated()
    fake.fail("nvmlDeviceGetFieldValues", gpu=1, error=pynvml.NVMLError_Timeout)
    collector = GpuCollector(source=source, expected_count=None)
    collector.collect()
    families = collector.collect()
    memory = {dict(k)["gpu"] for k in samples(families, TEMP) if dict(k)["sensor"] == "memory"}
    assert memory == {"0", "2", "3", "4", "5", "6", "7"}
    assert "1" in gpus_in(families, TEMP)  # the die temperature comes from another call
    errors = samples(families, "fleetwatch_gpu_nvml_errors_total")
    assert [(dict(k)["gpu"], dict(k)["call"], dict(k)["error"], v) for k, v in errors.items()] == [
        ("1", "nvmlDeviceGetFieldValues", "Timeout", 2.0)
    ]


def test_hung_call_blocks_its_collector_not_the_others() -> None:
    hang = Hang(at=0, call="nvmlDeviceGetPowerUsage", seconds=1000, gpu=3)
    fake, source = simulated(faults=(hang,))
    source.gpus()
    done = threading.Event()

    def work() -> None:
        GpuCollector(source=source, expected_count=None).collect()
        done.set()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    try:
        families = NvLinkCollector(source=source, nvlink5=False, per_gpu=False).collect()
        assert len(samples(families, "fleetwatch_nvlink_up")) == 8 * 18
        assert not done.is_set()
    finally:
        fake.node.release_hangs()
    worker.join(timeout=10)
    assert done.is_set()


def test_links_past_the_real_count_are_not_errors() -> None:
    _, source = simulated("gb200")
    gpu = source.gpus()[0]
    assert source.nvlinks(gpu) == tuple(range(18))
    reading = source.read_nvlinks(gpu, nvlink5=True)
    assert reading.failures == ()
    assert len(reading.links) == 18


def test_nvlink5_fields_absent_on_hopper() -> None:
    _, source = simulated("dgx-h100")
    for _ in range(2):  # the second read no longer asks for them
        reading = source.read_nvlinks(source.gpus()[0], nvlink5=True)
        reported = {name for name, value in reading.links[0].errors.items() if value is not None}
        assert reported == {"replay", "recovery", "crc_flit", "crc_data", "ecc_data"}


def test_per_gpu_aggregation() -> None:
    errors = NvlinkErrors(at=0, gpu=5, link=2, error="crc_flit", per_second=1)
    down = NvlinkDown(at=0, gpu=5, link=3)
    _, source = simulated(faults=(errors, down))
    families = NvLinkCollector(source=source, nvlink5=True, per_gpu=True).collect()
    links_up = samples(families, "fleetwatch_nvlink_links_up")
    assert {dict(k)["gpu"]: v for k, v in links_up.items()}["5"] == 17
    totals = samples(families, "fleetwatch_nvlink_errors_total")
    crc = {dict(k)["gpu"]: v for k, v in totals.items() if dict(k)["error"] == "crc_flit"}
    assert crc["5"] == 120
    assert crc["0"] == 0
    assert all("link" not in dict(k) for k in totals)


def test_gpm_absent_without_support_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    _, source = simulated(gpm_supported=False)
    collector = GpmCollector(source=source)
    with caplog.at_level(logging.INFO):
        assert collector.collect() == []
        assert collector.collect() == []
    said = [r for r in caplog.records if "no GPM" in r.getMessage()]
    assert len(said) == 8
    assert "DCGM" in said[0].getMessage()


def test_gpm_reports_held_counters_and_recovers() -> None:
    fake, source = simulated()
    collector = GpmCollector(source=source)
    collector.collect()
    assert samples(collector.collect(), "fleetwatch_gpu_tensor_active_ratio")
    fake.hold_profiling(True)
    with pytest.raises(RuntimeError, match="profiling counters"):
        collector.collect()
    assert fake.live_gpm_samples == 0
    fake.hold_profiling(False)
    assert collector.collect() == []  # a new pair starts
    tensor = samples(collector.collect(), "fleetwatch_gpu_tensor_active_ratio")
    assert len(tensor) == 8 * 5
    collector.close()
    assert fake.live_gpm_samples == 0


def test_gpm_alternates_two_buffers_a_gpu_and_frees_those_of_a_gpu_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, source = simulated()
    allocated = [0]
    alloc = fake.nvmlGpmSampleAlloc

    def counting_alloc():  # type: ignore[no-untyped-def]
        allocated[0] += 1
        return alloc()

    monkeypatch.setattr(fake, "nvmlGpmSampleAlloc", counting_alloc)
    collector = GpmCollector(source=source)
    collector.collect()
    collector.collect()
    assert (allocated[0], fake.live_gpm_samples) == (16, 16)
    for _ in range(3):  # every later cycle samples into the buffer its last metrics freed
        tensor = samples(collector.collect(), "fleetwatch_gpu_tensor_active_ratio")
        assert len(tensor) == 8 * 5
    assert (allocated[0], fake.live_gpm_samples) == (16, 16)
    # A GPU no longer listed (gone from NVML's enumeration): its two buffers freed at once.
    source._gpus = source.gpus()[:7]
    families = collector.collect()
    assert gpus_in(families, "fleetwatch_gpu_tensor_active_ratio") == {str(i) for i in range(7)}
    assert fake.live_gpm_samples == 14
    collector.close()
    assert fake.live_gpm_samples == 0


def test_tensor_activity_follows_the_fault() -> None:
    low = TensorActive(at=0, gpu=4, value=0.05)
    _, source = simulated(faults=(low,))
    collector = GpmCollector(source=source)
    collector.collect()
    tensor = samples(collector.collect(), "fleetwatch_gpu_tensor_active_ratio")
    any_pipe = {dict(k)["gpu"]: v for k, v in tensor.items() if dict(k)["pipe"] == "any"}
    assert any_pipe["4"] == 0.05
    assert any_pipe["0"] > 0.5


def test_nvml_init_once_per_source() -> None:
    fake, source = simulated()
    GpuCollector(source=source, expected_count=None).collect()
    NvLinkCollector(source=source, nvlink5=True, per_gpu=False).collect()
    assert fake.init_calls == 1


def test_no_driver_real_pynvml(caplog: pytest.LogCaptureFixture) -> None:
    source = NvmlSource(lib=pynvml)
    with caplog.at_level(logging.WARNING):
        assert GpuCollector(source=source, expected_count=None).collect() == []
        assert GpmCollector(source=source).collect() == []
        assert NvLinkCollector(source=source, nvlink5=True, per_gpu=False).collect() == []
    said = [r for r in caplog.records if "no NVIDIA driver" in r.getMessage()]
    assert len(said) == 1


def test_shutdown_releases_nvml_once_and_only_after_init() -> None:
    fake, source = simulated()
    source.shutdown()  # never started: nothing to release
    assert fake.init_calls == 0
    assert source.gpus()
    assert fake.init_calls == 1
    source.shutdown()
    source.shutdown()
    assert fake.init_calls == 0


def test_collectors_never_import_pynvml() -> None:
    """pynvml's errors and constants stay in the source layer (collectors/sources)."""
    root = Path(collectors.__file__).parent
    for path in sorted(root.glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "pynvml" not in imported, path.name


def test_gpm_sampling_failures_come_classified() -> None:
    fake, source = simulated()
    gpu = source.gpus()[1]
    fake.fail("nvmlGpmSampleGet", error=pynvml.NVMLError_InUse, gpu=1)
    with pytest.raises(NvmlError) as caught:
        gpm_sample(source, gpu)
    assert (caught.value.call, caught.value.error, caught.value.gpu) == (
        "nvmlGpmSampleGet",
        "InUse",
        1,
    )
    fake.fail("nvmlGpmSampleGet", error=pynvml.NVMLError_GpuIsLost, gpu=1)
    with pytest.raises(GpuLostError):
        gpm_sample(source, gpu)
    assert fake.live_gpm_samples == 0


def test_queued_xids_are_taken_without_waiting_and_a_failed_take_is_an_nvml_error() -> None:
    fake, source = simulated(
        faults=(Xid(at=120, gpu=3, xid=79), Xid(at=120, gpu=5, xid=48), Xid(at=120, gpu=6, xid=94))
    )
    events = create_event_set(source)
    assert all(register_xids(source, events, gpu) for gpu in source.gpus())
    first = list(ready_xids(source, events, limit=2))  # the third stays queued
    assert [(event.gpu, event.xid) for event in first] == [(3, 79), (5, 48)]
    assert first[0].uuid == source.gpus()[3].identity.uuid
    assert [(event.gpu, event.xid) for event in ready_xids(source, events)] == [(6, 94)]
    assert list(ready_xids(source, events)) == []  # each taken once; none waited for
    fake.fail("nvmlEventSetWait_v2", error=pynvml.NVMLError_Unknown)
    with pytest.raises(NvmlError, match="nvmlEventSetWait_v2 failed: Unknown"):
        list(ready_xids(source, events))
    fake.clear_failures()
    free_events(source, events)
