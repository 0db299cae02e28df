"""The fabric collector: InfiniBand and RoCE ports from sysfs, infiniband-diags and udev.

Maps `collectors.sources.sysfs` readings to the InfiniBand families of the metric
contract (DESIGN.md), from one table of metric specs. On top of the raw counters it adds
what operators need to see a bad link before it kills a job:

- saturation: a PMA error counter pinned at all-ones reads as a zero rate exactly when
  the link is worst, so `fleetwatch_infiniband_port_counter_saturated` flags it, and when
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
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Final

from prometheus_client.metrics_core import Metric

from collectors.base import CollectorContext, CollectorSpec
from collectors.metrics import FamilyBuilder, LabelCache, MetricSpec
from collectors.sources.ibtools import IbToolError, IbTools
from collectors.sources.sysfs import (
    PMA_ERROR_COUNTERS,
    IbDeviceReading,
    IbPortReading,
    IbReading,
    InfinibandSysfs,
    ReadProblem,
)
from collectors.sources.udev import DeviceEvents, open_device_events
from exporter.flagtypes import positive_duration

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
SATURATED = "fleetwatch_infiniband_port_counter_saturated"
STATE_CHANGES = "fleetwatch_infiniband_port_state_changes_total"
HW_COUNTER = "fleetwatch_infiniband_hw_counter_total"
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
               "maximum, so its rate reads 0 however bad the link is.", (*_PORT, "counter")),
    MetricSpec(STATE_CHANGES, "counter", "Port state transitions seen between collections, "
               "plus those implied by link_downed (flaps shorter than an interval).", _PORT),
    MetricSpec(HW_COUNTER, "counter", "Driver hw_counters by raw name (port \"\" for "
               "device-level counters).", (*_PORT, "counter")),
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
class _PortPlan:
    """Everything about a port's samples that does not change between discoveries."""

    ids: tuple[str, str]
    info: dict[str, str]
    port: dict[str, str]
    expected_gbps: float | None
    traffic: tuple[tuple[str, str, int, dict[str, str]], ...]
    errors: tuple[tuple[str, str, int, str, dict[str, str], dict[str, str]], ...]


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
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sysfs = sysfs
        self._tools = tools
        self._events = events
        self._expected = expected_rates
        self._rediscover_seconds = rediscover_seconds
        self._monotonic = monotonic
        self._discovered_at: float | None = None
        self._logged: set[tuple[str, str]] = set()
        self._event_counts: dict[tuple[str, str], int] = {}
        self._last_state: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        self._state_changes: dict[tuple[str, int], int] = {}
        self._labels = LabelCache(SPECS)
        self._plans: dict[tuple[str, int], _PortPlan] = {}
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
            self._plans.clear()
            if events:
                log.info(
                    "re-discovered InfiniBand devices after udev events",
                    extra={"events": len(events), "devices": list(self._sysfs.listing())},
                )

    def _report(self, problems: Iterable[ReadProblem]) -> None:
        """Log each problem once per file and reason: a stuck garbage file is not news."""
        for problem in problems:
            key = (problem.path, problem.reason)
            self._log_once(
                key, "skipped an InfiniBand sysfs value", path=problem.path, reason=problem.reason
            )

    # -- mapping ------------------------------------------------------------------------
    def _families(self, reading: IbReading) -> list[Metric]:
        out = FamilyBuilder(self._labels)
        fallback = self._ibstat_rates(reading)
        for device in reading.devices:
            for port in device.ports:
                self._add_port(out, device, port, fallback.get((port.device, port.port)))
            for name, value in sorted(device.hw_counters.items()):
                out.put(
                    HW_COUNTER,
                    self._labels.labels(HW_COUNTER, (device.info.device, "", name)),
                    value,
                )
        for (subsystem, action), count in sorted(self._event_counts.items()):
            out.put(DEVICE_EVENTS, self._labels.labels(DEVICE_EVENTS, (subsystem, action)), count)
        return out.families()

    def _plan(self, device: IbDeviceReading, port: IbPortReading) -> _PortPlan:
        """Label dicts for every sample of a port, built once per discovery."""
        info, topo = device.info, device.info.topology
        ids = (info.device, str(port.port))
        labels = partial(self._labels_for, ids=ids)
        return _PortPlan(
            ids=ids,
            info=labels(INFO, (port.link_layer or "", info.board_id or "",
                              info.firmware_version or "", info.hca_type or "",
                              info.node_guid or "", topo.pci_address or "",
                              "" if topo.numa_node is None else str(topo.numa_node),
                              ",".join(str(gpu) for gpu in topo.gpus))),
            port=labels(UP, ()),
            expected_gbps=expected_rate_gbps(self._expected, info.device, port.port),
            traffic=tuple(
                (family, name, _DATA_WORD_BYTES if family == DATA else 1,
                 labels(family, (direction,)))
                for name, (family, direction) in _TRAFFIC.items()
            ),
            errors=tuple(
                (name, error, (1 << bits) - 1,
                 XMIT_WAIT if error == "xmit_wait" else ERRORS,
                 labels(XMIT_WAIT, ()) if error == "xmit_wait" else labels(ERRORS, (error,)),
                 labels(SATURATED, (error,)))
                for name, (error, bits) in PMA_ERROR_COUNTERS.items()
            ),
        )  # fmt: skip

    def _labels_for(
        self, family: str, extra: tuple[str, ...], *, ids: tuple[str, str]
    ) -> dict[str, str]:
        return self._labels.labels(family, (*ids, *extra))

    def _add_port(
        self,
        out: FamilyBuilder,
        device: IbDeviceReading,
        port: IbPortReading,
        fallback_rate_gbps: float | None,
    ) -> None:
        key = (port.device, port.port)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(device, port)
        put, own = out.put, plan.port
        put(INFO, plan.info, 1)
        if port.state_id is not None and port.phys_state_id is not None:
            put(UP, own, 1 if port.active else 0)
        put(STATE, own, port.state_id)
        put(PHYS_STATE, own, port.phys_state_id)
        # A port that is not up reports a leftover rate that means nothing.
        rate = port.rate_gbps if port.rate_gbps is not None else fallback_rate_gbps
        if port.active and rate is not None:
            put(RATE, own, rate * _BYTES_PER_GBIT)
        if plan.expected_gbps is not None:
            put(EXPECTED_RATE, own, plan.expected_gbps * _BYTES_PER_GBIT)
        counters = port.counters
        for family, name, scale, labels in plan.traffic:
            value = counters.get(name)
            if value is not None:
                put(family, labels, value * scale)
        extended = self._extended_errors(port, plan)
        for name, error, limit, family, labels, saturated_labels in plan.errors:
            value = counters.get(name)
            if value is None:
                continue
            saturated = value >= limit
            wide = extended.get(error) if saturated else None
            if wide is not None:
                value, saturated = wide, wide >= (1 << 64) - 1
            put(family, labels, value)
            put(SATURATED, saturated_labels, 1 if saturated else 0)
        put(STATE_CHANGES, own, self._count_state_changes(port))
        if port.hw_counters:
            hw = self._labels.labels
            for name, value in sorted(port.hw_counters.items()):
                put(HW_COUNTER, hw(HW_COUNTER, (*plan.ids, name)), value)

    def _log_once(self, key: tuple[str, str], message: str, **fields: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, extra=fields)

    def _ibstat_rates(self, reading: IbReading) -> dict[tuple[str, int], float]:
        """Rates from `ibstat` for active ports whose sysfs `rate` could not be read."""
        missing = [
            port
            for device in reading.devices
            for port in device.ports
            if port.active and port.rate_gbps is None and port.link_layer == "InfiniBand"
        ]
        if not missing or self._tools is None:
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

    def _extended_errors(self, port: IbPortReading, plan: _PortPlan) -> Mapping[str, int]:
        """64-bit error counters from `perfquery -x`, only for ports with a pinned counter."""
        if self._tools is None:
            return {}
        if port.link_layer != "InfiniBand":
            self._log_once(
                (f"{port.device}:{port.port}", "roce"),
                "not an InfiniBand link layer: reading this port from sysfs alone",
                device=port.device,
                port=port.port,
                link_layer=port.link_layer,
            )
            return {}
        pinned = any(port.counters.get(entry[0], 0) >= entry[2] for entry in plan.errors)
        if not pinned:
            return {}
        try:
            counters = self._tools.perfquery_extended(port.device, port.port)
        except IbToolError as exc:
            self._log_once(
                (f"perfquery {port.device}:{port.port}", str(exc)),
                "perfquery failed; using saturated sysfs counters",
                device=port.device,
                port=port.port,
                reason=str(exc),
            )
            return {}
        return counters.error_counters()

    def _count_state_changes(self, port: IbPortReading) -> int:
        """Transitions since the last cycle: seen directly, or implied by link_downed.

        `link_downed` counts up→down transitions, so d new downs mean 2d transitions if
        the port is in the same up/down state as before, 2d-1 if it went down, 2d+1 if
        it came up. A saturated or missing link_downed falls back to what was seen.
        """
        key = (port.device, port.port)
        downed = port.counters.get("link_downed")
        if downed is not None and downed >= 255:
            downed = None
        previous = self._last_state.get(key)
        self._last_state[key] = (port.state_id, downed)
        total = self._state_changes.get(key, 0)
        if previous is not None:
            before_state, before_downed = previous
            seen = 1 if before_state != port.state_id else 0
            implied = 0
            if downed is not None and before_downed is not None and downed > before_downed:
                downs = downed - before_downed
                was_up, is_up = before_state == 4, port.state_id == 4
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
    )


SPEC = CollectorSpec(
    name="infiniband",
    help="InfiniBand/RoCE ports: state, rate, counters, saturation, flaps, topology",
    create=create,
    add_flags=_add_flags,
    metrics=SPECS,
)
