"""The metric catalog: every family fleetwatch exports, declared once.

One module per area (`gpu`, `nvlink`, `infiniband`, `pci`, `xid`, `allocation`,
`slurm`, `storage`, `exporter`, `tainter`) holds a `MetricSpec` per family: name, type, help,
labels, and what docs/metrics.md shows of it (unit, source, worst-case series). A spec's
constant is its name without the `fleetwatch_` prefix, upper-cased (`GPU_TEMPERATURE_CELSIUS`), and
`str(spec)` is the name, so PromQL builders write `f"{GPU_TEMPERATURE_CELSIUS}{{...}}"`.

Collectors, rules, dashboards, the simulator, the tainter and the report import the specs
from here and never spell a `fleetwatch_` name (tests/test_catalog.py checks it);
docs/metrics.md is generated from `ALL` (`fleetwatch.catalog.doc`). The package imports
only the standard library, so the tainter and the report can read it without the
exporter's dependencies; `nvidia_xids` (NVIDIA's Xid catalog, data the collectors, the rules
and the report share, read from its YAML with pyyaml) is imported on its own, never from here.
"""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog import (
    allocation,
    exporter,
    gpu,
    infiniband,
    nvlink,
    pci,
    slurm,
    storage,
    tainter,
    xid,
)
from fleetwatch.catalog.spec import MetricSpec

ALL: Final[tuple[MetricSpec, ...]] = (
    *exporter.FAMILIES,
    *gpu.FAMILIES,
    *xid.FAMILIES,
    *allocation.FAMILIES,
    *slurm.FAMILIES,
    *pci.FAMILIES,
    *nvlink.FAMILIES,
    *infiniband.FAMILIES,
    *storage.FAMILIES,
    *tainter.FAMILIES,
)
"""Every family fleetwatch exports (the exporter's and the tainter's), each once."""
