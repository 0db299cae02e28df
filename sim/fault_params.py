"""The keys of a scenario's fault entry: what each means, its bounds, and how it is checked.

A fault kind (fault_base.py) declares each key as one of its dataclass fields, the field's
metadata holding the key's `Param` (`field(metadata=number(...))`): the field's name is the
key, its type the value's, and a field without a default a required key. `Param` gives the
meaning and bounds that docs/simulation.md's fault table prints and the check a value
passes, against the scenario's hardware (a GPU index, an NVLink, an HCA and its ports, a
mount), with the `ScenarioError` wording of the rest of the scenario.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from fleetwatch.sim.checks import Checker

# The metadata key under which a fault's field holds its `Param`.
_PARAM: Final = "fleetwatch.sim.fault_param"


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """What a fault may refer to: the scenario's GPU count, NVLinks per GPU and HCA ports."""

    gpus: int
    nvlinks_per_gpu: int
    ports: Mapping[str, int]
    """Port count per HCA device name, in scenario order."""
    mounts: tuple[str, ...] = ()
    """Mount points of the scenario's `mounts:`."""


Parse = Callable[[Checker, Any, str, Hardware], Any]


@dataclass(frozen=True, kw_only=True)
class Param:
    """A fault key's meaning and bounds (for the docs) and how a value is checked."""

    meaning: str
    bounds: str
    parse: Parse


@dataclass(frozen=True, kw_only=True)
class Key:
    """A key of one fault kind, as the docs' table and the scenario loader read it."""

    name: str
    param: Param
    required: bool


ParamMetadata = Mapping[str, Param]
"""A field's metadata that makes it a fault key: `field(metadata=...)`."""


def keys_of(kind: type[Any]) -> tuple[Key, ...]:
    """The keys of a fault kind, in field order: its fields that carry a `Param`, required
    where the field has no default."""
    return tuple(
        Key(
            name=f.name,
            param=f.metadata[_PARAM],
            required=f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(kind)
        if _PARAM in f.metadata
    )


def param(meaning: str, bounds: str, parse: Parse) -> ParamMetadata:
    """A key of any other type: its meaning, bounds as the docs write them, and its check."""
    return types.MappingProxyType({_PARAM: Param(meaning=meaning, bounds=bounds, parse=parse)})


def _figure(value: float) -> str:
    """A bound as the docs write it: `130`, `0.5`, `1e7`."""
    if value >= 1e5:
        return f"{value:.0e}".replace("e+0", "e").replace("e+", "e")
    return str(int(value)) if value == int(value) else f"{value:g}"


def number(meaning: str, *, low: float, high: float) -> ParamMetadata:
    """A number within `low..high`."""
    return param(
        meaning,
        f"{_figure(low)}..{_figure(high)}",
        lambda check, value, key, _hw: check.number(value, key, low=low, high=high),
    )


def integer(meaning: str, *, low: int, high: int) -> ParamMetadata:
    """An integer within `low..high`."""
    return param(
        meaning,
        f"{low}..{high}",
        lambda check, value, key, _hw: check.integer(value, key, low=low, high=high),
    )


def choice(meaning: str, choices: tuple[str, ...]) -> ParamMetadata:
    """One of a fixed set of names."""
    return param(
        meaning,
        ", ".join(f"`{c}`" for c in choices),
        lambda check, value, key, _hw: check.string(value, key, choices=choices),
    )


GPU: Final = param(
    "GPU index",
    "0..`gpus`-1",
    lambda check, value, key, hw: check.integer(value, key, low=0, high=hw.gpus - 1),
)
NVLINK: Final = param(
    "NVLink index",
    "0..`nvlinks_per_gpu`-1",
    lambda check, value, key, hw: check.integer(value, key, low=0, high=hw.nvlinks_per_gpu - 1),
)
DEVICE: Final = param(
    "HCA",
    "an `infiniband` device",
    lambda check, value, key, hw: check.string(value, key, choices=tuple(hw.ports)),
)
PORT: Final = param(
    "port of the HCA",
    "1..its `ports`",
    # Checked against the HCA's `ports` once the device is known (`PortFault`).
    lambda check, value, key, _hw: check.integer(value, key, low=1, high=4),
)
MOUNTPOINT: Final = param(
    "simulated mount",
    "a `mounts` mount point",
    lambda check, value, key, hw: check.string(value, key, choices=hw.mounts),
)
SECONDS: Final = number("how long it lasts (absent: to the end)", low=0, high=1e7)
PER_SECOND: Final = number("errors counted per second", low=0, high=1e9)
