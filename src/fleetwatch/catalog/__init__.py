"""The metric catalog: every family fleetwatch exports, declared once.

One module per area (`gpu`, `mig`, `nvlink`, `infiniband`, `pci`, `xid`, `allocation`,
`slurm`, `storage`, `exporter`, `tainter`) declares each family once, through the area's
`FAMILIES` (`spec.Families`): name, type, help, labels, what docs/metrics.md shows of it
(unit, source, worst-case series), the collectors that emit it and, for a plain value, where
each series is read and how it is converted (`spec.Read`, `units`). A spec's constant is its
name without the `fleetwatch_` prefix, upper-cased (`GPU_TEMPERATURE_CELSIUS`), and
`str(spec)` is the name, so PromQL builders write `f"{GPU_TEMPERATURE_CELSIUS}{{...}}"`.

Everything else derives from that declaration: the area's family list (declaration order),
each collector's list (`collected_by`: a collector iterates its families, it does not list
them), docs/metrics.md (`fleetwatch.catalog.doc`, from `ALL`), and the names that rules,
dashboards, the simulator, the tainter and the report import; none of them spells a
`fleetwatch_` name (tests/test_catalog.py checks it). The package imports only the standard
library, so the tainter and the report can read it without the exporter's dependencies;
`nvidia_xids` (NVIDIA's Xid catalog, data the collectors, the rules and the report share,
read from its YAML with pyyaml) is imported on its own, never from here.
"""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog import (
    allocation,
    exporter,
    gpu,
    infiniband,
    mig,
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
    *mig.FAMILIES,
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


def collected_by(collector: str) -> tuple[MetricSpec, ...]:
    """The families `collector` emits, in catalog order (the order it exposes them).

    Raises `LookupError` for a collector no family names (a typo on either side).
    """
    specs = tuple(spec for spec in ALL if collector in spec.collectors)
    if not specs:
        raise LookupError(f"no family of fleetwatch.catalog names the collector {collector!r}")
    return specs
