"""NVLink counters in one batched field-value call per GPU, and the per-link call where the
batch does not answer; field values decoded from pynvml's ctypes array as pynvml reads them;
the batch's array made once and read through NVML's C function, on NVIDIA's mock NVML.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetwatch.collectors.sources.nvml import NVLINK_ERROR_FIELDS, NVLINK_STATE_FIELD, NvmlSource
from fleetwatch.collectors.sources.nvml_calls import field_value, field_values
from fleetwatch.sim.nvml_records import FakeFieldValue, FakeHandle, FakeValue
from fleetwatch.sim.scenario import load_scenario
from fleetwatch.sim.world import SimulatedNode
from testbed.clock import FixedClock
from testbed.nvmlmock import LIBRARY, MissingNvmlMock, NvmlMock
from tests.gpu.simnode import ControlledNvml

BATCHED = 1000.0  # what the batch answers, where the per-link call answers 0


# Field 165 by link: active and inactive (taken from the batch, the inactive one against
# what the per-link call answers), asleep (asked per link); NotSupported on the others.
BATCHED_STATES = {
    0: pynvml.NVML_NVLINK_STATE_ACTIVE,
    1: pynvml.NVML_NVLINK_STATE_SLEEP,
    2: pynvml.NVML_NVLINK_STATE_INACTIVE,
    4: pynvml.NVML_NVLINK_STATE_ACTIVE,
}


class LinkFieldsNvml(ControlledNvml):
    """Answers the link-scoped replay and recovery fields on even links only (BATCHED plus
    the link), NotSupported on odd ones, the state field as `BATCHED_STATES`, and counts
    the per-link counter and state calls."""

    def __init__(self, *, node: SimulatedNode, answer: bool = True) -> None:
        super().__init__(node=node)
        self.answer = answer
        self.counter_calls: Counter[tuple[int, int]] = Counter()
        self.state_calls: Counter[int] = Counter()
        self.batches = 0

    def nvmlDeviceGetFieldValues(
        self, handle: FakeHandle, field_ids: list[int | tuple[int, int]]
    ) -> list[FakeFieldValue]:
        self.batches += 1
        return super().nvmlDeviceGetFieldValues(handle, field_ids)

    def _field(self, gpu: int, requested: int | tuple[int, int]) -> FakeFieldValue:
        field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
        if field_id == NVLINK_STATE_FIELD:
            state = BATCHED_STATES.get(scope) if self.answer else None
            return FakeFieldValue(
                fieldId=field_id,
                scopeId=scope,
                nvmlReturn=pynvml.NVML_ERROR_NOT_SUPPORTED if state is None else 0,
                value=FakeValue(ullVal=state or 0),
            )
        if field_id not in NVLINK_ERROR_FIELDS.values():
            return super()._field(gpu, requested)
        answered = self.answer and scope % 2 == 0
        return FakeFieldValue(
            fieldId=field_id,
            scopeId=scope,
            nvmlReturn=pynvml.NVML_SUCCESS if answered else pynvml.NVML_ERROR_NOT_SUPPORTED,
            value=FakeValue(ullVal=int(BATCHED) + scope),
        )

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> Any:
        self.state_calls[link] += 1
        return super().nvmlDeviceGetNvLinkState(handle, link)

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: FakeHandle, link: int, counter: int) -> Any:
        self.counter_calls[(link, counter)] += 1
        return super().nvmlDeviceGetNvLinkErrorCounter(handle, link, counter)


def source(*, answer: bool = True) -> tuple[LinkFieldsNvml, NvmlSource]:
    node = SimulatedNode(scenario=load_scenario("dgx-h100"), clock=FixedClock(120.0))
    fake = LinkFieldsNvml(node=node, answer=answer)
    return fake, NvmlSource(lib=fake)


def test_replay_and_recovery_come_from_the_batch_and_the_per_link_call_fills_in() -> None:
    fake, nvml = source()
    reading = nvml.read_nvlinks(nvml.gpus()[0], nvlink5=False)
    assert fake.batches == 1
    replay = pynvml.NVML_NVLINK_ERROR_DL_REPLAY
    for link in reading.links:
        batched = link.link % 2 == 0
        expected = BATCHED + link.link if batched else 0.0
        assert (link.errors["replay"], link.errors["recovery"]) == (expected, expected)
        assert fake.counter_calls[(link.link, replay)] == (0 if batched else 1)
        assert link.errors["crc_flit"] == 0.0  # never batched: the per-link call
    assert reading.failures == ()


def test_an_active_or_inactive_state_comes_from_the_batch_and_others_per_link() -> None:
    fake, nvml = source()
    gpu = nvml.gpus()[0]
    nvml.nvlinks(gpu)  # the links are probed once by state, before any cycle
    fake.state_calls.clear()
    reading = nvml.read_nvlinks(gpu, nvlink5=False)
    ups = {link.link: link.up for link in reading.links}
    assert (ups[0], ups[2], ups[4]) == (True, False, True)  # as the batch says
    asked = {link for link in ups if link not in (0, 2, 4)}  # asleep, or not answered
    assert set(fake.state_calls) == asked
    assert all(fake.state_calls[link] == 1 and ups[link] is True for link in asked)


def test_a_gpu_whose_batch_answers_none_of_the_fields_is_not_asked_again() -> None:
    fake, nvml = source(answer=False)
    gpu = nvml.gpus()[0]
    first = nvml.read_nvlinks(gpu, nvlink5=False)
    second = nvml.read_nvlinks(gpu, nvlink5=False)
    assert fake.batches == 1
    assert first == second
    assert all(link.errors["replay"] == 0.0 for link in second.links)


RESULTS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=8),  # valueType, 7 and 8 unknown
        st.sampled_from([pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_SUPPORTED]),
        st.binary(min_size=8, max_size=8),
    ),
    max_size=20,
)


@given(RESULTS)
def test_a_ctypes_batch_decodes_as_pynvml_reads_each_value(
    results: list[tuple[int, int, bytes]],
) -> None:
    array = (pynvml.c_nvmlFieldValue_t * len(results))()
    for slot, (value_type, returned, union) in zip(array, results, strict=True):
        slot.valueType = value_type
        slot.nvmlReturn = returned
        ctypes.memmove(ctypes.addressof(slot.value), union, 8)
    decoded = field_values(array)
    expected = [field_value(slot) for slot in array]
    assert [str(v) for v in decoded] == [str(v) for v in expected]  # NaN equals NaN here


ON_THE_MOCK = """
import json, pynvml
from fleetwatch.collectors.sources.nvml import NVLINK5_FIELDS, NVLINK_ERROR_FIELDS
from fleetwatch.collectors.sources.nvml_calls import (
    Calls, FieldBatch, field_value, nvlink_error_counter)
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
ids = [(f, link) for link in range(18) for f in (*NVLINK_ERROR_FIELDS.values(), 163, 165)]
ids += [82, *NVLINK5_FIELDS.values()]
calls = Calls(pynvml, 0)
fast = FieldBatch(pynvml, ids)
rounds = [fast.read(calls, handle) for _ in range(2)]
slow = [field_value(v) for v in pynvml.nvmlDeviceGetFieldValues(handle, ids)]
counter = nvlink_error_counter(pynvml)

def answer(call):
    try:
        return call()
    except pynvml.NVMLError as exc:
        return type(exc).__name__

asked = [(link, code) for link in (0, 7, 17, 40) for code in range(5)]
direct = [answer(lambda: counter(handle, link, code)) for link, code in asked]
wrapped = [
    answer(lambda: pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, code))
    for link, code in asked
]
print(json.dumps({"rounds": [list(r.values()) for r in rounds], "slow": slow,
                  "failures": len(calls.failures), "prepared": fast.prepared,
                  "counters": [direct, wrapped],
                  "counter_prepared": counter is not pynvml.nvmlDeviceGetNvLinkErrorCounter}))
"""


def test_the_prepared_batch_reads_what_pynvml_reads_on_the_mock(tmp_path: Path) -> None:
    """Through NVML's C function on an array made once, twice running, the values are
    those pynvml's own nvmlDeviceGetFieldValues returns, and the per-link error counters
    those of its nvmlDeviceGetNvLinkErrorCounter (NVIDIA's mock NVML, H100)."""
    try:
        mock = NvmlMock.from_environment()
    except MissingNvmlMock as exc:
        pytest.skip(str(exc))
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text("version: 1\n")
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(mock.root / LIBRARY.parent),
        "MOCK_NVML_CONFIG": str(mock.profile("h100")),
        "MOCK_NVML_OVERRIDES": str(overrides),
    }
    done = subprocess.run(
        [sys.executable, "-c", ON_THE_MOCK],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout)
    assert read["failures"] == 0
    assert read["prepared"], "the C function was not used"
    assert read["rounds"] == [read["slow"], read["slow"]]
    assert read["slow"][3] == 1.0  # link 0's state field: active
    # The NVLink error counters through NVML's C function answer as pynvml's wrapper does:
    # values, and for a link past the GPU's the same error.
    direct, wrapped = read["counters"]
    assert read["counter_prepared"], "the C function was not used"
    assert direct == wrapped
    assert {type(answer) for answer in direct} == {int, str}


class ProbeNvml(LinkFieldsNvml):
    """The link probe answering `refusal` for every link while `refusal` is set."""

    refusal: type[pynvml.NVMLError] | None = None

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> Any:
        if self.refusal is not None:
            self.state_calls[link] += 1
            raise self.refusal(0)
        return super().nvmlDeviceGetNvLinkState(handle, link)


@pytest.mark.parametrize(
    ("refusal", "probed_again"),
    [
        (pynvml.NVMLError_InvalidArgument, True),  # no answer a GPU gives: asked again
        (pynvml.NVMLError_NotSupported, False),  # a GPU without NVLink: asked once
    ],
)
def test_a_gpu_whose_every_link_is_refused_is_probed_again_only_when_invalid(
    refusal: type[pynvml.NVMLError], probed_again: bool
) -> None:
    node = SimulatedNode(scenario=load_scenario("dgx-h100"), clock=FixedClock(120.0))
    fake = ProbeNvml(node=node)
    nvml = NvmlSource(lib=fake)
    gpu = nvml.gpus()[0]
    fake.refusal = refusal
    assert nvml.nvlinks(gpu) == ()
    assert sum(fake.state_calls.values()) == 36
    fake.refusal = None
    links = nvml.nvlinks(gpu)
    assert (len(links) == 18) is probed_again
    assert bool(nvml.read_nvlinks(gpu, nvlink5=False).links) is probed_again
