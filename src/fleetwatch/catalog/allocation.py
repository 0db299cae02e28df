"""Pod attribution: which pod holds which GPU (the `podresources` collector).

Part of the metric catalog (`fleetwatch.catalog`): each family is declared here once and
imported by name wherever it is emitted or read."""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.spec import MetricSpec

GPU_ALLOCATION_INFO: Final = MetricSpec(
    "fleetwatch_gpu_allocation_info",
    "gauge",
    "GPU allocated to a pod's container (value 1), from the kubelet PodResources API.",
    ("gpu", "uuid", "namespace", "pod", "container"),
    unit="info (1)",
    source=(
        "kubelet PodResources v1 `List` (resource `nvidia.com/gpu` and "
        "`--collector.podresources.resource-name`); MIG devices keep their id in "
        "`uuid` with an empty `gpu`"
    ),
    series="allocated devices",
)


FAMILIES: Final = (GPU_ALLOCATION_INFO,)
"""Every family of this module, in the order docs/metrics.md lists them."""
