"""Collectors: one module per hardware source, listed explicitly in `COLLECTORS`.

`sources/` reads hardware into typed readings (native units, no Prometheus); each
collector module maps readings to metric families; `sim/` simulates the hardware.
"""

from __future__ import annotations

from typing import Any

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
from fleetwatch.collectors.base import CollectorSpec

COLLECTORS: tuple[CollectorSpec[Any], ...] = (
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
