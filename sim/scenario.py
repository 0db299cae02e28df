"""Scenario files: a simulated node and its timed faults (schema in docs/simulation.md).

A scenario is YAML. Loading validates every key and value and raises `ScenarioError`
naming the file, the key path and the reason, so a typo fails at start rather than
silently simulating something else. Only a regular file of at most 1 MiB is read, and
YAML aliases are refused: a scenario has no use for them, and they let a small file
expand into gigabytes (a "YAML bomb").
"""

from __future__ import annotations

import importlib.resources
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from fleetwatch.k8snames import is_label_key, is_label_value, is_node_name
from fleetwatch.shown import shown
from fleetwatch.sim.checks import Checker, ScenarioError
from fleetwatch.sim.fault_base import Fault
from fleetwatch.sim.fault_params import Hardware
from fleetwatch.sim.faults import FAULT_KINDS

__all__ = [
    "BUILTIN_PACKAGE",
    "LINK_LAYERS",
    "MAX_SCENARIO_BYTES",
    "Baseline",
    "HcaSpec",
    "MountSpec",
    "PodSpec",
    "Scenario",
    "ScenarioError",
    "builtin_names",
    "load_scenario",
    "parse_scenario",
]

LINK_LAYERS: Final = ("InfiniBand", "Ethernet")


@dataclass(frozen=True, kw_only=True)
class HcaSpec:
    """One host channel adapter (`mlx5_0`) with its ports."""

    device: str
    ports: int = 1
    rate_gbps: int = 400
    link_layer: str = "InfiniBand"
    expected_rate_gbps: int | None = None


@dataclass(frozen=True, kw_only=True)
class MountSpec:
    """A simulated checkpoint mount: a network filesystem the training job saves to.

    A save starts every `checkpoint_every_seconds` (from t=0) and writes at
    `write_bytes_per_second` for `checkpoint_seconds`; a fault can slow, stop or hang it.
    """

    mountpoint: str
    fstype: str = "nfs4"
    server: str = "10.0.0.5"
    export: str = "/export/checkpoints"
    size_bytes: float = 100e12
    free_bytes: float = 60e12
    write_bytes_per_second: float = 2e9
    checkpoint_every_seconds: float = 120.0
    checkpoint_seconds: float = 20.0

    @property
    def source(self) -> str:
        """The mount's source as mountinfo writes it (`SERVER:/EXPORT`)."""
        return f"{self.server}:{self.export}"


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """Steady-state readings every simulated GPU starts from."""

    temperature_celsius: float = 62.0
    memory_temperature_celsius: float = 70.0
    tensor_active: float = 0.55
    sm_active: float = 0.8
    utilization: float = 1.0
    power_watts: float = 550.0
    power_limit_watts: float = 700.0
    memory_used_ratio: float = 0.85


@dataclass(frozen=True, kw_only=True)
class PodSpec:
    """A pod on the simulated node holding some of its GPUs (what the kubelet reports), with
    the labels kube-state-metrics would export for it (they name its training job)."""

    namespace: str
    name: str
    container: str
    gpus: tuple[int, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    claim: str = ""
    """The DRA ResourceClaim its GPUs come from; empty: from the device plugin."""


MIG_SLOTS: Final = 7
"""MIG devices a GPU can hold (`nvmlDeviceGetMaxMigDeviceCount` on A100/H100/B200)."""
_MIG_PROFILE: Final = re.compile(r"^([1-7])g\.([1-9][0-9]{0,2})gb$")


@dataclass(frozen=True, kw_only=True)
class MigSpec:
    """The scenario's MIG layout: which GPUs start in MIG mode, and the instances a GPU in
    MIG mode holds (all of one profile; a `mig_mode` fault switches a GPU later)."""

    gpus: tuple[int, ...]
    profile: str
    instances: int

    @property
    def memory_mib(self) -> int:
        """Framebuffer of one instance, from its profile (`3g.40gb`: 40 GiB)."""
        match = _MIG_PROFILE.match(self.profile)
        assert match is not None  # checked when parsed
        return int(match.group(2)) * 1024


def _parse_mig(check: Checker, raw: Any, gpus: int) -> MigSpec | None:
    if raw is None:
        return None
    data = check.mapping(raw, "mig")
    check.keys(data, "mig", frozenset({"profile"}), frozenset({"gpus", "profile", "instances"}))
    profile = check.string(data["profile"], "mig.profile")
    if not _MIG_PROFILE.match(profile):
        raise check.fail("mig.profile", f"{shown(profile)} is not a MIG profile like 1g.10gb")
    raw_gpus = data.get("gpus", [])
    if not isinstance(raw_gpus, list):
        raise check.fail("mig.gpus", "expected a list of GPU indices")
    return MigSpec(
        gpus=tuple(
            check.integer(g, f"mig.gpus[{i}]", low=0, high=gpus - 1) for i, g in enumerate(raw_gpus)
        ),
        profile=profile,
        instances=check.integer(data.get("instances", 1), "mig.instances", low=1, high=MIG_SLOTS),
    )


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A simulated node: its hardware and the faults that happen to it."""

    name: str
    source: str
    gpus: int
    gpu_model: str
    nvlinks_per_gpu: int
    infiniband: tuple[HcaSpec, ...]
    baseline: Baseline
    faults: tuple[Fault, ...]
    gpm_supported: bool = True
    nvlink5_counters: bool = False
    driver_version: str = "550.90.07"
    description: str = ""
    pods: tuple[PodSpec, ...] = ()
    mounts: tuple[MountSpec, ...] = ()
    mig: MigSpec | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


_TOP_REQUIRED: Final = frozenset({"gpus", "gpu_model", "nvlinks_per_gpu", "infiniband"})
_TOP_ALLOWED: Final = _TOP_REQUIRED | {
    "baseline",
    "faults",
    "gpm_supported",
    "nvlink5_counters",
    "driver_version",
    "description",
    "pods",
    "mounts",
    "mig",
    "extra",
}
BUILTIN_PACKAGE: Final = "fleetwatch.sim.scenarios"
# A scenario describes one node and its faults: a few KiB. The cap turns a wrong path
# (a log, an image) into a clear error instead of a long parse.
MAX_SCENARIO_BYTES: Final = 1024 * 1024


def _parse_hca(check: Checker, raw: Any, key: str) -> HcaSpec:
    data = check.mapping(raw, key)
    check.keys(
        data,
        key,
        frozenset({"device"}),
        frozenset({"device", "ports", "rate_gbps", "link_layer", "expected_rate_gbps"}),
    )
    device = check.string(data["device"], f"{key}.device")
    if not device.replace("_", "").isalnum():
        raise check.fail(f"{key}.device", f"{shown(device)} is not a device name like mlx5_0")
    expected = data.get("expected_rate_gbps")
    return HcaSpec(
        device=device,
        ports=check.integer(data.get("ports", 1), f"{key}.ports", low=1, high=4),
        rate_gbps=check.integer(data.get("rate_gbps", 400), f"{key}.rate_gbps", low=1, high=1600),
        link_layer=check.string(
            data.get("link_layer", "InfiniBand"), f"{key}.link_layer", choices=LINK_LAYERS
        ),
        expected_rate_gbps=None
        if expected is None
        else check.integer(expected, f"{key}.expected_rate_gbps", low=1, high=1600),
    )


# Mount keys with their bounds; fstype, server and export are names (no blanks).
_MOUNT_NUMBERS: Final = {
    "size_bytes": (1.0, 1e18),
    "free_bytes": (0.0, 1e18),
    "write_bytes_per_second": (0.0, 1e13),
    "checkpoint_every_seconds": (1.0, 1e7),
    "checkpoint_seconds": (0.0, 1e7),
}
_MOUNT_NAMES: Final = ("fstype", "server", "export")


def _parse_mounts(check: Checker, raw: Any) -> tuple[MountSpec, ...]:
    """`mounts:`: absolute, unique mount points; free space within the size; a save shorter
    than the time between saves."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise check.fail("mounts", "expected a list of mounts")
    mounts: list[MountSpec] = []
    for i, item in enumerate(raw):
        key = f"mounts[{i}]"
        data = check.mapping(item, key)
        check.keys(
            data,
            key,
            frozenset({"mountpoint"}),
            frozenset({"mountpoint", *_MOUNT_NAMES, *_MOUNT_NUMBERS}),
        )
        point = check.string(data["mountpoint"], f"{key}.mountpoint")
        if not point.startswith("/") or os.path.normpath(point) != point or " " in point:
            raise check.fail(
                f"{key}.mountpoint", f"{shown(point)} is not a normalised absolute path"
            )
        if any(m.mountpoint == point for m in mounts):
            raise check.fail(f"{key}.mountpoint", f"{point} is listed twice")
        values: dict[str, Any] = {"mountpoint": point}
        for name in _MOUNT_NAMES:
            if name in data:
                text = check.string(data[name], f"{key}.{name}")
                if any(c.isspace() for c in text):
                    raise check.fail(f"{key}.{name}", f"{shown(text)} contains blanks")
                values[name] = text
        for name, (low, high) in _MOUNT_NUMBERS.items():
            if name in data:
                values[name] = check.number(data[name], f"{key}.{name}", low=low, high=high)
        mount = MountSpec(**values)
        if mount.free_bytes > mount.size_bytes:
            raise check.fail(f"{key}.free_bytes", "more than size_bytes")
        if mount.checkpoint_seconds >= mount.checkpoint_every_seconds:
            raise check.fail(
                f"{key}.checkpoint_seconds", "a save must end before the next one starts"
            )
        mounts.append(mount)
    return tuple(mounts)


def _parse_baseline(check: Checker, raw: Any) -> Baseline:
    data = check.mapping(raw, "baseline")
    limits: dict[str, tuple[float, float]] = {
        "temperature_celsius": (0, 120),
        "memory_temperature_celsius": (0, 120),
        "tensor_active": (0, 1),
        "sm_active": (0, 1),
        "utilization": (0, 1),
        "power_watts": (0, 2000),
        "power_limit_watts": (1, 2000),
        "memory_used_ratio": (0, 1),
    }
    check.keys(data, "baseline", frozenset(), frozenset(limits))
    values = {
        name: check.number(value, f"baseline.{name}", low=limits[name][0], high=limits[name][1])
        for name, value in data.items()
    }
    return Baseline(**values)


def _parse_fault(
    check: Checker, raw: Any, key: str, hardware: Hardware, kinds: Mapping[str, type[Fault]]
) -> Fault:
    """One `faults[]` entry: its kind's type checks and builds it."""
    data = check.mapping(raw, key)
    kind = check.string(data.get("kind"), f"{key}.kind", choices=tuple(kinds))
    return kinds[kind].parse(check, data, key, hardware)


def _parse_pods(check: Checker, raw: Any, gpus: int) -> tuple[PodSpec, ...]:
    """`pods:`: each GPU index in range and held by one pod at most; Kubernetes names."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise check.fail("pods", "expected a list of pods")
    pods, held = [], set()
    for i, item in enumerate(raw):
        key = f"pods[{i}]"
        data = check.mapping(item, key)
        check.keys(
            data,
            key,
            frozenset({"namespace", "name", "gpus"}),
            frozenset({"namespace", "name", "gpus", "container", "labels", "claim"}),
        )
        names = {}
        for part in ("namespace", "name", "container", "claim"):
            if part == "claim" and part not in data:
                names[part] = ""
                continue
            value = check.string(data.get(part, "main"), f"{key}.{part}")
            if not is_node_name(value):
                raise check.fail(f"{key}.{part}", f"{shown(value)} is not a Kubernetes name")
            names[part] = value
        if not isinstance(data["gpus"], list) or not data["gpus"]:
            raise check.fail(f"{key}.gpus", "expected a non-empty list of GPU indices")
        indices = []
        for j, gpu in enumerate(data["gpus"]):
            index = check.integer(gpu, f"{key}.gpus[{j}]", low=0, high=gpus - 1)
            if index in held:
                raise check.fail(f"{key}.gpus[{j}]", f"GPU {index} is held by another pod")
            held.add(index)
            indices.append(index)
        labels = check.mapping(data.get("labels", {}), f"{key}.labels")
        for label, value in labels.items():
            if not isinstance(label, str) or not is_label_key(label):
                raise check.fail(f"{key}.labels", f"{shown(label)} is not a label key")
            if not isinstance(value, str) or not is_label_value(value):
                raise check.fail(f"{key}.labels.{label}", f"{shown(value)} is not a label value")
        pods.append(
            PodSpec(
                namespace=names["namespace"],
                name=names["name"],
                container=names["container"],
                gpus=tuple(indices),
                labels=dict(labels),
                claim=names["claim"],
            )
        )
    return tuple(pods)


def parse_scenario(
    data: Any, *, source: str, name: str, kinds: Mapping[str, type[Fault]] = FAULT_KINDS
) -> Scenario:
    """Validate parsed YAML and build a Scenario; raises ScenarioError naming file/key/reason.

    `kinds` are the fault kinds a scenario may name (every kind the simulator has)."""
    check = Checker(source)
    top = check.mapping(data, "(top level)")
    check.keys(top, "", _TOP_REQUIRED, frozenset(_TOP_ALLOWED))
    top["gpus"] = check.integer(top["gpus"], "gpus", low=0, high=72)
    top["nvlinks_per_gpu"] = check.integer(
        top["nvlinks_per_gpu"], "nvlinks_per_gpu", low=0, high=36
    )
    raw_hcas = top["infiniband"] if top["infiniband"] is not None else []
    if not isinstance(raw_hcas, list):
        raise check.fail("infiniband", "expected a list of HCAs")
    hcas = tuple(_parse_hca(check, h, f"infiniband[{i}]") for i, h in enumerate(raw_hcas))
    names = [h.device for h in hcas]
    if len(set(names)) != len(names):
        raise check.fail("infiniband", "device names must be unique")
    raw_faults = top.get("faults") or []
    if not isinstance(raw_faults, list):
        raise check.fail("faults", "expected a list of faults")
    mounts = _parse_mounts(check, top.get("mounts"))
    hardware = Hardware(
        gpus=top["gpus"],
        nvlinks_per_gpu=top["nvlinks_per_gpu"],
        ports={h.device: h.ports for h in hcas},
        mounts=tuple(m.mountpoint for m in mounts),
    )
    faults = tuple(
        _parse_fault(check, f, f"faults[{i}]", hardware, kinds) for i, f in enumerate(raw_faults)
    )
    extra = top.get("extra", {})
    return Scenario(
        name=name,
        source=source,
        gpus=top["gpus"],
        gpu_model=check.string(top["gpu_model"], "gpu_model"),
        nvlinks_per_gpu=top["nvlinks_per_gpu"],
        infiniband=hcas,
        baseline=_parse_baseline(check, top.get("baseline") or {}),
        faults=tuple(sorted(faults, key=lambda f: f.at)),
        gpm_supported=check.boolean(top.get("gpm_supported", True), "gpm_supported"),
        nvlink5_counters=check.boolean(top.get("nvlink5_counters", False), "nvlink5_counters"),
        driver_version=check.string(top.get("driver_version", "550.90.07"), "driver_version"),
        description=str(top.get("description", "")),
        pods=_parse_pods(check, top.get("pods"), top["gpus"]),
        mounts=mounts,
        mig=_parse_mig(check, top.get("mig"), top["gpus"]),
        extra=check.mapping(extra, "extra"),
    )


def builtin_names() -> list[str]:
    """Names of the scenarios shipped with fleetwatch."""
    files = importlib.resources.files(BUILTIN_PACKAGE).iterdir()
    return sorted(f.name.removesuffix(".yaml") for f in files if f.name.endswith(".yaml"))


def load_scenario(spec: str) -> Scenario:
    """Load a built-in scenario by name, or a scenario file by path."""
    if spec in builtin_names():
        resource = importlib.resources.files(BUILTIN_PACKAGE) / f"{spec}.yaml"
        text, source, name = resource.read_text(), f"built-in scenario {spec}", spec
    else:
        path = Path(spec)
        text, source, name = _read_scenario_file(path), str(path), path.stem
    try:
        data = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError as exc:
        raise ScenarioError(f"{source}: not valid YAML: nested too deep") from exc
    # PyYAML's int() of a number of thousands of digits (ValueError), or a YAML error, which
    # quotes a tag or key whole: an excerpt, one readable line of the log
    except (ValueError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{source}: not valid YAML: {str(exc)[:400]}") from exc
    return parse_scenario(data, source=source, name=name)


def _read_scenario_file(path: Path) -> str:
    """The text of a scenario file: a regular file of at most MAX_SCENARIO_BYTES.

    The file is opened non-blocking and checked with fstat before reading, so a FIFO or a
    device such as /dev/zero is rejected at once instead of blocking or being read forever.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        known = ", ".join(builtin_names())
        raise ScenarioError(
            f"{path}: cannot read scenario ({exc.strerror}); built-in scenarios: {known}"
        ) from exc
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ScenarioError(f"{path}: a scenario must be a regular file")
        data = file.read(MAX_SCENARIO_BYTES + 1)
    if len(data) > MAX_SCENARIO_BYTES:
        raise ScenarioError(
            f"{path}: scenario larger than {MAX_SCENARIO_BYTES // 1024} KiB; "
            "scenarios describe one node and a few faults"
        )
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


class _NoAliasLoader(yaml.SafeLoader):
    """A SafeLoader that rejects aliases, so a small file cannot expand into a huge one."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in the stubs
            raise yaml.composer.ComposerError(
                None,
                None,
                f"aliases (*{event.anchor}) are not allowed in scenario files",
                event.start_mark,
            )
        return super().compose_node(parent, index)
