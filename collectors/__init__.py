"""Collectors: one module per hardware source, listed explicitly in `COLLECTORS`.

`sources/` reads hardware into typed readings (native units, no Prometheus); each
collector module maps readings to metric families; `sim/` simulates the hardware.

`COLLECTORS` is built on first use, not when the package is imported: the storage
collector's mount helper is a small process of its own that imports one source module
(`sources.mount_helper`), and importing this package must not load every collector, pynvml
and prometheus_client into it (34 MiB resident instead of 10), nor `typing` (0.5 MiB) for
annotations alone.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from fleetwatch.collectors.base import CollectorSpec

    COLLECTORS: tuple[CollectorSpec[Any], ...]


def __getattr__(name: str) -> Any:
    """`COLLECTORS`, every collector's spec in the order the exporter lists and runs them;
    the collector modules are imported on first use."""
    if name != "COLLECTORS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from fleetwatch.collectors import (
        gpm,
        gpu,
        infiniband,
        mig,
        nvlink,
        pci,
        podresources,
        slurm_allocation,
        storage,
        xid,
    )

    specs = (
        gpu.SPEC,
        pci.SPEC,
        gpm.SPEC,
        mig.SPEC,
        nvlink.SPEC,
        xid.SPEC,
        podresources.SPEC,
        slurm_allocation.SPEC,
        infiniband.SPEC,
        storage.SPEC,
    )
    globals()["COLLECTORS"] = specs
    return specs
