"""What each NVML read the collectors make costs this process: CPU (the calling thread's own
clock, which counts the driver's time in the kernel) and wall time per call, for every call
a collection cycle makes on one GPU, each field value the exporter reads alone and in its
batches, and the field values that could stand for a separate call (energy, power, PCIe
replays, row remapping).

On a GPU machine this is the driver's cost, which the mock NVML does not model (on the mock
every call is a Go function of a few microseconds): where a call is dear, read it less
often or in a batch. Prints figures; asserts nothing.

Run: `.venv/bin/python bench/bench_nvml_calls.py [--repeat 20] [--gap 0] [--gpu 0]` (on the mock:
`LD_LIBRARY_PATH` to its library and `MOCK_NVML_CONFIG` to a profile).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pynvml

from fleetwatch.collectors.sources.nvml import (
    FIELD_MEMORY_TEMP,
    FIELD_RECOVERY_ACTION,
    VIOLATION_FIELDS,
    NvmlSource,
)
from fleetwatch.collectors.sources.nvml_calls import (
    Calls,
    FieldBatch,
    FieldId,
    nvlink_error_counter,
)

# The gpu collector's batch, as `NvmlSource.read_gpu` asks for it.
GPU_BATCH: tuple[FieldId, ...] = (
    FIELD_MEMORY_TEMP,
    *VIOLATION_FIELDS.values(),
    FIELD_RECOVERY_ACTION,
)
# Field values that answer what a separate call answers now.
STAND_INS: dict[str, tuple[FieldId, ...]] = {
    "energy (TOTAL_ENERGY_CONSUMPTION)": (pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,),
    "energy (ENERGY)": (pynvml.NVML_FI_DEV_ENERGY,),
    "power (POWER_INSTANT)": (pynvml.NVML_FI_DEV_POWER_INSTANT,),
    "power (POWER_AVERAGE)": (pynvml.NVML_FI_DEV_POWER_AVERAGE,),
    "PCIe replays (PCIE_REPLAY_COUNTER)": (pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER,),
    "row remapping (REMAPPED_COR, _UNC, _PENDING, _FAILURE)": (
        pynvml.NVML_FI_DEV_REMAPPED_COR,
        pynvml.NVML_FI_DEV_REMAPPED_UNC,
        pynvml.NVML_FI_DEV_REMAPPED_PENDING,
        pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
    ),
    "ECC totals (ECC_SBE_AGG_TOTAL, ECC_DBE_AGG_TOTAL)": (
        pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
        pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
    ),
}


def timed(function: Callable[[], Any]) -> tuple[float, float, str]:
    """(CPU ms, wall ms, outcome) of one call."""
    outcome = "ok"
    c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
    try:
        function()
    except pynvml.NVMLError as exc:
        outcome = type(exc).__name__.removeprefix("NVMLError_")
    except Exception as exc:  # a call this pynvml or driver lacks: say so, go on
        outcome = f"{type(exc).__name__}: {exc}"[:60]
    c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
    return (c1 - c0) / 1e6, (w1 - w0) / 1e6, outcome


def costs(
    rows: Sequence[tuple[str, Callable[[], Any]]], repeat: int, gap: float
) -> list[tuple[str, float, float, str]]:
    """(name, median CPU ms, median wall ms, last outcome) of each row: after two warm-ups,
    `repeat` calls back to back (`gap` 0), or `repeat` rounds of one call of each row, each
    call `gap` seconds after the one before, as a collection cycle finds the driver (which
    may keep a value it read a moment ago: back to back, a call can cost less than it does
    once a cycle)."""
    samples: dict[str, list[tuple[float, float, str]]] = {name: [] for name, _ in rows}
    if gap <= 0:
        for name, function in rows:
            for attempt in range(repeat + 2):
                if attempt >= 2:
                    samples[name].append(timed(function))
                else:
                    timed(function)
    else:
        for round_ in range(repeat + 1):
            for name, function in rows:
                time.sleep(gap)
                sample = timed(function)
                if round_:
                    samples[name].append(sample)
    return [
        (
            name,
            statistics.median(cpu for cpu, _, _ in found),
            statistics.median(wall for _, wall, _ in found),
            found[-1][2],
        )
        for name, found in samples.items()
    ]


def batch(handle: Any, ids: Sequence[FieldId]) -> Callable[[], Any]:
    """One prepared field-value call, as the collectors make it; raises on a field that
    did not answer, so the outcome says so."""
    prepared = FieldBatch(pynvml, ids)
    calls = Calls(pynvml, 0)

    def read() -> Any:
        values = prepared.read(calls, handle)
        missing = [key for key in ids if values.get(key) is None]
        if missing:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return values

    return read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument(
        "--gap",
        type=float,
        default=0.0,
        help="seconds of rest before each call, in rounds of one call of each (0: each "
        "call back to back)",
    )
    args = parser.parse_args()
    source = NvmlSource(lib=pynvml)
    gpus = source.gpus()
    gpu = gpus[args.gpu]
    h = gpu.handle
    print(f"{gpu.identity.name}, driver {gpu.identity.driver_version}; {len(gpus)} GPUs")
    fabric = ctypes.pointer(pynvml.c_nvmlGpuFabricInfoV_t())
    rows: list[tuple[str, Callable[[], Any]]] = [
        ("read_gpu (the gpu collector's reads of one GPU)", lambda: source.read_gpu(gpu)),
        ("nvmlDeviceGetFieldValues: the gpu batch", batch(h, GPU_BATCH)),
        *((f"  field {key} alone", batch(h, (key,))) for key in GPU_BATCH),
        (
            "nvmlDeviceGetCurrentClocksEventReasons",
            lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
        ),
        ("nvmlDeviceGetUtilizationRates", lambda: pynvml.nvmlDeviceGetUtilizationRates(h)),
        ("nvmlDeviceGetMemoryInfo", lambda: pynvml.nvmlDeviceGetMemoryInfo(h)),
        ("nvmlDeviceGetRemappedRows", lambda: pynvml.nvmlDeviceGetRemappedRows(h)),
        (
            "nvmlDeviceGetTemperatureV",
            lambda: pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
        ),
        ("nvmlDeviceGetMarginTemperature", lambda: pynvml.nvmlDeviceGetMarginTemperature(h)),
        ("nvmlDeviceGetPowerUsage", lambda: pynvml.nvmlDeviceGetPowerUsage(h)),
        ("nvmlDeviceGetEnforcedPowerLimit", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h)),
        (
            "nvmlDeviceGetTotalEnergyConsumption",
            lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
        ),
        (
            "nvmlDeviceGetClockInfo (SM)",
            lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        ),
        (
            "nvmlDeviceGetTotalEccErrors (corrected)",
            lambda: pynvml.nvmlDeviceGetTotalEccErrors(
                h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC
            ),
        ),
        ("nvmlDeviceGetPcieReplayCounter", lambda: pynvml.nvmlDeviceGetPcieReplayCounter(h)),
        (
            "nvmlDeviceGetCurrPcieLinkGeneration",
            lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
        ),
        ("nvmlDeviceGetCurrPcieLinkWidth", lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)),
        ("nvmlDeviceGetMigMode", lambda: pynvml.nvmlDeviceGetMigMode(h)),
        ("nvmlDeviceGetNvLinkState (link 0)", lambda: pynvml.nvmlDeviceGetNvLinkState(h, 0)),
        ("nvmlDeviceGetGpuFabricInfoV", lambda: pynvml.nvmlDeviceGetGpuFabricInfoV(h, fabric)),
        *((f"field stand-in: {name}", batch(h, ids)) for name, ids in STAND_INS.items()),
        (
            "the gpu batch with every stand-in",
            batch(h, (*GPU_BATCH, *(key for ids in STAND_INS.values() for key in ids))),
        ),
    ]
    # NVLink (an HGX/DGX: a GPU without active links answers NotSupported): the nvlink
    # collector's whole read of the GPU, one per-link counter call (a DGX H100 cycle makes
    # 432), and the field values that could carry those counters in the GPU's one batch.
    links = source.nvlinks(gpu)
    counter = nvlink_error_counter(pynvml)
    rows += [
        (
            f"read_nvlinks (the nvlink collector's reads of one GPU, {len(links)} links)",
            lambda: source.read_nvlinks(gpu, nvlink5=False),
        ),
        (
            "nvmlDeviceGetNvLinkErrorCounter (link 0, CRC flit)",
            lambda: counter(h, 0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
        ),
        *(
            (f"link-scoped fields {', '.join(map(str, ids))}, every link", batch(h, keys))
            for ids in (
                (
                    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
                ),
                (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,),
            )
            for keys in [tuple((field_id, link) for link in links for field_id in ids)]
            if keys
        ),
        (
            "link 0's CRC flit, CRC data, ECC data counters as fields 32, 39, 148",
            batch(
                h,
                (
                    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0,
                    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0,
                    pynvml.NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_L0,
                ),
            ),
        ),
    ]
    if bool(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice):
        samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
        turn = [0]

        def sample() -> None:
            turn[0] ^= 1
            pynvml.nvmlGpmSampleGet(h, samples[turn[0]])

        rows.append(("nvmlGpmSampleGet", sample))
    how = f"rounds {args.gap:g} s apart" if args.gap > 0 else "calls back to back"
    print(f"{'call':<66} {'CPU ms':>8} {'wall ms':>8}  outcome ({args.repeat} {how}, medians)")
    for name, cpu, wall, outcome in costs(rows, args.repeat, args.gap):
        print(f"{name:<66} {cpu:8.3f} {wall:8.3f}  {outcome}")
    print("values, the call's beside its stand-in fields':")
    for name, call, ids in (
        (
            "energy mJ",
            pynvml.nvmlDeviceGetTotalEnergyConsumption,
            STAND_INS["energy (TOTAL_ENERGY_CONSUMPTION)"],
        ),
        (
            "power mW",
            pynvml.nvmlDeviceGetPowerUsage,
            (pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_POWER_AVERAGE),
        ),
        (
            "PCIe replays",
            pynvml.nvmlDeviceGetPcieReplayCounter,
            STAND_INS["PCIe replays (PCIE_REPLAY_COUNTER)"],
        ),
        (
            "remapped rows",
            pynvml.nvmlDeviceGetRemappedRows,
            STAND_INS["row remapping (REMAPPED_COR, _UNC, _PENDING, _FAILURE)"],
        ),
    ):
        try:
            answer: Any = call(h)
        except pynvml.NVMLError as exc:
            answer = type(exc).__name__
        values = FieldBatch(pynvml, ids).read(Calls(pynvml, 0), h)
        print(f"  {name}: {answer} | {[values.get(key) for key in ids]}")
    source.shutdown()


if __name__ == "__main__":
    main()
