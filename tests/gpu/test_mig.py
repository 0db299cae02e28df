"""The MIG collector on the h100-mig scenario: instances by MIG UUID joined to their GPU,
a GPU switching MIG mode while the exporter runs, and a MIG instance that disappears."""

from __future__ import annotations

import logging

import pytest

from fleetwatch.catalog.mig import (
    GPU_MIG_INFO,
    GPU_MIG_MEMORY_TOTAL_BYTES,
    GPU_MIG_MODE,
    GPU_MIG_NVML_ERRORS_TOTAL,
    GPU_MIG_TENSOR_ACTIVE_RATIO,
)
from fleetwatch.collectors.mig import MigCollector
from fleetwatch.collectors.sources.nvml_mig import mig_profile
from fleetwatch.sim.checks import ScenarioError
from fleetwatch.sim.scenario import parse_scenario
from testbed.clock import FixedClock
from tests.gpu.simnode import samples, simulated


def _info(families: list) -> dict[str, dict[str, str]]:  # type: ignore[type-arg]
    """MIG info series by MIG UUID."""
    return {dict(k)["mig_uuid"]: dict(k) for k in samples(families, GPU_MIG_INFO.name)}


def test_instances_carry_parent_gpu_instance_ids_profile_and_memory() -> None:
    fake, source = simulated("h100-mig", at=10.0)
    families = MigCollector(source=source).collect()
    info = _info(families)
    assert len(info) == 4
    by_gpu = sorted((i["gpu"], i["gpu_instance"], i["compute_instance"]) for i in info.values())
    assert by_gpu == [("0", "1", "0"), ("0", "2", "0"), ("1", "1", "0"), ("1", "2", "0")]
    assert {i["profile"] for i in info.values()} == {"3g.40gb"}
    assert all(u.startswith("MIG-") for u in info)
    gpu0 = fake.nvmlDeviceGetUUID(source.gpus()[0].handle)
    assert {i["uuid"] for i in info.values() if i["gpu"] == "0"} == {gpu0}
    totals = set(samples(families, GPU_MIG_MEMORY_TOTAL_BYTES.name).values())
    assert totals == {40 * 1024**3}
    modes = samples(families, GPU_MIG_MODE.name)
    current = {dict(k)["gpu"]: v for k, v in modes.items() if dict(k)["which"] == "current"}
    assert current == {"0": 1, "1": 1, "2": 0, "3": 0}


def test_gpm_activity_per_instance_from_the_second_cycle() -> None:
    fake, source = simulated("h100-mig", at=10.0)
    collector = MigCollector(source=source)
    assert not samples(collector.collect(), GPU_MIG_TENSOR_ACTIVE_RATIO.name)
    tensor = samples(collector.collect(), GPU_MIG_TENSOR_ACTIVE_RATIO.name)
    assert len(tensor) == 4
    assert all(0 < v <= 1 for v in tensor.values())
    collector.close()
    assert fake.live_gpm_samples == 0


def test_a_gpu_switching_mig_mode_while_running_shows_its_instances() -> None:
    fake, source = simulated("h100-mig", at=10.0)
    collector = MigCollector(source=source)
    collector.collect()
    collector.collect()
    fake.node.clock = FixedClock(40.0)
    families = collector.collect()
    gpus = sorted({i["gpu"] for i in _info(families).values()})
    assert gpus == ["0", "1", "2"]
    # Back out of MIG mode: the instances go, their kept GPM samples are freed.
    fake.node.clock = FixedClock(10.0)
    collector.collect()
    assert sorted({i["gpu"] for i in _info(collector.collect()).values()}) == ["0", "1"]
    collector.close()
    assert fake.live_gpm_samples == 0


def test_a_mig_instance_that_disappears_is_counted_logged_once_and_the_rest_exported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, source = simulated("h100-mig", at=90.0)
    collector = MigCollector(source=source)
    with caplog.at_level(logging.WARNING):
        collector.collect()
        families = collector.collect()
    info = _info(families)
    assert sorted((i["gpu"], i["gpu_instance"]) for i in info.values()) == [
        ("0", "1"),
        ("1", "1"),
        ("1", "2"),
        ("2", "1"),
        ("2", "2"),
    ]
    errors = samples(families, GPU_MIG_NVML_ERRORS_TOTAL.name)
    assert [(dict(k)["gpu"], dict(k)["call"], dict(k)["error"], v) for k, v in errors.items()] == [
        ("0", "nvmlDeviceGetUUID", "NotFound", 2)
    ]
    said = [r for r in caplog.records if getattr(r, "slot", None) == 1]
    assert len(said) == 1
    assert said[0].gpu == 0  # type: ignore[attr-defined]
    assert said[0].call == "nvmlDeviceGetUUID"  # type: ignore[attr-defined]


def test_gpus_without_mig_export_no_mig_series() -> None:
    _, source = simulated("dgx-h100")
    assert MigCollector(source=source).collect() == []


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "1g.10gb"),
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "3g.20gb"),
        ("NVIDIA H100 80GB HBM3", ""),
    ],
)
def test_profile_from_the_mig_device_name(name: str, profile: str) -> None:
    assert mig_profile(name) == profile


@pytest.mark.parametrize(
    ("mig", "error"),
    [
        ({"profile": "big"}, "mig.profile: 'big' is not a MIG profile"),
        ({"profile": "1g.10gb", "gpus": [9]}, "mig.gpus[0]"),
        ({"profile": "1g.10gb", "instances": 8}, "mig.instances"),
        ({"profile": "1g.10gb", "size": 1}, "mig"),
    ],
)
def test_a_bad_mig_section_is_refused_naming_the_key(mig: dict, error: str) -> None:  # type: ignore[type-arg]
    data = {"gpus": 2, "gpu_model": "H100", "nvlinks_per_gpu": 0, "infiniband": [], "mig": mig}
    with pytest.raises(ScenarioError, match=error.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(data, source="s.yaml", name="s")
