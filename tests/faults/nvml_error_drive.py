"""Every NVML call the GPU and Xid collectors make, failing with every NVML error code, on the
mock NVML.

Run as its own process (`python -m tests.faults.nvml_error_drive`), by
`tests/faults/test_nvml_error_codes.py`: it loads NVIDIA's mock NVML (FLEETWATCH_NVML_MOCK,
H100 profile) into this process, which the test process must not do (pynvml keeps the library
it loaded for good, and other tests expect no driver). It builds the exporter's own NVML
collectors (`fleetwatch.exporter.export.create_collectors`, the flags of `fleetwatch export`)
on the real pynvml seen through `FailingNvml`, which makes one NVML function raise one
`NVMLError` code, for one GPU's handle (GPU 2) or, for a call that takes no GPU handle, for
every call.

First a clean cycle records which collector calls which function, and the series each
exports. Then, for every (function, code) pair, including a code pynvml has never heard of,
each collector that calls the function runs one cycle with the fault and one after it is
lifted. The calls made once, when NVML starts and the GPUs are first identified, fail in the
first cycle of a fresh collector on a context of its own. Printed as JSON: the pairs tried,
and each broken expectation:
- `escaped`: something that is not an `Exception` left `collect()` (it would end the
  collector's worker thread; an `Exception` is the engine's to report as the collector down);
- `others`: with a fault on GPU 2's handle, another GPU's series changed;
- `extra`: a series the clean cycle did not export (a value made up from the failure);
- `stale`: GPU 2's series kept while its call failed with a code that is an error (the value
  is absent, or the whole GPU dropped for `GPU_IS_LOST`, never the last value again);
- `uncounted`: an error code (not "not supported", not a lost GPU) neither counted in the
  collector's `*_nvml_errors_total{call,error}`, nor raised naming the call, nor leaving the
  GPU (or, for NVML's start, every GPU) out, which `fleetwatch_gpus_visible` shows;
- `unbounded`: an `error` label value that is not one of NVML's error names;
- `not_back`: the cycle after the fault is lifted lacks a series of the clean cycle.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from fleetwatch.cli import parse_args
from fleetwatch.collectors import COLLECTORS
from fleetwatch.collectors.base import CollectorContext
from fleetwatch.collectors.sources.nvml_calls import ABSENT, error_name
from fleetwatch.exporter.export import create_collectors
from fleetwatch.exporter.settings import ExportSettings
from testbed.nvmlmock import LIBRARY, NON_NVML, NvmlMock

FAULTY_GPU = 2
UNKNOWN_CODE = 12345  # a code no NVML release has defined
Key = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class Fault:
    call: str
    code: int


@dataclass
class FailingNvml:
    """pynvml, with `fault` (when set) raised by its function for GPU 2's handle, or for every
    call of a function that takes no GPU handle; `called` records which functions ran."""

    lib: Any
    fault: Fault | None = None
    fired: int = 0  # faults raised
    called: set[str] = field(default_factory=set)
    per_gpu: set[str] = field(default_factory=set)  # functions called with a GPU handle
    handles: dict[int, int] = field(default_factory=dict)  # handle address -> index

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.lib, name)
        if not (name.startswith("nvml") and callable(attr)):
            return attr
        return self._wrapped(name, attr)

    def _gpu_of(self, name: str, args: tuple[Any, ...]) -> int | None:
        if name == "nvmlDeviceGetHandleByIndex":
            return int(args[0])
        if not args or not isinstance(args[0], self.lib.c_nvmlDevice_t):
            return None
        return self.handles.get(ctypes.cast(args[0], ctypes.c_void_p).value or 0, -1)

    def _wrapped(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.called.add(name)
            gpu = self._gpu_of(name, args)
            if gpu is not None:
                self.per_gpu.add(name)
            fault = self.fault
            if fault is not None and fault.call == name and gpu in (None, FAULTY_GPU):
                self.fired += 1
                raise self.lib.NVMLError(fault.code)
            result = function(*args, **kwargs)
            if name == "nvmlDeviceGetHandleByIndex":
                self.handles[ctypes.cast(result, ctypes.c_void_p).value or 0] = int(args[0])
            return result

        return call


def series(families: list[Any]) -> set[Key]:
    return {
        (family.spec.name, tuple(sorted(labels.items())))
        for family in families
        for labels, value in zip(family.labels, family.values, strict=True)
        if value is not None
    }


def error_series(keys: set[Key]) -> set[tuple[str, str]]:
    """(call, error) of every `*_nvml_errors_total` series."""
    found = set()
    for name, labels in keys:
        if name.endswith("nvml_errors_total"):
            as_dict = dict(labels)
            found.add((as_dict.get("call", ""), as_dict.get("error", "")))
    return found


def gpu_of(key: Key) -> str | None:
    return dict(key[1]).get("gpu")


def cycle(collector: Any) -> tuple[set[Key] | None, BaseException | None]:
    try:
        return series(list(collector.collect())), None
    except BaseException as exc:  # sorted by the caller: an Exception is the engine's
        return None, exc


def export_settings() -> ExportSettings:
    """`fleetwatch export`'s settings with only the NVML collectors (the Xid collector's
    NVML events included, its default source)."""
    empty = Path(tempfile.mkdtemp())
    args = parse_args(
        [
            "export",
            *NON_NVML,
            f"--path.sysfs={empty}",
            f"--path.procfs={empty}",
        ]
    )
    return ExportSettings.from_args(args, COLLECTORS)


def context_on(nvml: FailingNvml, settings: ExportSettings) -> CollectorContext:
    return CollectorContext(
        sysfs_root=settings.sysfs_root,
        procfs_root=settings.procfs_root,
        rootfs_root=settings.rootfs_root,
        nvml=nvml,
    )


def build(nvml: FailingNvml) -> dict[str, Any]:
    """The exporter's NVML collectors, sharing one context (one NVML source) as it does."""
    settings = export_settings()
    return create_collectors(context_on(nvml, settings), settings)


def fresh(name: str, nvml: FailingNvml, settings: ExportSettings) -> tuple[CollectorContext, Any]:
    """The collector `name` alone, on a context of its own (it starts NVML itself)."""
    context = context_on(nvml, settings)
    spec = next(spec for spec in COLLECTORS if spec.name == name)
    return context, spec.create(context, settings.collectors[name])


def codes(lib: Any) -> list[tuple[int, str]]:
    """Every NVML error code pynvml names, and one it does not; "not supported" last, since
    the source stops asking a GPU for what it once said it does not support."""
    known = [(int(getattr(lib, n)), n) for n in sorted(dir(lib)) if n.startswith("NVML_ERROR_")]
    known.append((UNKNOWN_CODE, "unknown"))
    return sorted(known, key=lambda code: isinstance(lib.NVMLError(code[0]), ABSENT))


def main() -> int:
    mock = NvmlMock.from_environment()
    if "MOCK_NVML_CONFIG" not in os.environ:
        # The mock (Go) reads the environment the process started with: start again with it.
        overrides = Path(tempfile.mkdtemp()) / "overrides.yaml"
        overrides.write_text("version: 1\n")
        os.environ["MOCK_NVML_CONFIG"] = str(mock.profile("h100"))
        os.environ["MOCK_NVML_OVERRIDES"] = str(overrides)
        os.execv(sys.executable, [sys.executable, "-m", __spec__.name])
    ctypes.CDLL(str(mock.root / LIBRARY), mode=ctypes.RTLD_GLOBAL)  # found by its soname
    report = Report(names={error_name(pynvml.NVMLError(code)) for code, _ in codes(pynvml)})
    steady(report)
    startup(report)
    print(json.dumps({**dataclasses.asdict(report), "names": sorted(report.names)}))
    return 0


@dataclass
class Report:
    """What the drive tried and found; printed as JSON."""

    names: set[str]
    tried: int = 0
    untried: list[str] = field(default_factory=list)
    pairs: int = 0  # (call, collector) pairs of every cycle
    calls: list[str] = field(default_factory=list)
    startup_tried: int = 0
    startup_pairs: int = 0  # (call, collector) pairs made once, when a GPU is first seen
    startup_calls: list[str] = field(default_factory=list)
    codes: int = 0
    broken: list[dict[str, Any]] = field(default_factory=list)

    def judge(
        self,
        where: dict[str, str],
        *,
        nvml: FailingNvml,
        fault: Fault,
        faulty: tuple[set[Key] | None, BaseException | None],
        clean: tuple[set[Key], set[Key]],
        after: set[Key] | None,
    ) -> None:
        """Record what broke in one faulty cycle (`faulty`: its series or what it raised),
        against a clean cycle at the same point (`clean[0]`), and in the cycle `after` it,
        against a settled clean cycle (`clean[1]`)."""
        keys, error = faulty
        problems = check(
            clean=clean[0],
            keys=keys,
            error=error,
            fault=fault,
            per_gpu=fault.call in nvml.per_gpu,
            names=self.names,
        )
        problems += back(clean[1], after, fault.code)
        self.broken.extend({**where, "problem": p, "detail": d} for p, d in problems)


def steady(report: Report) -> None:
    """Every call of a running cycle, failing in a cycle of the running collectors."""
    nvml = FailingNvml(lib=pynvml)
    collectors = build(nvml)
    calls: dict[str, set[str]] = {}
    for name, collector in collectors.items():
        for _ in range(2 if name == "gpm" else 1):  # GPM: a first sample, then its 2nd buffer
            cycle(collector)
        nvml.called.clear()
        keys, error = cycle(collector)
        if keys is None:
            raise SystemExit(f"{name} failed on the clean mock: {error!r}")
        calls[name] = set(nvml.called)
    report.calls = sorted(set().union(*calls.values()))
    report.pairs = sum(len(c) for c in calls.values())
    report.codes = len(codes(pynvml))
    for call in report.calls:
        for code, code_name in codes(pynvml):
            for name, collector in collectors.items():
                if call not in calls[name]:
                    continue
                before, _ = cycle(collector)
                nvml.fault, fired = Fault(call=call, code=code), nvml.fired
                keys, error = cycle(collector)
                nvml.fault = None
                if nvml.fired == fired:  # asked no more: "not supported" before, or lost
                    report.untried.append(f"{call} {code_name} ({name})")
                    continue
                report.tried += 1
                report.judge(
                    {"call": call, "code": code_name, "collector": name},
                    nvml=nvml,
                    fault=Fault(call=call, code=code),
                    faulty=(keys, error),
                    clean=(before or set(), before or set()),
                    after=settle(collector, name),
                )
    for collector in collectors.values():
        collector.close()


def startup(report: Report) -> None:
    """Every call a collector makes only when it first sees the GPUs (NVML's start, the
    handles, identities, limits), failing then: each time a fresh context and collector, and
    the cycle after it must have every series again (the start is tried again)."""
    settings = export_settings()
    for name in ("gpu", "gpm", "mig", "nvlink", "xid"):
        nvml = FailingNvml(lib=pynvml)
        context, collector = fresh(name, nvml, settings)
        first, _ = cycle(collector)
        made = set(nvml.called)
        clean = settle(collector, name)
        nvml.called.clear()
        cycle(collector)  # a steady cycle: what it calls is driven in `steady`
        # The start is the NVML source's, shared: each call is driven with the first
        # collector that makes it.
        once = sorted(made - nvml.called - set(report.startup_calls))
        collector.close()
        context.close()
        report.startup_calls = sorted({*report.startup_calls, *once})
        report.startup_pairs += len(once)
        for call in once:
            for code, code_name in codes(pynvml):
                nvml = FailingNvml(lib=pynvml, fault=Fault(call=call, code=code))
                context, collector = fresh(name, nvml, settings)
                keys, error = cycle(collector)
                nvml.fault = None
                if nvml.fired:
                    report.startup_tried += 1
                    report.judge(
                        {"call": call, "code": code_name, "collector": name, "when": "start"},
                        nvml=nvml,
                        fault=Fault(call=call, code=code),
                        faulty=(keys, error),
                        clean=(first or set(), clean or set()),
                        after=settle(collector, name),
                    )
                else:
                    report.untried.append(f"{call} {code_name} ({name}, at start)")
                collector.close()
                context.close()


def settle(collector: Any, name: str) -> set[Key] | None:
    """The next cycle's series (the second for GPM: its ratios need a new pair of samples)."""
    after, _ = cycle(collector)
    if name == "gpm":
        after, _ = cycle(collector)
    return after


def back(before: set[Key], after: set[Key] | None, code: int) -> list[tuple[str, Any]]:
    """`not_back` when the cycle after the fault lacks a series of `before`. "Not supported"
    is the GPU's answer for good where the source remembers it (fabric info, GPM support,
    limits): only the faulty GPU's series may stay away then."""
    absent = isinstance(pynvml.NVMLError(code), ABSENT)
    expected = {k for k in before if not (absent and gpu_of(k) == str(FAULTY_GPU))}
    if after is not None and expected <= after:
        return []
    return [("not_back", sorted(map(str, expected - (after or set())))[:3])]


def check(
    *,
    clean: set[Key],
    keys: set[Key] | None,
    error: BaseException | None,
    fault: Fault,
    per_gpu: bool,
    names: set[str],
) -> list[tuple[str, Any]]:
    """The broken expectations of one faulty cycle."""
    exc = pynvml.NVMLError(fault.code)
    absent, lost, call = (
        isinstance(exc, ABSENT),
        isinstance(exc, pynvml.NVMLError_GpuIsLost),
        fault.call,
    )
    # A zero-timeout event wait answers Timeout when no event is queued: not an error.
    none_queued = call == "nvmlEventSetWait_v2" and isinstance(exc, pynvml.NVMLError_Timeout)
    if keys is None:
        if not isinstance(error, Exception):
            return [("escaped", repr(error))]
        if absent or lost or call in str(error):
            return []
        return [("uncounted", f"raised {error!r}")]
    problems: list[tuple[str, Any]] = []
    errors = error_series(keys)
    faulty = str(FAULTY_GPU)
    extra = {k for k in keys - clean if not k[0].endswith("nvml_errors_total")}
    if absent:  # what the GPU does not support is left out of its info, e.g. `serial=""`
        extra = {k for k in extra if gpu_of(k) != faulty}
    if extra:
        problems.append(("extra", sorted(map(str, extra))[:3]))
    if {e for _, e in errors} - names:
        problems.append(("unbounded", sorted(errors)))
    gone = not any(gpu_of(k) == faulty for k in keys)  # the whole GPU left out
    if per_gpu:
        others_now = {k for k in keys if gpu_of(k) not in (faulty, None)}
        others_clean = {k for k in clean if gpu_of(k) not in (faulty, None)}
        if others_now != others_clean:
            problems.append(("others", sorted(map(str, others_now ^ others_clean))[:3]))
        its_clean = {k for k in clean if gpu_of(k) == faulty}
        if not absent and its_clean and {k for k in keys if gpu_of(k) == faulty} == its_clean:
            problems.append(("stale", "every series of GPU 2 kept"))
    elif not any(gpu_of(k) is not None for k in keys):
        gone = True  # no GPU at all: NVML did not start (no driver), logged once
    # Visible: counted by call and error, or the GPU (or every GPU) left out, which
    # fleetwatch_gpus_visible shows and the log says once.
    if not (absent or lost or gone or none_queued) and not any(c == call for c, _ in errors):
        problems.append(("uncounted", sorted(errors)))
    return problems


if __name__ == "__main__":
    sys.exit(main())
