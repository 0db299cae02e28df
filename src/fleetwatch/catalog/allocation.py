"""Pod attribution: which pod holds which GPU (the `podresources` collector).

Part of the metric catalog (`fleetwatch.catalog`): each family is declared here once and
imported by name wherever it is emitted or read."""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.spec import Families

FAMILIES: Final = Families(collectors=("podresources",))
"""Every family of this module, in declaration order (the order docs/metrics.md lists them)."""

GPU_ALLOCATION_INFO: Final = FAMILIES.declare(
    "fleetwatch_gpu_allocation_info",
    "gauge",
    (
        "GPU allocated to a pod's container (value 1), from the kubelet PodResources API: "
        "by the device plugin, or by a DRA claim resolved through this node's ResourceSlices. "
        "Unallocated GPUs have no series here and keep all their GPU series."
    ),
    ("gpu", "uuid", "namespace", "pod", "container", "claim"),
    unit="info (1)",
    source=(
        "kubelet PodResources v1 `List`: `devices` (resource `nvidia.com/gpu` and "
        "`--collector.podresources.resource-name`; time-sliced replicas `UUID::N` join their "
        "GPU) and `dynamic_resources` (driver `gpu.nvidia.com`, the device's `uuid` attribute "
        "in its ResourceSlice); MIG devices keep their id in `uuid` with an empty `gpu`"
    ),
    series="allocated devices",
    label_values={"claim": "the ResourceClaim's name; empty for device-plugin devices"},
    collectors=("podresources", "slurmjobs"),
)

COMPUTE_DOMAIN_CHANNEL_ALLOCATION_INFO: Final = FAMILIES.declare(
    "fleetwatch_compute_domain_channel_allocation_info",
    "gauge",
    "ComputeDomain (IMEX) channel allocated to a pod's container by a DRA claim (value 1).",
    ("namespace", "pod", "container", "claim", "pool", "device"),
    unit="info (1)",
    source=(
        "kubelet PodResources v1 `dynamic_resources` of driver `compute-domain.nvidia.com`, "
        "checked against this node's ResourceSlices"
    ),
    series="allocated channels",
)

GPU_ALLOCATION_UNRESOLVED_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_gpu_allocation_unresolved_total",
    "counter",
    (
        "Allocated devices left out of the allocation series, per kubelet poll, by reason; "
        "the rest of the node's allocation is still exported."
    ),
    ("reason",),
    unit="devices",
    source="the podresources collector's join of the kubelet reply with the ResourceSlices",
    series="4",
    label_values={
        "reason": (
            "`no_uuid` (the slice's device has no `uuid` attribute), `unknown_device` (no "
            "slice of this node holds the claim's pool and device), `unknown_driver` (a "
            "driver other than `gpu.nvidia.com` and `compute-domain.nvidia.com`), "
            "`slices_unavailable` (DRA attribution off or not yet listed)"
        )
    },
)

UNRESOLVED_REASONS: Final = (
    "no_uuid",
    "unknown_device",
    "unknown_driver",
    "slices_unavailable",
)
"""The `reason` values of GPU_ALLOCATION_UNRESOLVED_TOTAL (each is exported from the start)."""
