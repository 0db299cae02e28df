"""InfiniBand families and their layout: which series exist, and where each value comes from.

The families (`SPECS`) are those the catalog declares for this collector. `build_layout`
turns what discovery found into label lists (made once per discovery, so each cycle's
families share them and the renderer's prefix cache holds) and one `gather` picker that
takes every counter the families use out of a reading's slots in a single C-level call.
Expected link rates (`--collector.infiniband.expected-rate`) are matched to ports here.
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from fleetwatch.catalog import collected_by
from fleetwatch.catalog.infiniband import (
    DEVICE_EVENTS_TOTAL,
    INFINIBAND_PORT_DATA_BYTES_TOTAL,
    INFINIBAND_PORT_ERROR_SATURATED,
    INFINIBAND_PORT_ERRORS_TOTAL,
    INFINIBAND_PORT_EXPECTED_RATE_BYTES_PER_SECOND,
    INFINIBAND_PORT_HW_STAT_TOTAL,
    INFINIBAND_PORT_INFO,
    INFINIBAND_PORT_MULTICAST_PACKETS_TOTAL,
    INFINIBAND_PORT_PACKETS_TOTAL,
    INFINIBAND_PORT_PHYSICAL_STATE_ID,
    INFINIBAND_PORT_RATE_BYTES_PER_SECOND,
    INFINIBAND_PORT_STATE_CHANGES_TOTAL,
    INFINIBAND_PORT_STATE_ID,
    INFINIBAND_PORT_UNICAST_PACKETS_TOTAL,
    INFINIBAND_PORT_UP,
    INFINIBAND_PORT_XMIT_WAIT_TOTAL,
    INFINIBAND_SYSFS_READ_ERRORS_TOTAL,
)
from fleetwatch.collectors.families import LabelCache
from fleetwatch.collectors.sources.sysfs import PMA_ERROR_COUNTERS, IbDevice, IbPort

BYTES_PER_GBIT: Final = 125_000_000
MAX_RATE_GBPS: Final = 10_000.0
_PORT: Final = ("device", "port")
_INFO_LABELS: Final = (
    "device",
    "port",
    "link_layer",
    "board_id",
    "firmware_version",
    "hca_type",
    "node_guid",
    "pci_address",
    "numa_node",
    "gpus",
)
INFO = INFINIBAND_PORT_INFO.name
UP = INFINIBAND_PORT_UP.name
STATE = INFINIBAND_PORT_STATE_ID.name
PHYS_STATE = INFINIBAND_PORT_PHYSICAL_STATE_ID.name
RATE = INFINIBAND_PORT_RATE_BYTES_PER_SECOND.name
EXPECTED_RATE = INFINIBAND_PORT_EXPECTED_RATE_BYTES_PER_SECOND.name
DATA = INFINIBAND_PORT_DATA_BYTES_TOTAL.name
PACKETS = INFINIBAND_PORT_PACKETS_TOTAL.name
UNICAST = INFINIBAND_PORT_UNICAST_PACKETS_TOTAL.name
MULTICAST = INFINIBAND_PORT_MULTICAST_PACKETS_TOTAL.name
ERRORS = INFINIBAND_PORT_ERRORS_TOTAL.name
XMIT_WAIT = INFINIBAND_PORT_XMIT_WAIT_TOTAL.name
SATURATED = INFINIBAND_PORT_ERROR_SATURATED.name
STATE_CHANGES = INFINIBAND_PORT_STATE_CHANGES_TOTAL.name
HW_COUNTER = INFINIBAND_PORT_HW_STAT_TOTAL.name
DEVICE_EVENTS = DEVICE_EVENTS_TOTAL.name
READ_ERRORS = INFINIBAND_SYSFS_READ_ERRORS_TOTAL.name

SPECS: Final = collected_by("infiniband")

# counters/ files mapped to (family, direction) for the traffic families.
TRAFFIC: Final = {
    "port_xmit_data": (DATA, "tx"),
    "port_rcv_data": (DATA, "rx"),
    "port_xmit_packets": (PACKETS, "tx"),
    "port_rcv_packets": (PACKETS, "rx"),
    "unicast_xmit_packets": (UNICAST, "tx"),
    "unicast_rcv_packets": (UNICAST, "rx"),
    "multicast_xmit_packets": (MULTICAST, "tx"),
    "multicast_rcv_packets": (MULTICAST, "rx"),
}
DATA_WORD_BYTES: Final = 4


@dataclass(frozen=True)
class ExpectedRate:
    """One `[DEVICE[:PORT]=]GBPS` item of the expected-rate flag; DEVICE may be a glob."""

    device_glob: str
    port: int | None
    gbps: float


def parse_expected_rates(text: str) -> tuple[ExpectedRate, ...]:
    """`400` or `mlx5_[0-7]=400,mlx5_8:1=200`: first matching item wins.

    Raises `argparse.ArgumentTypeError` naming the bad item, so a typo fails at start.
    """
    rates = []
    for raw in text.split(","):
        item = raw.strip()
        where, _, number = item.rpartition("=")
        glob, _, port_text = where.partition(":")
        try:
            gbps = float(number)
            port = int(port_text) if port_text else None
        except ValueError:
            gbps, port = math.nan, None
        if (
            not 0 < gbps <= MAX_RATE_GBPS  # also refuses NaN
            or (port is not None and not 1 <= port <= 255)
            or (where and not glob)
        ):
            raise argparse.ArgumentTypeError(
                f"invalid expected rate {item!r}: use GBPS (above 0, at most "
                f"{MAX_RATE_GBPS:g}) or DEVICE[:PORT]=GBPS, e.g. 400 or mlx5_[0-7]=400,mlx5_8=200"
            )
        rates.append(ExpectedRate(device_glob=glob or "*", port=port, gbps=gbps))
    return tuple(rates)


def expected_rate_gbps(rates: Iterable[ExpectedRate], device: str, port: int) -> float | None:
    """The first configured rate that matches the port, or None."""
    for rate in rates:
        if fnmatch.fnmatchcase(device, rate.device_glob) and rate.port in (None, port):
            return rate.gbps
    return None


@dataclass(frozen=True)
class Series:
    """One family's label sets and where each value comes from (slots or positions)."""

    family: str
    labels: list[dict[str, str]] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)

    def add(self, labels: dict[str, str], source: int) -> None:
        self.labels.append(labels)
        self.sources.append(source)


Values = Sequence[int | None]
Picker = Callable[[Values], tuple[int | None, ...]]


def picker(positions: Sequence[int]) -> Picker:
    """`operator.itemgetter` that always returns a tuple (for one item it would not)."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    return lambda values: tuple(values[position] for position in positions)


@dataclass(frozen=True)
class Layout:
    """Every series the collector can emit until the next discovery.

    Label lists are built once per discovery and handed to each cycle's families
    unchanged (so the renderer's prefix cache holds). Each cycle, `gather` picks every
    counter the families use out of the reading's slots in one C-level call, in family
    order: traffic families, then the PMA error counters of every port (`pma`: the
    saturation flags' labels), then hw_counters; each family is a slice of that.
    `errors` and `wait` index into the PMA values by position.
    """

    ports: tuple[IbPort, ...]
    info: list[dict[str, str]]
    own: list[dict[str, str]]
    expected: list[float | None]
    link_downed: list[int | None]
    pick_downed: Picker
    gather: Picker
    traffic: tuple[tuple[Series, slice], ...]
    pma: Series
    pma_span: slice
    pma_limits: list[int]
    pma_ports: list[int]
    pma_errors: list[str]
    errors: tuple[Series, Picker]
    wait: tuple[Series, Picker]
    hw: Series
    hw_span: slice


def build_layout(
    devices: Iterable[IbDevice],
    labels: LabelCache,
    expected: Iterable[ExpectedRate],
    *,
    hw_stats: bool = True,
) -> Layout:
    """Label lists and slots for every series of the discovered devices (without the
    hw_counters ones unless `hw_stats`)."""
    ports: list[IbPort] = []
    info: list[dict[str, str]] = []
    own: list[dict[str, str]] = []
    rates: list[float | None] = []
    downed: list[int | None] = []
    traffic = {family: Series(family) for family, _ in TRAFFIC.values()}
    pma, errors, wait, hw = Series(""), Series(ERRORS), Series(XMIT_WAIT), Series(HW_COUNTER)
    limits: list[int] = []
    pma_ports: list[int] = []
    names: list[str] = []
    for device in devices:
        dev, topo = device.info, device.info.topology
        for port in device.ports:
            index, ids = len(ports), (dev.device, str(port.port))
            ports.append(port)
            info.append(labels.labels(INFO, (
                *ids, port.link_layer or "", dev.board_id or "", dev.firmware_version or "",
                dev.hca_type or "", dev.node_guid or "", topo.pci_address or "",
                "" if topo.numa_node is None else str(topo.numa_node),
                ",".join(str(gpu) for gpu in topo.gpus))))  # fmt: skip
            own.append(labels.labels(UP, ids))
            gbps = expected_rate_gbps(expected, dev.device, port.port)
            rates.append(None if gbps is None else gbps * BYTES_PER_GBIT)
            downed.append(port.counters.get("link_downed"))
            for name, (family, direction) in TRAFFIC.items():
                if name in port.counters:
                    traffic[family].add(labels.labels(family, (*ids, direction)),
                                        port.counters[name])  # fmt: skip
            for name, (error, bits) in PMA_ERROR_COUNTERS.items():
                if name not in port.counters:
                    continue
                if error == "xmit_wait":
                    wait.add(labels.labels(XMIT_WAIT, ids), len(pma.sources))
                else:
                    errors.add(labels.labels(ERRORS, (*ids, error)), len(pma.sources))
                pma.add(labels.labels(SATURATED, (*ids, error)), port.counters[name])
                limits.append((1 << bits) - 1)
                pma_ports.append(index)
                names.append(error)
            if hw_stats:
                for name, slot in port.hw_counters.items():
                    hw.add(labels.labels(HW_COUNTER, (*ids, name)), slot)
        if hw_stats:
            for name, slot in device.hw_counters.items():
                hw.add(labels.labels(HW_COUNTER, (dev.device, "", name)), slot)
    spans: list[slice] = []
    slots: list[int] = []
    for series in (*traffic.values(), pma, hw):
        spans.append(slice(len(slots), len(slots) + len(series.sources)))
        slots += series.sources
    return Layout(
        ports=tuple(ports),
        info=info,
        own=own,
        expected=rates,
        link_downed=downed,
        pick_downed=picker([slot for slot in downed if slot is not None]),
        gather=picker(slots),
        traffic=tuple(zip(traffic.values(), spans[: len(traffic)], strict=True)),
        pma=pma,
        pma_span=spans[-2],
        pma_limits=limits,
        pma_ports=pma_ports,
        pma_errors=names,
        errors=(errors, picker(errors.sources)),
        wait=(wait, picker(wait.sources)),
        hw=hw,
        hw_span=spans[-1],
    )
