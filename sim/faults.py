"""Simulator fault kinds by name: `FAULT_KINDS`, the one list a scenario's `faults:` draws on.

A scenario's `faults:` list names a kind per entry; `FAULT_KINDS` maps the kind to its type.
The kinds live by area (gpu_faults.py, fabric_faults.py, mount_faults.py); each is one
frozen dataclass deriving from `Fault` (fault_base.py) whose fields declare its scenario keys
with their meaning, bounds and check (fault_params.py), whose docstring says what it does to
the simulated node, and whose overridden hooks are that effect. docs/simulation.md's fault
table is generated from this list, in its order. A new kind is its class in its area's
module plus its entry here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from fleetwatch.sim.fabric_faults import (
    FabricDegraded,
    IbErrors,
    IbPortDown,
    IbRate,
    NvlinkDown,
    NvlinkErrors,
)
from fleetwatch.sim.fault_base import Fault
from fleetwatch.sim.gpu_faults import (
    EccErrors,
    GpuLost,
    GpuOffBus,
    Hang,
    MigInstanceGone,
    MigMode,
    RowRemap,
    Temperature,
    TensorActive,
    Throttle,
    Xid,
)
from fleetwatch.sim.mount_faults import MountFilling, MountHung, MountReadOnly, MountSlow

FAULT_KINDS: Final[Mapping[str, type[Fault]]] = {
    kind.KIND: kind
    for kind in (
        Temperature,
        NvlinkErrors,
        NvlinkDown,
        IbPortDown,
        IbErrors,
        IbRate,
        Xid,
        GpuLost,
        GpuOffBus,
        Hang,
        Throttle,
        TensorActive,
        EccErrors,
        RowRemap,
        FabricDegraded,
        MountSlow,
        MountHung,
        MountReadOnly,
        MountFilling,
        MigMode,
        MigInstanceGone,
    )
}
"""Every fault kind by its name in scenario files, in the docs' order."""
