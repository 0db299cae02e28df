"""NVLink collector: per-link state and error counters, NVLink5 counters where present.

Links are enumerated by state once per GPU (18 on H100 and B200/GB200 even though NVML
claims 36; indices past the real count answer InvalidArgument, which means "no such
link"). Error counters are read per link with `nvmlDeviceGetNvLinkErrorCounter`, never
the legacy total field values that read 0 on Hopper. With `--collector.nvlink.nvlink5`
the NVLink5 counters (symbol errors, effective errors, failed recoveries, ...) are read
too, in one batched field-value call per GPU; a driver without them leaves them absent.

`--collector.nvlink.per-gpu` aggregates per-link series to per GPU for users who need
fewer series: `fleetwatch_nvlink_links_up` (links up) replaces `fleetwatch_nvlink_up`, and
the error counters are summed over links (no `link` label). NVLinkDown reads the per-link
`fleetwatch_nvlink_up`, so the lean profile keeps per-link series and uses
`--no-collector.nvlink.zero-errors` instead: an error counter is exported from its first
error on (and kept from then, so a reset reads as a counter reset, not a vanished series).
Nearly every link counts no error, so this drops most of the family, and a counter that
appears at its first error is what the rules' rates already handle (docs/deploy.md).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Final

from fleetwatch.catalog import collected_by
from fleetwatch.catalog.nvlink import (
    NVLINK_ERRORS_TOTAL,
    NVLINK_LINKS_UP,
    NVLINK_NVML_ERRORS_TOTAL,
    NVLINK_UP,
)
from fleetwatch.collectors.base import CollectorContext, CollectorSpec
from fleetwatch.collectors.families import FamilyBuilder, LabelCache, SeriesFamily
from fleetwatch.collectors.gpu_common import (
    GPU_ID,
    LostGpus,
    NvmlFailures,
    gpu_labels,
)
from fleetwatch.collectors.sources.nvml import (
    NVLINK5_FIELDS,
    NVLINK_ERROR_COUNTERS,
    GpuIdentity,
    GpuLinksReading,
    NvmlSource,
)
from fleetwatch.collectors.sources.nvml_calls import GpuLostError
from fleetwatch.flags import setting

UP = NVLINK_UP.name
LINKS_UP = NVLINK_LINKS_UP.name
ERRORS = NVLINK_ERRORS_TOTAL.name
FAILURES = NVLINK_NVML_ERRORS_TOTAL

SPECS: Final = collected_by("nvlink")
PER_LINK_SPECS: Final = tuple(spec for spec in SPECS if spec is not NVLINK_LINKS_UP)
# --collector.nvlink.per-gpu: links up instead of each link's state, and the catalog's error
# family summed over links (no `link` label).
PER_GPU_SPECS: Final = tuple(
    replace(spec, help=spec.help + " Summed over links.", labels=(*GPU_ID, "error"))
    if spec is NVLINK_ERRORS_TOTAL
    else spec
    for spec in SPECS
    if spec is not NVLINK_UP
)


class NvLinkCollector:
    """Per-link (or per-GPU aggregated) NVLink state and error counters."""

    def __init__(
        self, *, source: NvmlSource, nvlink5: bool, per_gpu: bool, zero_errors: bool = True
    ) -> None:
        self._source = source
        self._nvlink5 = nvlink5
        self._per_gpu = per_gpu
        # Without zero_errors: the error series that have counted an error (GPU uuid, link
        # or None per GPU, error); the others are left out.
        self._erred: set[tuple[str, int | None, str]] | None = None if zero_errors else set()
        self._failures = NvmlFailures(collector="nvlink", spec=FAILURES)
        self._lost = LostGpus(collector="nvlink")
        self._labels = LabelCache(PER_GPU_SPECS if per_gpu else PER_LINK_SPECS)
        self._links = _LinkLabels(self._labels)

    def collect(self) -> list[SeriesFamily]:
        builder = FamilyBuilder(self._labels)
        for gpu in self._source.gpus():
            try:
                reading = self._source.read_nvlinks(gpu, nvlink5=self._nvlink5)
            except GpuLostError:
                self._lost.lost(gpu.identity)
                continue
            self._lost.seen(gpu.identity)
            self._failures.record(gpu.identity, reading.failures)
            if self._per_gpu:
                add_per_gpu(builder, gpu.identity, reading, self._erred)
            else:
                add_per_link(builder, gpu.identity, reading, self._links, self._erred)
        self._failures.add_to(builder)
        return builder.families()

    def close(self) -> None:
        """Nothing to release: the NVML source is shared."""


# A link's `fleetwatch_nvlink_up` labels, and its `fleetwatch_nvlink_errors_total` labels
# by error.
_LinkLabelSet = tuple[dict[str, str], dict[str, dict[str, str]]]


class _LinkLabels:
    """The label dicts of each GPU link's series, made once (1,008 samples a cycle on a
    DGX H100: the commonest labels of the exporter)."""

    def __init__(self, labels: LabelCache) -> None:
        self._labels = labels
        self._links: dict[tuple[str, str, int], _LinkLabelSet] = {}
        # By GPU: the shape of its last reading (links, each link's counters) and the
        # `fleetwatch_nvlink_up` and `_errors_total` label lists in the reading's order.
        self._columns: dict[
            tuple[str, str], tuple[object, list[dict[str, str]], list[dict[str, str]]]
        ] = {}

    def columns(
        self, identity: GpuIdentity, reading: GpuLinksReading
    ) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        """The label lists of a GPU's per-link series in the order its reading gives the
        values (each link's state; each link's counters), made again only when the GPU's
        links or their counters changed."""
        shape = tuple((link.link, tuple(link.errors)) for link in reading.links)
        key = gpu_labels(identity)
        found = self._columns.get(key)
        if found is not None and found[0] == shape:
            return found[1], found[2]
        up_labels, error_labels = [], []
        for link in reading.links:
            up, by_error = self.of(identity, link.link)
            up_labels.append(up)
            error_labels += [by_error[error] for error in link.errors]
        self._columns[key] = (shape, up_labels, error_labels)
        return up_labels, error_labels

    def of(self, identity: GpuIdentity, link: int) -> _LinkLabelSet:
        ids = gpu_labels(identity)
        key = (*ids, link)
        found = self._links.get(key)
        if found is None:
            labels = (*ids, str(link))
            by_error = {
                error: self._labels.labels(ERRORS, (*labels, error))
                for error in (*NVLINK_ERROR_COUNTERS, *NVLINK5_FIELDS)
            }
            found = self._links[key] = (self._labels.labels(UP, labels), by_error)
        return found


def has_erred(
    erred: set[tuple[str, int | None, str]] | None,
    key: tuple[str, int | None, str],
    count: float | None,
) -> bool:
    """Whether the error series `key` is exported: always without an `erred` set, else
    from its first error on (remembered in `erred`)."""
    if erred is None or key in erred:
        return True
    if count:
        erred.add(key)
        return True
    return False


def add_per_link(
    builder: FamilyBuilder,
    identity: GpuIdentity,
    reading: GpuLinksReading,
    links: _LinkLabels,
    erred: set[tuple[str, int | None, str]] | None = None,
) -> None:
    if erred is None:  # every counter: whole columns, no call per value (1,584 a DGX H100)
        up_labels, error_labels = links.columns(identity, reading)
        builder.extend(UP, up_labels, [None if x.up is None else int(x.up) for x in reading.links])
        counts = [count for link in reading.links for count in link.errors.values()]
        builder.extend(ERRORS, error_labels, counts)
        return
    put = builder.put
    for link in reading.links:
        up, by_error = links.of(identity, link.link)
        put(UP, up, None if link.up is None else int(link.up))
        for error, count in link.errors.items():
            if has_erred(erred, (identity.uuid, link.link, error), count):
                put(ERRORS, by_error[error], count)


def add_per_gpu(
    builder: FamilyBuilder,
    identity: GpuIdentity,
    reading: GpuLinksReading,
    erred: set[tuple[str, int | None, str]] | None = None,
) -> None:
    ids = gpu_labels(identity)
    states = [link.up for link in reading.links if link.up is not None]
    if states:
        builder.add(LINKS_UP, ids, sum(states))
    totals: dict[str, float] = defaultdict(float)
    for link in reading.links:
        for error, count in link.errors.items():
            if count is not None:
                totals[error] += count
    for error, total in totals.items():
        if has_erred(erred, (identity.uuid, None, error), total):
            builder.add(ERRORS, (*ids, error), total)


@dataclass(frozen=True, kw_only=True)
class NvLinkSettings:
    """`--collector.nvlink.*` flags."""

    per_gpu: bool = setting(
        False, help="aggregate NVLink series per GPU instead of per link (18x fewer series)"
    )
    zero_errors: bool = setting(
        True,
        help="export every error counter, also those still at 0; off (lean profile), a "
        "counter is exported from its first error on",
    )
    nvlink5: bool = setting(
        True,
        help="also read the NVLink5 (Blackwell) per-link counters; absent where the driver "
        "lacks them",
    )


def _create(context: CollectorContext, settings: NvLinkSettings) -> NvLinkCollector:
    return NvLinkCollector(
        source=context.nvml_source,
        nvlink5=settings.nvlink5,
        per_gpu=settings.per_gpu,
        zero_errors=settings.zero_errors,
    )


SPEC = CollectorSpec(
    name="nvlink",
    help="NVLink state and per-link error counters, NVLink5 counters (NVML)",
    settings=NvLinkSettings,
    create=_create,
    metrics=SPECS,
)
