"""NVML raising every error code, from every call the GPU and Xid collectors make (each cycle,
and once at start), on the real pynvml and NVIDIA's mock NVML (`tests/faults/nvml_error_drive.py`
says how and what is checked). Skipped, saying why, where FLEETWATCH_NVML_MOCK names no mock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.nvmlmock import MissingNvmlMock, NvmlMock

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_every_error_code_of_every_call_is_absorbed_counted_and_recovered() -> None:
    try:
        NvmlMock.from_environment()
    except MissingNvmlMock as exc:
        pytest.skip(str(exc))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOCK_NVML_")}
    done = subprocess.run(
        [sys.executable, "-m", "tests.faults.nvml_error_drive"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result["broken"] == []
    # Every call of a cycle, by each collector that makes it, with all of pynvml's codes and
    # one it does not name; but "not supported", which the source does not ask again once a
    # GPU answered it (the untried).
    assert len(result["calls"]) >= 19
    assert result["codes"] == 32
    assert result["tried"] + len(result["untried"]) == result["pairs"] * result["codes"]
    assert len(result["untried"]) <= 4, result["untried"]
    assert all("NOT_SUPPORTED" in u or "NO_PERMISSION" in u for u in result["untried"])
    # And every call made once, when NVML starts and the GPUs are first identified; the
    # energy counter too, read in a GPU's first cycle and then once an energy interval (its
    # failure at a later read: tests/gpu/test_energy_cadence.py).
    # The Xid collector's event set: made and each GPU registered at its first take.
    assert {
        "nvmlInit",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlEventSetCreate",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceRegisterEvents",
    } <= set(result["startup_calls"])
    assert "nvmlEventSetWait_v2" in result["calls"]
    assert result["startup_tried"] == result["startup_pairs"] * result["codes"]
