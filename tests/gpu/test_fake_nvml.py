"""The fake NVML's answer to a call it does not implement: a real per-device query reads as
a GPU without the feature (NotSupported), so a new value runs on the simulator, absent,
before the fake learns it; a lost GPU stays lost; any other name is an AttributeError."""

from __future__ import annotations

import pynvml
import pytest

from fleetwatch.sim.gpu_faults import GpuLost
from fleetwatch.sim.nvml_records import FakeHandle
from tests.gpu.simnode import simulated

# A real pynvml device query the fake does not implement (the test fails loudly, not
# silently, if the fake learns it: then pick another).
UNIMPLEMENTED = "nvmlDeviceGetPowerManagementDefaultLimit"


def test_a_real_query_the_fake_lacks_is_not_supported() -> None:
    fake, _source = simulated()
    assert UNIMPLEMENTED not in vars(type(fake)), "the fake implements it now: pick another"
    assert callable(getattr(pynvml, UNIMPLEMENTED))
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        getattr(fake, UNIMPLEMENTED)(handle)


def test_a_lost_gpu_answers_lost_to_it_too() -> None:
    fake, _source = simulated(at=100.0, faults=(GpuLost(at=50, gpu=6),))
    # A handle taken before the GPU was lost, as a collector holds it.
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        getattr(fake, UNIMPLEMENTED)(FakeHandle(6))


@pytest.mark.parametrize("name", ["nvmlDeviceGetPowerManagmentDefaultLimit", "nvmlSystemGetX"])
def test_a_misspelt_or_unknown_call_is_an_attribute_error(name: str) -> None:
    fake, _source = simulated()
    with pytest.raises(AttributeError, match=name):
        getattr(fake, name)
