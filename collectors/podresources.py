"""Pod attribution: `fleetwatch_gpu_allocation_info{gpu,uuid,namespace,pod,container,claim}`.

A poller thread asks the kubelet's PodResources API every
`--collector.podresources.refresh-interval` and keeps the latest answer; `collect()`
only reads it, so a slow or wedged kubelet never blocks or fails the scrape. Join the
info series on `gpu`/`uuid` rather than stamping pod labels on every GPU series. No
socket means no series and no error; a failing kubelet is logged when it starts and
stops failing, and its stale attribution is dropped (a wrong pod on a GPU is worse than
none). Unallocated GPUs get no allocation series and keep every GPU series.

Device-plugin ids are GPU UUIDs with the NVIDIA device plugin's default strategy, NVML
indices with `--device-id-strategy=index`, or time-sliced replicas `UUID::N`; all are
mapped to `gpu` and `uuid`. DRA claims (`dynamic_resources`) name (driver, pool, device);
the node's ResourceSlices, watched in the background (`ResourceSliceWatcher`), give the
device's `uuid`. A device that cannot be resolved is counted by reason, logged once per
reason, and left out; the rest of the node's allocation is still exported. An id that
matches no GPU (a MIG device) keeps its id as `uuid` with an empty `gpu`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from fleetwatch.catalog import collected_by
from fleetwatch.catalog.allocation import (
    COMPUTE_DOMAIN_CHANNEL_ALLOCATION_INFO,
    GPU_ALLOCATION_INFO,
    GPU_ALLOCATION_UNRESOLVED_TOTAL,
    UNRESOLVED_REASONS,
)
from fleetwatch.collectors.base import CollectorContext, CollectorSpec
from fleetwatch.collectors.families import FamilyBuilder, SeriesFamily
from fleetwatch.collectors.sources.nvml import NvmlSource
from fleetwatch.collectors.sources.podresources import (
    CHANNEL_DRIVER,
    DEFAULT_RESOURCES,
    DEFAULT_SOCKET,
    GPU_DRIVER,
    Allocations,
    ClaimAllocation,
    PodResourcesClient,
    PodResourcesError,
)
from fleetwatch.flags import duration_setting, setting

if TYPE_CHECKING:
    from fleetwatch.collectors.sources.resourceslices import ResourceSliceWatcher, SliceDevice

log = logging.getLogger(__name__)

ALLOCATION = GPU_ALLOCATION_INFO.name
CHANNEL = COMPUTE_DOMAIN_CHANNEL_ALLOCATION_INFO.name
UNRESOLVED = GPU_ALLOCATION_UNRESOLVED_TOTAL.name
SPECS: Final = collected_by("podresources")
REPLICA_SEPARATOR: Final = "::"  # time-slicing and MPS replicas: GPU-UUID::N


@dataclass(frozen=True)
class _Resolved:
    """One poll's attribution: (device id, namespace, pod, container, claim) per GPU or MIG
    device, and (namespace, pod, container, claim, pool, device) per ComputeDomain channel."""

    gpus: tuple[tuple[str, str, str, str, str], ...] = ()
    channels: tuple[tuple[str, str, str, str, str, str], ...] = ()


class PodResourcesCollector:
    """Serves the latest allocations the poller thread fetched from the kubelet."""

    def __init__(
        self,
        *,
        client: PodResourcesClient,
        source: NvmlSource,
        interval: float,
        slices: ResourceSliceWatcher | None = None,
    ) -> None:
        self._client = client
        self._source = source
        self._interval = interval
        self._slices = slices
        self._lock = threading.Lock()
        self._resolved: _Resolved | None = None
        self._unresolved: Counter[str] = Counter(dict.fromkeys(UNRESOLVED_REASONS, 0))
        self._logged: set[str] = set()
        self._state = "unknown"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            if self._slices is not None:
                self._slices.start()
            self._thread = threading.Thread(
                target=self._poll_loop, name="podresources", daemon=True
            )
            self._thread.start()

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self._interval)

    def poll(self) -> None:
        """Ask the kubelet once, resolve its answer and keep it (never raises: it runs on
        the poller thread, which must outlive any one bad answer)."""
        try:
            allocations = self._client.list_allocations()
            resolved = None if allocations is None else self._resolve(allocations)
        except PodResourcesError as exc:
            self._set(None, "failing", str(exc))
        except Exception as exc:  # supervised: report it and try again next interval
            log.exception("kubelet PodResources poll failed")
            self._set(None, "failing", repr(exc))
        else:
            state = "absent" if resolved is None else "ok"
            self._set(resolved, state, str(self._client.socket))

    def _resolve(self, allocations: Allocations) -> _Resolved:
        """Device-plugin ids as they are; each claim device through the ResourceSlices,
        counting and logging (once per reason) those that do not resolve."""
        gpus = [(a.device_id, a.namespace, a.pod, a.container, "") for a in allocations.devices]
        channels: list[tuple[str, str, str, str, str, str]] = []
        slices = self._slices_now()
        for claim in allocations.claims:
            if claim.driver not in (GPU_DRIVER, CHANNEL_DRIVER):
                self._unresolved_device("unknown_driver", claim, f"driver {claim.driver!r}")
            elif slices is None:
                self._unresolved_device("slices_unavailable", claim, self._why_no_slices())
            elif (device := slices.get((claim.driver, claim.pool, claim.device))) is None:
                self._unresolved_device(
                    "unknown_device", claim, "no ResourceSlice of this node holds it"
                )
            elif claim.driver == CHANNEL_DRIVER:
                labels = (claim.namespace, claim.pod, claim.container, claim.claim)
                channels.append((*labels, claim.pool, claim.device))
            elif not device.uuid:
                self._unresolved_device("no_uuid", claim, "its slice device has no uuid")
            else:
                gpus.append((device.uuid, claim.namespace, claim.pod, claim.container, claim.claim))
        if slices and not allocations.claims and "no_claims" not in self._logged:
            self._logged.add("no_claims")
            log.info(
                "kubelet PodResources reply carries no DRA claims while this node's "
                "ResourceSlices publish NVIDIA devices: a kubelet before 1.34, or with its "
                "KubeletPodResourcesDynamicResources gate off, never reports them",
                extra={"detail": str(self._client.socket)},
            )
        return _Resolved(tuple(gpus), tuple(channels))

    def _slices_now(self) -> dict[tuple[str, str, str], SliceDevice] | None:
        if self._slices is None or not self._slices.synced:
            return None
        return self._slices.devices()

    def _why_no_slices(self) -> str:
        if self._slices is None:
            return "DRA attribution is off"
        return self._slices.off_reason or "the node's ResourceSlices are not listed yet"

    def _unresolved_device(self, reason: str, claim: ClaimAllocation, why: str) -> None:
        with self._lock:
            self._unresolved[reason] += 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning(
                "DRA claim device left out of the allocation series: %s (%s)",
                reason,
                why,
                extra={
                    "detail": (
                        f"{claim.namespace}/{claim.pod} container {claim.container} claim "
                        f"{claim.claim}: driver {claim.driver} pool {claim.pool} "
                        f"device {claim.device}"
                    )
                },
            )

    def _set(self, resolved: _Resolved | None, state: str, detail: str) -> None:
        with self._lock:
            self._resolved = resolved
            changed, self._state = state != self._state, state
        if changed:
            level = logging.WARNING if state == "failing" else logging.INFO
            log.log(level, "kubelet PodResources: %s", state, extra={"detail": detail})

    def collect(self) -> list[SeriesFamily]:
        self.start()
        with self._lock:
            resolved, unresolved = self._resolved, dict(self._unresolved)
        if resolved is None:
            return []
        labels = device_labels(self._source)
        builder = FamilyBuilder(SPECS)
        for device_id, namespace, pod, container, claim in resolved.gpus:
            # A time-sliced replica (`GPU-...::3`) is its GPU's.
            gpu, uuid = labels(device_id.split(REPLICA_SEPARATOR, 1)[0])
            builder.add(ALLOCATION, (gpu, uuid, namespace, pod, container, claim), 1)
        for channel in resolved.channels:
            builder.add(CHANNEL, channel, 1)
        for reason, count in unresolved.items():
            builder.add(UNRESOLVED, (reason,), count)
        return builder.families()

    def close(self) -> None:
        self._stop.set()
        if self._slices is not None:
            self._slices.close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


def device_labels(source: NvmlSource) -> Callable[[str], tuple[str, str]]:
    """device id -> (`gpu`, `uuid`) of the allocation series, for this node's GPUs now: a
    GPU UUID or an NVML index names a GPU; any other id (a MIG device) keeps its id as
    `uuid` with an empty `gpu`. The Slurm job mapping (collectors/slurm_allocation.py) uses
    it too."""
    by_id: dict[str, tuple[str, str]] = {}
    for reading in source.gpus():
        labels = (str(reading.identity.index), reading.identity.uuid)
        by_id[reading.identity.uuid] = by_id[str(reading.identity.index)] = labels
    return lambda device_id: by_id.get(device_id, ("", device_id))


@dataclass(frozen=True, kw_only=True)
class PodResourcesSettings:
    """`--collector.podresources.*` flags."""

    socket: Path = setting(
        DEFAULT_SOCKET, parse=Path, metavar="PATH", help="kubelet PodResources socket"
    )
    resource_name: tuple[str, ...] = setting(
        DEFAULT_RESOURCES,
        repeatable=True,
        metavar="NAME",
        help="extended resource whose devices are GPUs; repeat for more",
    )
    refresh_interval: float = duration_setting(
        15.0,
        minimum=1.0,
        maximum=3600.0,
        help="how often to ask the kubelet",
    )
    dra: str = setting(
        "auto",
        choices=("auto", "on", "off"),
        help=(
            "DRA attribution through this node's ResourceSlices: auto turns it off, saying "
            "why once, where they are not served or the token may not list them"
        ),
    )
    node_name: str = setting(
        "",
        deprecated=("node-name",),
        metavar="NODE",
        help="this node's Kubernetes name, for DRA attribution (default: $NODE_NAME)",
    )
    kubeconfig: Path | None = setting(
        None,
        parse=Path,
        flag="kubeconfig",
        metavar="PATH",
        help="kubeconfig for DRA attribution (default: the pod's in-cluster credentials)",
    )


def _create(context: CollectorContext, settings: PodResourcesSettings) -> PodResourcesCollector:
    client = PodResourcesClient(
        socket=settings.socket,
        resources=frozenset(settings.resource_name),
        timeout=min(5.0, settings.refresh_interval),
    )
    return PodResourcesCollector(
        client=client,
        source=context.nvml_source,
        interval=settings.refresh_interval,
        slices=_slice_watcher(settings, os.environ.get("NODE_NAME", "")),
    )


def _slice_watcher(settings: PodResourcesSettings, env_node: str) -> ResourceSliceWatcher | None:
    """The ResourceSlice watcher DRA attribution needs, or None where it is off.

    `--collector.podresources.dra=on` makes missing access a start-up error (ValueError);
    `auto` logs once why DRA attribution is off and lets device-plugin attribution go on.
    The watcher's module (an HTTPS client: `http.client`, `email`, about 0.7 MiB) is loaded
    only here, where DRA attribution is not off and a node is named.
    """
    if settings.dra == "off":
        return None
    node = settings.node_name or env_node
    try:
        if not node:
            raise ValueError("no node name: set --collector.podresources.node-name or NODE_NAME")
        from fleetwatch.collectors.sources.resourceslices import KubeAccess, ResourceSliceWatcher

        access = (
            KubeAccess.in_cluster()
            if settings.kubeconfig is None
            else KubeAccess.from_kubeconfig(settings.kubeconfig)
        )
    except ValueError as exc:  # no node name, or KubeAccessError
        if settings.dra == "on":
            raise ValueError(f"--collector.podresources.dra=on: {exc}") from exc
        log.info("DRA attribution off: %s; device-plugin attribution goes on", exc)
        return None
    return ResourceSliceWatcher(access=access, node=node, mode=settings.dra)


SPEC = CollectorSpec(
    name="podresources",
    help="which pod holds which GPU, from the kubelet PodResources API",
    settings=PodResourcesSettings,
    create=_create,
    metrics=SPECS,
)
