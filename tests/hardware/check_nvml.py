"""Run every GPU collector against the real NVIDIA driver and print what it reads.

For a machine with an NVIDIA GPU: prints what this process may read on the node (uid,
effective capabilities, the driver's profiling restriction, dmesg_restrict, /dev/kmsg, umad
devices, the kubelet socket: the facts docs/deploy.md's privilege table rests on), each
family with its samples, the per-call NVML latency (count, median, max per call name), the
NVML calls that failed or were not supported, the raw NVLink-fabric fields of each GPU, the
link-scoped NVLink fields of the batched call beside the per-link calls they stand for, and
the families the hardware did not produce. Two cycles a few seconds apart (GPM needs a pair
of samples); finishes in well under 3 minutes. Run it as root and as an unprivileged user
(e.g. `setpriv --reuid 65532 --regid 65532 --clear-groups --inh-caps=-all`) to see which
sources need what. Record the output in docs/hardware-validation.md.

With `--reset-gpu N` (or `all`) it also runs the reset Job's own script
(`fleetwatch.tainter.reset_job.RESET_SCRIPT`, the one the tainter's Job and
helm/fleetwatch/examples/gpu-reset-job.yaml run) with `GPU=N`: the GPUs (`nvidia-smi
--query-gpu=index` for `all`), the compute processes holding each (`nvidia-smi
--query-compute-apps=pid`), then, only when there are none, `nvidia-smi --gpu-reset -i N` for
each; run it as the Job's user (root, every capability dropped but SYS_ADMIN) to see whether
those privileges suffice. It disrupts the GPU: an idle machine only.

Run: .venv/bin/python tests/hardware/check_nvml.py [--gap SECONDS] [--reset-gpu N|all]
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import stat
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pynvml

from fleetwatch.collectors.base import Collector
from fleetwatch.collectors.families import SeriesFamily
from fleetwatch.collectors.gpm import SPECS as GPM_SPECS
from fleetwatch.collectors.gpm import GpmCollector
from fleetwatch.collectors.gpu import SPECS as GPU_SPECS
from fleetwatch.collectors.gpu import GpuCollector
from fleetwatch.collectors.mig import SPECS as MIG_SPECS
from fleetwatch.collectors.mig import MigCollector
from fleetwatch.collectors.nvlink import PER_LINK_SPECS, NvLinkCollector
from fleetwatch.collectors.sources.nvml import Gpu, NvmlSource
from fleetwatch.collectors.sources.nvml_calls import (
    NvmlError,
    error_name,
    field_value,
    nvlink_error_counter,
)
from fleetwatch.collectors.sources.nvml_events import (
    create_event_set,
    free_events,
    ready_xids,
    register_xids,
)
from fleetwatch.collectors.sources.nvml_mig import read_mig
from fleetwatch.collectors.sources.podresources import DEFAULT_SOCKET
from fleetwatch.collectors.xid import XidCollector, XidLedger
from fleetwatch.exporter.render import Renderer
from fleetwatch.tainter.reset_job import RESET_SCRIPT
from testbed.nvml_timing import timed

# Capability bits (linux/capability.h) of the privileges docs/deploy.md names.
_CAPABILITIES = {"SYS_ADMIN": 21, "SYSLOG": 34, "PERFMON": 38}


def _first_line(path: str, prefix: str = "") -> str:
    """The first line of `path` starting with `prefix`, or why it could not be read."""
    try:
        with open(path) as lines:
            return next((line.strip() for line in lines if line.startswith(prefix)), "absent")
    except OSError as exc:
        return f"unreadable ({exc.strerror})"


def _opens(path: str, flags: int) -> str:
    try:
        os.close(os.open(path, flags | os.O_NONBLOCK))
    except OSError as exc:
        return f"no ({exc.strerror})"
    return "yes"


def print_privileges() -> None:
    """What this process may read on the node, source by source."""
    effective = int(_first_line("/proc/self/status", "CapEff:").split()[-1], 16)
    held = [name for name, bit in _CAPABILITIES.items() if effective >> bit & 1]
    print(f"uid {os.getuid()} gid {os.getgid()}; capabilities held: {held or 'none'}")
    print(
        "driver profiling restriction:",
        _first_line("/proc/driver/nvidia/params", "RmProfilingAdminOnly"),
    )
    print("kernel.dmesg_restrict:", _first_line("/proc/sys/kernel/dmesg_restrict"))
    print("/dev/kmsg opens for reading:", _opens("/dev/kmsg", os.O_RDONLY))
    for umad in sorted(Path("/dev/infiniband").glob("umad*")):
        mode = stat.filemode(umad.stat().st_mode)
        print(f"{umad} {mode} opens for read/write: {_opens(str(umad), os.O_RDWR)}")
    socket = DEFAULT_SOCKET
    try:
        present = socket.exists()
    except PermissionError:
        present = False
        print(f"{socket}: its directory admits no one but its owner")
    if present:
        print(f"{socket} writable (connect needs it): {os.access(socket, os.W_OK)}")


def attempt(collector: Collector) -> list[SeriesFamily]:
    """One collection; a collector that raises (GPM without the profiling privilege, say)
    is reported and the check goes on with the others."""
    try:
        return list(collector.collect())
    except Exception as exc:  # printed: the point of this script is to see what fails
        print(f"\n== {type(collector).__name__} failed: {type(exc).__name__}: {exc}")
        return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gap", type=float, default=5.0, help="seconds between the two cycles")
    parser.add_argument(
        "--reset-gpu",
        metavar="N|all",
        help="also reset GPU N (or every GPU) with the reset Job's script",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    latencies: dict[str, list[float]] = defaultdict(list)
    print_privileges()
    source = NvmlSource(lib=timed(pynvml, lambda call, s: latencies[call].append(s)))
    if not source.gpus():
        print("no NVIDIA driver or no GPU: nothing to check")
        return 1
    for gpu in source.gpus():
        print(f"GPU {gpu.index}: {gpu.identity}")
    print("\n== NVLink fabric (nvmlDeviceGetGpuFabricInfoV; NotSupported off NVL72)")
    for gpu in source.gpus():
        print(f"GPU {gpu.index}: {fabric_info(gpu)}")
    print("\n== MIG (nvmlDeviceGetMigMode and, in MIG mode, each instance; NotSupported: no MIG)")
    for gpu in source.gpus():
        print(f"GPU {gpu.index}: {read_mig(source, gpu)}")
    print(
        "\n== NVLink fields, batched (nvmlDeviceGetFieldValues, scopeId = link) beside the "
        "per-link calls: replay 161 | call, recovery 162 | call (batched by the exporter), "
        "CRC 163 | crc_flit call, crc_data call, state 165 | nvmlDeviceGetNvLinkState (165 "
        "batched by the exporter where it reads ACTIVE 1 or INACTIVE 0, which must agree with "
        "the call's 1 and 0; 163 stays a per-link call until hardware shows which call it "
        "agrees with)"
    )
    direct = NvmlSource(lib=pynvml)  # untimed: its batches call NVML's C function directly
    for gpu in source.gpus():
        for line in link_fields(source, gpu):
            print(f"GPU {gpu.index} {line}")
        same = direct.read_nvlinks(gpu, nvlink5=True) == source.read_nvlinks(gpu, nvlink5=True)
        print(f"GPU {gpu.index}: prepared batch reads the same as pynvml's call: {same}")
    print(
        "\n== Thermal margin (nvmlDeviceGetMarginTemperature; where the driver does not report "
        "it, the exporter derives slowdown threshold minus temperature)"
    )
    for gpu in source.gpus():
        print(f"GPU {gpu.index}: {thermal_margin(gpu)}")
    print(
        "\n== Xid events: one take as each run of the Xid collector makes it, on its lane "
        "(nvmlEventSetWait_v2 with a zero timeout until Timeout; none queued on a healthy GPU)"
    )
    print(xid_look(source))
    xid = XidCollector(source=source, kernel_log=None, ledger=XidLedger(window=10.0))
    collectors: list[Collector] = [
        GpuCollector(source=source, expected_count=None),
        GpmCollector(source=source),
        MigCollector(source=source),
        NvLinkCollector(source=source, nvlink5=True, per_gpu=False),
        xid,
    ]
    for collector in collectors:
        attempt(collector)
    time.sleep(args.gap)
    emitted: set[str] = set()
    for collector in collectors:
        started = time.perf_counter()
        families = attempt(collector)
        print(f"\n== {type(collector).__name__}: {(time.perf_counter() - started) * 1e3:.1f} ms")
        print(Renderer().render(families).decode())
        emitted |= {f.name for f in families}
    xid.close()
    print("\n== NVML call latency (calls, median ms, max ms)")
    for call, times in sorted(latencies.items()):
        median, worst = statistics.median(times) * 1e3, max(times) * 1e3
        print(f"{call:45s} {len(times):6d} {median:8.3f} {worst:8.3f}")
    specs = (*GPU_SPECS, *GPM_SPECS, *MIG_SPECS, *PER_LINK_SPECS)
    expected = {s.name.removesuffix("_total") for s in specs}
    print("\n== families this hardware did not produce (not supported, or nothing to count yet)")
    for name in sorted(expected - emitted):
        print(name)
    if args.reset_gpu is not None:
        return reset_gpu(args.reset_gpu)
    return 0


def xid_look(source: NvmlSource) -> str:
    """An event set made, every GPU registered for Xid events, the events queued for it
    taken without waiting, and the set freed (the calls of the Xid collector's take)."""
    if not source.gpus():
        return "no GPU to register"
    try:
        events = create_event_set(source)
        registered = [gpu.index for gpu in source.gpus() if register_xids(source, events, gpu)]
        started = time.perf_counter()
        taken = list(ready_xids(source, events))
        spent = (time.perf_counter() - started) * 1e3
        free_events(source, events)
    except NvmlError as exc:
        return f"failed: {exc}"
    return (
        f"GPUs registered for Xid events: {registered}; "
        f"{len(taken)} Xid events taken in {spent:.3f} ms: {taken}"
    )


def reset_gpu(which: str) -> int:
    """The reset Job's script with `GPU=which`: its exit status (3: a process holds a GPU,
    nothing reset; 4: no GPU listed), its output printed."""
    print(f"\n== GPU reset of {which} (the reset Job's script, fleetwatch.tainter.reset_job)")
    done = subprocess.run(
        ["sh", "-c", RESET_SCRIPT],
        env={**os.environ, "GPU": which},
        capture_output=True,
        text=True,
        check=False,
    )
    print(f"-> {done.returncode}\n{done.stdout}{done.stderr}".rstrip())
    return done.returncode


def fabric_info(gpu: Gpu) -> str:
    """The raw NVLink-fabric fields of one GPU, or the NVML error it answered."""
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    try:
        pynvml.nvmlDeviceGetGpuFabricInfoV(gpu.handle, ctypes.pointer(info))
    except pynvml.NVMLError as exc:
        return error_name(exc)
    return (
        f"state={info.state} status={info.status} cliqueId={info.cliqueId} "
        f"healthMask={info.healthMask:#x} clusterUuid={bytes(info.clusterUuid).hex()}"
    )


def link_fields(source: NvmlSource, gpu: Gpu) -> list[str]:
    """Per link: each link-scoped field value of one batched call beside the per-link call
    that reads the same counter or state, each value or the NVML error it answered; a
    counter the collector's direct C call (`nvlink_error_counter`) reads otherwise than
    pynvml's wrapper is shown with `direct` beside it."""
    fields = (
        pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
        pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
        pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
        pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
    )
    links = source.nvlinks(gpu)
    try:
        batch = pynvml.nvmlDeviceGetFieldValues(
            gpu.handle, [(field, link) for link in links for field in fields]
        )
    except pynvml.NVMLError as exc:
        return [f"batch: {error_name(exc)}"]

    def read(call: Callable[[], int]) -> str:
        try:
            return str(call())
        except pynvml.NVMLError as exc:
            return error_name(exc)

    direct = nvlink_error_counter(pynvml)

    def counter(link: int, which: int) -> str:
        wrapped = read(lambda: pynvml.nvmlDeviceGetNvLinkErrorCounter(gpu.handle, link, which))
        own = read(lambda: direct(gpu.handle, link, which))
        return wrapped if own == wrapped else f"{wrapped} (direct {own})"

    lines = []
    for n, link in enumerate(links):
        got = [field_value(value) for value in batch[n * len(fields) : (n + 1) * len(fields)]]
        calls = (
            counter(link, pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
            counter(link, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
            f"{counter(link, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)}, "
            f"{counter(link, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)}",
            read(lambda: pynvml.nvmlDeviceGetNvLinkState(gpu.handle, link)),  # noqa: B023
        )
        pairs = " ".join(f"{value} | {call};" for value, call in zip(got, calls, strict=True))
        lines.append(f"link {link}: {pairs}")
    return lines


def thermal_margin(gpu: Gpu) -> str:
    """The driver's margin to the slowdown limit, the slowdown threshold and the temperature
    of one GPU, each or the NVML error it answered: whether the margin is the driver's or
    derived, and whether the two agree."""

    def read(call: Callable[[], int]) -> str:
        try:
            return str(call())
        except pynvml.NVMLError as exc:
            return error_name(exc)

    margin = read(lambda: pynvml.nvmlDeviceGetMarginTemperature(gpu.handle))
    slowdown = read(
        lambda: pynvml.nvmlDeviceGetTemperatureThreshold(
            gpu.handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        )
    )
    temperature = read(
        lambda: pynvml.nvmlDeviceGetTemperature(gpu.handle, pynvml.NVML_TEMPERATURE_GPU)
    )
    return f"margin={margin} slowdown={slowdown} temperature={temperature}"


if __name__ == "__main__":
    sys.exit(main())
