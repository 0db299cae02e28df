"""The fabric collector: InfiniBand and RoCE ports from sysfs, infiniband-diags and udev.

Maps `collectors.sources.sysfs` readings to the InfiniBand families of the metric
contract (DESIGN.md), from one table of metric specs. On top of the raw counters it adds
what operators need to see a bad link before it kills a job:

- saturation: a PMA error counter pinned at all-ones reads as a zero rate exactly when
  the link is worst, so `fleetwatch_infiniband_port_error_saturated` flags it, and when
  `perfquery -x` can read the 64-bit extended error counters (CapMask2 bit 1) for that
  port, those values replace the pinned ones;
- flaps: `fleetwatch_infiniband_port_state_changes_total` counts state transitions seen
  between cycles plus those implied by `link_downed`, so a flap shorter than a scrape
  interval still shows;
- degraded links: the trained rate beside a configured expected rate;
- topology: the NUMA node and the GPUs under the same PCIe switch on the `_info` series;
- hotplug: udev events (or a periodic timer where udev is unreachable) re-run discovery.
"""

from __future__ import annotations

import argparse
import fnmatch
import logging
import operator
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, cast

from fleetwatch.collectors.base import CollectorContext, CollectorSpec
from fleetwatch.collectors.metrics import LabelCache, MetricSpec, SeriesFamily
from fleetwatch.collectors.sources.ibtools import IbToolError, IbTools
from fleetwatch.collectors.sources.sysfs import (
    PMA_ERROR_COUNTERS,
    IbDevice,
    IbPort,
    IbPortState,
    IbReading,
    InfinibandSysfs,
    ReadProblem,
)
from fleetwatch.collectors.sources.udev import DeviceEvents, open_device_events
from prometheus_client.metrics_core import Metric

from fleetwatch.flags import positive_duration

log = logging.getLogger(__name__)

_BYTES_PER_GBIT: Final = 125_000_000
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
INFO = "fleetwatch_infiniband_port_info"
UP = "fleetwatch_infiniband_port_up"
STATE = "fleetwatch_infiniband_port_state_id"
PHYS_STATE = "fleetwatch_infiniband_port_physical_state_id"
RATE = "fleetwatch_infiniband_port_rate_bytes_per_second"
EXPECTED_RATE = "fleetwatch_infiniband_port_expected_rate_bytes_per_second"
DATA = "fleetwatch_infiniband_port_data_bytes_total"
PACKETS = "fleetwatch_infiniband_port_packets_total"
UNICAST = "fleetwatch_infiniband_port_unicast_packets_total"
MULTICAST = "fleetwatch_infiniband_port_multicast_packets_total"
ERRORS = "fleetwatch_infiniband_port_errors_total"
XMIT_WAIT = "fleetwatch_infiniband_port_xmit_wait_total"
SATURATED = "fleetwatch_infiniband_port_error_saturated"
STATE_CHANGES = "fleetwatch_infiniband_port_state_changes_total"
HW_COUNTER = "fleetwatch_infiniband_port_hw_stat_total"
DEVICE_EVENTS = "fleetwatch_device_events_total"

SPECS: Final = (
    MetricSpec(INFO, "gauge", "InfiniBand port attributes and PCI topology (value 1).",
               _INFO_LABELS),
    MetricSpec(UP, "gauge", "1 when the port state is ACTIVE and the physical state LinkUp.",
               _PORT),
    MetricSpec(STATE, "gauge", "Port state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.",
               _PORT),
    MetricSpec(PHYS_STATE, "gauge",
               "Physical port state: 1 Sleep, 2 Polling, 3 Disabled, 4 Training, 5 LinkUp, "
               "6 LinkErrorRecovery, 7 Phy Test.", _PORT),
    MetricSpec(RATE, "gauge", "Trained link rate of an active port in bytes per second.", _PORT),
    MetricSpec(EXPECTED_RATE, "gauge",
               "Configured expected link rate in bytes per second (--collector.infiniband."
               "expected-rate).", _PORT),
    MetricSpec(DATA, "counter", "Data octets transferred (sysfs 4-octet words x 4).",
               (*_PORT, "direction")),
    MetricSpec(PACKETS, "counter", "Packets transferred.", (*_PORT, "direction")),
    MetricSpec(UNICAST, "counter", "Unicast packets transferred.", (*_PORT, "direction")),
    MetricSpec(MULTICAST, "counter", "Multicast packets transferred.", (*_PORT, "direction")),
    MetricSpec(ERRORS, "counter",
               "PMA port error counters (64-bit extended values where perfquery can read them).",
               (*_PORT, "error")),
    MetricSpec(XMIT_WAIT, "counter", "Ticks the port had data to send but no flow-control "
               "credits (congestion).", _PORT),
    MetricSpec(SATURATED, "gauge", "1 while the exported counter is pinned at its all-ones "
               "maximum, so its rate reads 0 however bad the link is.", (*_PORT, "error")),
    MetricSpec(STATE_CHANGES, "counter", "Port state transitions seen between collections, "
               "plus those implied by link_downed (flaps shorter than an interval).", _PORT),
    MetricSpec(HW_COUNTER, "counter", "Driver hw_counters by raw name (port \"\" for "
               "device-level counters).", (*_PORT, "stat")),
    MetricSpec(DEVICE_EVENTS, "counter", "udev events seen for the watched subsystems.",
               ("subsystem", "action")),
)  # fmt: skip

# counters/ files mapped to (family, direction) for the traffic families.
_TRAFFIC: Final = {
    "port_xmit_data": (DATA, "tx"),
    "port_rcv_data": (DATA, "rx"),
    "port_xmit_packets": (PACKETS, "tx"),
    "port_rcv_packets": (PACKETS, "rx"),
    "unicast_xmit_packets": (UNICAST, "tx"),
    "unicast_rcv_packets": (UNICAST, "rx"),
    "multicast_xmit_packets": (MULTICAST, "tx"),
    "multicast_rcv_packets": (MULTICAST, "rx"),
}
_DATA_WORD_BYTES: Final = 4
_STATE_IDS: Final = {1, 2, 3, 4, 5}


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
            gbps, port = -1.0, None
        if gbps <= 0 or (port is not None and port < 1) or (where and not glob):
            raise argparse.ArgumentTypeError(
                f"invalid expected rate {item!r}: use GBPS or DEVICE[:PORT]=GBPS, "
                "e.g. 400 or mlx5_[0-7]=400,mlx5_8=200"
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
class _Series:
    """One family's label sets and where each value comes from (slots or positions)."""

    family: str
    labels: list[dict[str, str]] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)

    def add(self, labels: dict[str, str], source: int) -> None:
        self.labels.append(labels)
        self.sources.append(source)


_Values = Sequence[int | None]
# The port-level families: INFO to EXPECTED_RATE, then STATE_CHANGES (spec order).
_PortFamilies = tuple[list[SeriesFamily | None], list[SeriesFamily | None]]
_Picker = Callable[[_Values], tuple[int | None, ...]]


def _picker(positions: Sequence[int]) -> _Picker:
    """`operator.itemgetter` that always returns a tuple (for one item it would not)."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    return lambda values: tuple(values[position] for position in positions)


@dataclass(frozen=True)
class _Layout:
    """Every series the collector can emit until the next discovery.

    Label lists are built once per discovery and handed to each cycle's `SeriesFamily`
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
    pick_downed: _Picker
    gather: _Picker
    traffic: tuple[tuple[_Series, slice], ...]
    pma: _Series
    pma_span: slice
    pma_limits: list[int]
    pma_ports: list[int]
    pma_errors: list[str]
    errors: tuple[_Series, _Picker]
    wait: tuple[_Series, _Picker]
    hw: _Series
    hw_span: slice


def _layout(
    devices: Iterable[IbDevice], labels: LabelCache, expected: Iterable[ExpectedRate]
) -> _Layout:
    """Label lists and slots for every series of the discovered devices."""
    ports: list[IbPort] = []
    info: list[dict[str, str]] = []
    own: list[dict[str, str]] = []
    rates: list[float | None] = []
    downed: list[int | None] = []
    traffic = {family: _Series(family) for family, _ in _TRAFFIC.values()}
    pma, errors, wait, hw = _Series(""), _Series(ERRORS), _Series(XMIT_WAIT), _Series(HW_COUNTER)
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
            rates.append(None if gbps is None else gbps * _BYTES_PER_GBIT)
            downed.append(port.counters.get("link_downed"))
            for name, (family, direction) in _TRAFFIC.items():
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
            for name, slot in port.hw_counters.items():
                hw.add(labels.labels(HW_COUNTER, (*ids, name)), slot)
        for name, slot in device.hw_counters.items():
            hw.add(labels.labels(HW_COUNTER, (dev.device, "", name)), slot)
    spans: list[slice] = []
    slots: list[int] = []
    for series in (*traffic.values(), pma, hw):
        spans.append(slice(len(slots), len(slots) + len(series.sources)))
        slots += series.sources
    return _Layout(
        ports=tuple(ports),
        info=info,
        own=own,
        expected=rates,
        link_downed=downed,
        pick_downed=_picker([slot for slot in downed if slot is not None]),
        gather=_picker(slots),
        traffic=tuple(zip(traffic.values(), spans[: len(traffic)], strict=True)),
        pma=pma,
        pma_span=spans[-2],
        pma_limits=limits,
        pma_ports=pma_ports,
        pma_errors=names,
        errors=(errors, _picker(errors.sources)),
        wait=(wait, _picker(wait.sources)),
        hw=hw,
        hw_span=spans[-1],
    )


class InfinibandCollector:
    """Reads every InfiniBand port each cycle; re-discovers on hotplug or on a timer."""

    def __init__(
        self,
        *,
        sysfs: InfinibandSysfs,
        tools: IbTools | None,
        events: DeviceEvents,
        expected_rates: tuple[ExpectedRate, ...] = (),
        rediscover_seconds: float = 60.0,
        perfquery_seconds: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sysfs = sysfs
        self._tools = tools
        self._events = events
        self._expected = expected_rates
        self._rediscover_seconds = rediscover_seconds
        self._perfquery_seconds = perfquery_seconds
        # Per port: when perfquery -x last ran, and what it gave ({} when it failed).
        self._extended: dict[tuple[str, int], tuple[float, Mapping[str, int]]] = {}
        self._monotonic = monotonic
        self._discovered_at: float | None = None
        self._logged: set[tuple[str, str]] = set()
        self._event_counts: dict[tuple[str, str], int] = {}
        self._event_labels: list[dict[str, str]] = []
        self._last_state: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        self._state_changes: dict[tuple[str, int], int] = {}
        self._labels = LabelCache(SPECS)
        self._layout = _layout((), self._labels, ())
        # (the inputs, the families built from them); see `_families`.
        self._port_memo: tuple[object, _PortFamilies] | None = None
        self._error_memo: tuple[object, list[SeriesFamily | None]] | None = None
        self._hw_memo: tuple[object, list[SeriesFamily | None]] | None = None
        if tools is None:
            log.info("infiniband-diags not found: reading InfiniBand from sysfs alone")

    @property
    def tools(self) -> IbTools | None:
        """The infiniband-diags wrappers in use, or None when they are not installed."""
        return self._tools

    def collect(self) -> list[Metric]:
        """One collection: drain hotplug events, re-discover if needed, read, map."""
        self._maybe_rediscover()
        reading = self._sysfs.read()
        if reading.problems:
            self._report(reading.problems)
        if reading.vanished:
            log.info(
                "InfiniBand devices vanished while reading",
                extra={"devices": list(reading.vanished)},
            )
            self._discovered_at = None
        return self._families(reading)

    def close(self) -> None:
        self._sysfs.close()
        self._events.close()

    # -- discovery ----------------------------------------------------------------------
    def _maybe_rediscover(self) -> None:
        events = self._events.drain()
        for event in events:
            key = (event.subsystem, event.action)
            self._event_counts[key] = self._event_counts.get(key, 0) + 1
        now = self._monotonic()
        periodic = self._discovered_at is None or (
            now - self._discovered_at >= self._rediscover_seconds
        )
        if events or periodic or self._events.lost:
            self._report(self._sysfs.discover())
            self._discovered_at = now
            self._labels.clear()
            self._event_labels = []
            self._layout = _layout(self._sysfs.devices(), self._labels, self._expected)
            self._port_memo = self._error_memo = self._hw_memo = None
            self._note_sysfs_only_ports()
            if events:
                log.info(
                    "re-discovered InfiniBand devices after udev events",
                    extra={"events": len(events), "devices": list(self._sysfs.listing())},
                )

    def _note_sysfs_only_ports(self) -> None:
        """perfquery speaks to InfiniBand ports only: say once which ports it will not see."""
        if self._tools is None:
            return
        for port in self._layout.ports:
            if port.link_layer != "InfiniBand":
                self._log_once(
                    (f"{port.device}:{port.port}", "roce"),
                    "not an InfiniBand link layer: reading this port from sysfs alone",
                    device=port.device,
                    port=port.port,
                    link_layer=port.link_layer,
                )

    def _report(self, problems: Iterable[ReadProblem]) -> None:
        """Log each problem once per file and reason: a stuck garbage file is not news."""
        for problem in problems:
            key = (problem.path, problem.reason)
            self._log_once(
                key, "skipped an InfiniBand sysfs value", path=problem.path, reason=problem.reason
            )

    def _log_once(self, key: tuple[str, str], message: str, **fields: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, extra=fields)

    # -- mapping ------------------------------------------------------------------------
    # Families are rebuilt only from inputs that changed: traffic moves every cycle, but
    # port states, error counters and hw_counters mostly do not, and comparing a tuple
    # of values is far cheaper than rebuilding their families. Family objects are never
    # mutated after collect() returns, so handing out the same one again is safe.
    def _families(self, reading: IbReading) -> list[Metric]:
        layout = self._layout
        gathered = layout.gather(reading.values)
        head, changes = self._port_families(reading)
        traffic = []
        for series, span in layout.traffic:
            words = gathered[span]
            if series.family == DATA:
                words = tuple(None if v is None else v * _DATA_WORD_BYTES for v in words)
            traffic.append(self._family(series.family, series.labels, words))
        pma = gathered[layout.pma_span]
        if self._error_memo is not None and self._error_memo[0] == pma:
            errors = self._error_memo[1]
        else:
            errors, widened = self._error_families(reading, pma)
            # perfquery's 64-bit values move while the pinned sysfs ones do not.
            self._error_memo = None if widened else (pma, errors)
        hw = gathered[layout.hw_span]
        if self._hw_memo is None or self._hw_memo[0] != hw:
            self._hw_memo = (hw, [self._family(HW_COUNTER, layout.hw.labels, hw)])
        families = [*head, *traffic, *errors, *changes, *self._hw_memo[1], *self._events_family()]
        return [family for family in families if family is not None]

    def _family(
        self, name: str, labels: list[dict[str, str]], values: Sequence[float | None]
    ) -> SeriesFamily | None:
        """The family, or None when it has no value (left out of the exposition)."""
        if values.count(None) == len(values):
            return None
        return SeriesFamily(self._labels.specs[name], labels, values)

    def _port_families(self, reading: IbReading) -> _PortFamilies:
        """INFO to EXPECTED_RATE, and STATE_CHANGES: rebuilt when a port's state moved."""
        layout = self._layout
        key = (reading.ports, layout.pick_downed(reading.values))
        if self._port_memo is not None and self._port_memo[0] == key:
            return self._port_memo[1]
        columns, asked_ibstat = self._port_columns(reading)
        info, up, state, phys, rate, expected, changes = columns
        own = layout.own
        families = (
            [
                self._family(INFO, layout.info, info),
                self._family(UP, own, up),
                self._family(STATE, own, state),
                self._family(PHYS_STATE, own, phys),
                self._family(RATE, own, rate),
                self._family(EXPECTED_RATE, own, expected),
            ],
            [self._family(STATE_CHANGES, own, changes)],
        )
        # A rate from ibstat is not in the key: ask again next cycle.
        self._port_memo = None if asked_ibstat else (key, families)
        return families

    def _error_families(
        self, reading: IbReading, pma: Sequence[int | None]
    ) -> tuple[list[SeriesFamily | None], bool]:
        """ERRORS, XMIT_WAIT and SATURATED from the PMA error counters of every port.

        Also says whether pinned counters were widened with `perfquery -x` values.
        """
        layout = self._layout
        saturated: Sequence[bool | None]
        if None in pma:
            saturated = [
                None if value is None else value >= limit
                for value, limit in zip(pma, layout.pma_limits, strict=True)
            ]
        else:
            saturated = tuple(map(operator.ge, cast(tuple[int, ...], pma), layout.pma_limits))
        widened = self._tools is not None and True in saturated
        if widened:
            pma, saturated = self._widen(reading, pma, saturated)
        (errors, pick_errors), (wait, pick_wait) = layout.errors, layout.wait
        families = [
            self._family(ERRORS, errors.labels, pick_errors(pma)),
            self._family(XMIT_WAIT, wait.labels, pick_wait(pma)),
            self._family(SATURATED, layout.pma.labels, saturated),
        ]
        return families, widened

    def _port_columns(self, reading: IbReading) -> tuple[list[Sequence[float | None]], bool]:
        """Per port: info, up, state, physical state, rate, expected rate, state changes.

        Also says whether ibstat was asked for a rate sysfs could not give.
        """
        layout, values = self._layout, reading.values
        fallback: dict[tuple[str, int], float] | None = None
        rows: list[tuple[float | None, ...]] = []
        for index, now in enumerate(reading.ports):
            if now is None:  # its device vanished while being read
                rows.append((None,) * 7)
                continue
            port, active = layout.ports[index], now.active
            gbps = now.rate_gbps
            if gbps is None and active and port.link_layer == "InfiniBand":
                if fallback is None:
                    fallback = self._ibstat_rates()
                gbps = fallback.get((port.device, port.port))
            downed = layout.link_downed[index]
            rows.append((
                1,
                None if now.state_id is None or now.phys_state_id is None else int(active),
                now.state_id,
                now.phys_state_id,
                # A port that is not up reports a leftover rate that means nothing.
                gbps * _BYTES_PER_GBIT if active and gbps is not None else None,
                layout.expected[index],
                self._count_state_changes(port, now, None if downed is None else values[downed]),
            ))  # fmt: skip
        columns: list[Sequence[float | None]] = list(zip(*rows, strict=True)) if rows else [()] * 7
        return columns, fallback is not None

    def _events_family(self) -> list[SeriesFamily | None]:
        """udev event counts, with a label list that changes only when a new kind appears."""
        if not self._event_counts:
            return []
        keys = sorted(self._event_counts)
        if len(self._event_labels) != len(keys):
            self._event_labels = [self._labels.labels(DEVICE_EVENTS, key) for key in keys]
        counts = [self._event_counts[key] for key in keys]
        return [self._family(DEVICE_EVENTS, self._event_labels, counts)]

    def _widen(
        self, reading: IbReading, pma: Sequence[int | None], flags: Sequence[bool | None]
    ) -> tuple[list[int | None], list[bool | None]]:
        """The PMA error counters with pinned ones replaced by `perfquery -x` 64-bit values."""
        layout, values, saturated = self._layout, list(pma), list(flags)
        pinned: dict[int, list[int]] = {}
        for position, flag in enumerate(saturated):
            if flag:
                pinned.setdefault(layout.pma_ports[position], []).append(position)
        for index, positions in pinned.items():
            port = layout.ports[index]
            if port.link_layer != "InfiniBand" or reading.ports[index] is None:
                continue
            wide = self._extended_errors(port)
            for position in positions:
                value = wide.get(layout.pma_errors[position])
                if value is not None:
                    values[position] = value
                    saturated[position] = value >= (1 << 64) - 1
        return values, saturated

    def _ibstat_rates(self) -> dict[tuple[str, int], float]:
        """Rates from `ibstat`, for active ports whose sysfs `rate` could not be read."""
        if self._tools is None:
            return {}
        try:
            cas, error = self._tools.ibstat()
        except IbToolError as exc:
            self._log_once(
                ("ibstat", str(exc)),
                "ibstat failed; rates missing from sysfs stay absent",
                reason=str(exc),
            )
            return {}
        if error is not None:
            self._log_once(("ibstat", error), "ibstat listing was cut short", reason=error)
        return {
            (ca.name, p.port): p.rate_gbps
            for ca in cas
            for p in ca.ports
            if p.rate_gbps is not None
        }

    def _extended_errors(self, port: IbPort) -> Mapping[str, int]:
        """64-bit error counters from `perfquery -x`; empty when it cannot give them.

        A pinned counter stays pinned until someone resets it (a real host had four of
        them), so each port's values are refreshed at most once per perfquery interval
        instead of spawning a process per port every cycle; a failure is retried then.
        """
        assert self._tools is not None
        key, now = (port.device, port.port), self._monotonic()
        cached = self._extended.get(key)
        if cached is not None and now - cached[0] < self._perfquery_seconds:
            return cached[1]
        counters: Mapping[str, int] = {}
        try:
            counters = self._tools.perfquery_extended(port.device, port.port).error_counters()
        except IbToolError as exc:
            self._log_once(
                (f"perfquery {port.device}:{port.port}", str(exc)),
                "perfquery failed; using saturated sysfs counters",
                device=port.device,
                port=port.port,
                reason=str(exc),
            )
        self._extended[key] = (now, counters)
        return counters

    def _count_state_changes(self, port: IbPort, now: IbPortState, downed: int | None) -> int:
        """Transitions since the last cycle: seen directly, or implied by link_downed.

        `link_downed` counts up→down transitions, so d new downs mean 2d transitions if
        the port is in the same up/down state as before, 2d-1 if it went down, 2d+1 if
        it came up. A saturated or missing link_downed falls back to what was seen.
        """
        key = (port.device, port.port)
        if downed is not None and downed >= 255:
            downed = None
        previous, current = self._last_state.get(key), (now.state_id, downed)
        if previous == current:
            return self._state_changes[key]
        self._last_state[key] = current
        total = self._state_changes.get(key, 0)
        if previous is not None:
            before_state, before_downed = previous
            seen = 1 if before_state != now.state_id else 0
            implied = 0
            if downed is not None and before_downed is not None and downed > before_downed:
                downs = downed - before_downed
                was_up, is_up = before_state == 4, now.state_id == 4
                implied = 2 * downs + (0 if was_up == is_up else (1 if is_up else -1))
            total += max(seen, implied)
        self._state_changes[key] = total
        return total


def _add_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--collector.infiniband.expected-rate",
        dest="infiniband_expected_rate",
        type=parse_expected_rates,
        default=None,
        metavar="[DEVICE[:PORT]=]GBPS,...",
        help="expected link rate in Gb/s, e.g. 400 or 'mlx5_[0-7]=400,mlx5_8=200' (first "
        "match wins); exported beside the trained rate so a degraded link is visible",
    )
    group.add_argument(
        "--collector.infiniband.rediscover-interval",
        dest="infiniband_rediscover_interval",
        type=positive_duration,
        default=60.0,
        metavar="DURATION",
        help="re-discover InfiniBand devices at least this often, in addition to udev "
        "hotplug events (default 60s)",
    )
    group.add_argument(
        "--collector.infiniband.perfquery-interval",
        dest="infiniband_perfquery_interval",
        type=positive_duration,
        default=30.0,
        metavar="DURATION",
        help="refresh the 64-bit perfquery -x error counters of a port with a saturated "
        "sysfs counter at most this often (default 30s)",
    )
    group.add_argument(
        "--collector.infiniband.tool-timeout",
        dest="infiniband_tool_timeout",
        type=positive_duration,
        default=2.0,
        metavar="DURATION",
        help="timeout for each perfquery/ibstat call (default 2s)",
    )


def _simulated_expected_rates(context: CollectorContext) -> tuple[ExpectedRate, ...]:
    """Under --simulate, a scenario's `expected_rate_gbps` stands in for the flag."""
    if context.simulation is None:
        return ()
    return tuple(
        ExpectedRate(device_glob=hca.device, port=None, gbps=float(hca.expected_rate_gbps))
        for hca in context.simulation.scenario.infiniband
        if hca.expected_rate_gbps is not None
    )


def create(context: CollectorContext, args: argparse.Namespace) -> InfinibandCollector:
    """Build the collector from the shared context and its flags."""
    sysfs = InfinibandSysfs(root=context.sysfs_root)
    rates = getattr(args, "infiniband_expected_rate", None)
    timeout = getattr(args, "infiniband_tool_timeout", 2.0)
    return InfinibandCollector(
        sysfs=sysfs,
        tools=IbTools.find(
            search_path=context.tool_path,
            timeout_seconds=timeout,
            listing=sysfs.listing,
            sysfs_root=str(context.sysfs_root),
        ),
        events=open_device_events(),
        expected_rates=rates if rates is not None else _simulated_expected_rates(context),
        rediscover_seconds=getattr(args, "infiniband_rediscover_interval", 60.0),
        perfquery_seconds=getattr(args, "infiniband_perfquery_interval", 30.0),
    )


SPEC = CollectorSpec(
    name="infiniband",
    help="InfiniBand/RoCE ports: state, rate, counters, saturation, flaps, topology",
    create=create,
    add_flags=_add_flags,
    metrics=SPECS,
)
