"""Pod attribution: `fleetwatch_gpu_allocation_info{gpu,uuid,namespace,pod,container}`.

A poller thread asks the kubelet's PodResources API every
`--collector.podresources.refresh-interval` and keeps the latest answer; `collect()`
only reads it, so a slow or wedged kubelet never blocks or fails the scrape. Join the
info series on `gpu`/`uuid` rather than stamping pod labels on every GPU series. No
socket means no series and no error; a failing kubelet is logged when it starts and
stops failing, and its stale attribution is dropped (a wrong pod on a GPU is worse than
none).

Device ids are GPU UUIDs with the NVIDIA device plugin's default strategy, or NVML
indices with `--device-id-strategy=index`; both are mapped to `gpu` and `uuid`. An id
that matches no GPU (a MIG device) keeps its id as `uuid` with an empty `gpu`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fleetwatch.catalog.allocation import GPU_ALLOCATION_INFO
from fleetwatch.collectors.base import CollectorContext, CollectorSpec
from fleetwatch.collectors.metrics import FamilyBuilder, SeriesFamily
from fleetwatch.collectors.sources.nvml import NvmlSource
from fleetwatch.collectors.sources.podresources import (
    DEFAULT_RESOURCES,
    DEFAULT_SOCKET,
    DeviceAllocation,
    PodResourcesClient,
    PodResourcesError,
)
from fleetwatch.flags import duration_setting, setting

log = logging.getLogger(__name__)

ALLOCATION = GPU_ALLOCATION_INFO.name
SPECS: Final = (GPU_ALLOCATION_INFO,)


class PodResourcesCollector:
    """Serves the latest allocations the poller thread fetched from the kubelet."""

    def __init__(self, *, client: PodResourcesClient, source: NvmlSource, interval: float) -> None:
        self._client = client
        self._source = source
        self._interval = interval
        self._lock = threading.Lock()
        self._allocations: tuple[DeviceAllocation, ...] = ()
        self._state = "unknown"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._poll_loop, name="podresources", daemon=True
            )
            self._thread.start()

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self._interval)

    def poll(self) -> None:
        """Ask the kubelet once and keep the answer (never raises: it runs on the poller
        thread, which must outlive any one bad answer)."""
        try:
            allocations = self._client.list_allocations()
        except PodResourcesError as exc:
            self._set(None, "failing", str(exc))
        except Exception as exc:  # supervised: report it and try again next interval
            log.exception("kubelet PodResources poll failed")
            self._set(None, "failing", repr(exc))
        else:
            state = "absent" if allocations is None else "ok"
            self._set(allocations, state, str(self._client.socket))

    def _set(self, allocations: list[DeviceAllocation] | None, state: str, detail: str) -> None:
        with self._lock:
            self._allocations = tuple(allocations or ())
            changed, self._state = state != self._state, state
        if changed:
            level = logging.WARNING if state == "failing" else logging.INFO
            log.log(level, "kubelet PodResources: %s", state, extra={"detail": detail})

    def collect(self) -> list[SeriesFamily]:
        self.start()
        with self._lock:
            allocations = self._allocations
        if not allocations:
            return []
        labels = device_labels(self._source)
        builder = FamilyBuilder(SPECS)
        for allocation in allocations:
            gpu, uuid = labels(allocation.device_id)
            builder.add(
                ALLOCATION,
                (gpu, uuid, allocation.namespace, allocation.pod, allocation.container),
                1,
            )
        return builder.families()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


def device_labels(source: NvmlSource) -> Callable[[str], tuple[str, str]]:
    """device id -> (`gpu`, `uuid`) of the allocation series, for this node's GPUs now: a
    GPU UUID or an NVML index names a GPU; any other id (a MIG device) keeps its id as
    `uuid` with an empty `gpu`. The Slurm job mapping (collectors/slurmjobs.py) uses it too."""
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


def _create(context: CollectorContext, settings: PodResourcesSettings) -> PodResourcesCollector:
    client = PodResourcesClient(
        socket=settings.socket,
        resources=frozenset(settings.resource_name),
        timeout=min(5.0, settings.refresh_interval),
    )
    return PodResourcesCollector(
        client=client, source=context.nvml_source, interval=settings.refresh_interval
    )


SPEC = CollectorSpec(
    name="podresources",
    help="which pod holds which GPU, from the kubelet PodResources API",
    settings=PodResourcesSettings,
    create=_create,
    metrics=SPECS,
)
