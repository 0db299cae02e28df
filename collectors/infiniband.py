"""The fabric collector: InfiniBand and RoCE ports from sysfs, infiniband-diags and udev.

Maps `collectors.sources.sysfs` readings to the InfiniBand families of the metric
contract (catalog/infiniband.py). On top of the raw counters it adds what operators
need to see a bad link before it kills a job:

- saturation: a PMA error counter pinned at all-ones reads as a zero rate exactly when
  the link is worst, so `fleetwatch_infiniband_port_error_saturated` flags it, and when
  `perfquery -x` can read the 64-bit extended error counters (CapMask2 bit 1) for that
  port, those values replace the pinned ones (`infiniband_links.ToolFallbacks`);
- flaps: `fleetwatch_infiniband_port_state_changes_total` counts state transitions seen
  between cycles plus those implied by `link_downed`, so a flap shorter than a scrape
  interval still shows (`infiniband_links.StateChangeCounter`);
- degraded links: the trained rate beside a configured expected rate;
- topology: the NUMA node and the GPUs under the same PCIe switch on the `_info` series;
- hotplug: udev events (or a periodic timer where udev is unreachable) re-run discovery.

Which series exist and where each value comes from is `infiniband_layout`'s job; this
module reads, decides what changed, and builds the families.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from fleetwatch.catalog.infiniband import (
    INFINIBAND_PORT_ERROR_SATURATED,
    INFINIBAND_PORT_HW_STAT_TOTAL,
)
from fleetwatch.collectors.base import CollectorContext, CollectorSpec
from fleetwatch.collectors.families import LabelCache, SeriesFamily
from fleetwatch.collectors.infiniband_layout import (
    BYTES_PER_GBIT,
    DATA,
    DATA_WORD_BYTES,
    DEVICE_EVENTS,
    ERRORS,
    EXPECTED_RATE,
    HW_COUNTER,
    INFO,
    PHYS_STATE,
    RATE,
    READ_ERRORS,
    SATURATED,
    SPECS,
    STATE,
    STATE_CHANGES,
    UP,
    XMIT_WAIT,
    ExpectedRate,
    build_layout,
    parse_expected_rates,
)
from fleetwatch.collectors.infiniband_links import StateChangeCounter, ToolFallbacks
from fleetwatch.collectors.sources.files import ReadProblems
from fleetwatch.collectors.sources.ibtools import IbTools
from fleetwatch.collectors.sources.sysfs import IbReading, InfinibandSysfs
from fleetwatch.collectors.sources.udev import DeviceEvents, open_device_events
from fleetwatch.flags import duration_setting, setting
from fleetwatch.logs import LogOnce

log = logging.getLogger(__name__)

# The port-level families: INFO to EXPECTED_RATE, then STATE_CHANGES (spec order).
_PortFamilies = tuple[list[SeriesFamily | None], list[SeriesFamily | None]]


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
        hw_stats_seconds: float = 30.0,
        hw_stats: bool = True,
        saturation_zeros: bool = True,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sysfs = sysfs
        self._events = events
        self._expected = expected_rates
        self._rediscover_seconds = rediscover_seconds
        self._once = LogOnce(log)
        self._fallbacks = (
            None
            if tools is None
            else ToolFallbacks(
                tools=tools, perfquery_seconds=perfquery_seconds, once=self._once,
                monotonic=monotonic,
            )
        )  # fmt: skip
        self._monotonic = monotonic
        self._hw_stats_seconds = hw_stats_seconds
        self._hw_stats = hw_stats
        self._saturation_zeros = saturation_zeros
        self._hw_read_at: float | None = None
        self._discovered_at: float | None = None
        self._read_problems = ReadProblems(self._once, "skipped an InfiniBand sysfs value")
        self._event_counts: dict[tuple[str, str], int] = {}
        self._event_labels: list[dict[str, str]] = []
        self._state_changes = StateChangeCounter()
        self._labels = LabelCache(SPECS)
        self._layout = build_layout((), self._labels, ())
        # (the inputs, the families built from them); see `_families`.
        self._port_memo: tuple[object, _PortFamilies] | None = None
        self._error_memo: tuple[object, list[SeriesFamily | None]] | None = None
        self._hw_memo: tuple[object, list[SeriesFamily | None]] | None = None
        if tools is None:
            log.info("infiniband-diags not found: reading InfiniBand from sysfs alone")

    @property
    def tools(self) -> IbTools | None:
        """The infiniband-diags wrappers in use, or None when they are not installed."""
        return None if self._fallbacks is None else self._fallbacks.tools

    def collect(self) -> list[SeriesFamily]:
        """One collection: drain hotplug events, re-discover if needed, read, map."""
        self._maybe_rediscover()
        # hw_counters are driver diagnostics that the driver refreshes from the device
        # (firmware commands on mlx5): read them at most every `hw_stats_seconds`, the
        # port counters every cycle.
        now = self._monotonic()
        hw = self._hw_stats and (
            self._hw_read_at is None or now - self._hw_read_at >= self._hw_stats_seconds
        )
        reading = self._sysfs.read(hw_counters=hw)
        if hw:
            self._hw_read_at = now
        if reading.problems:
            self._read_problems.report(reading.problems)
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
        if events or self._events.lost or self._discovered_at is None:
            rediscover = True
        elif now - self._discovered_at >= self._rediscover_seconds:
            # The timer, without a hotplug event: discover again only if something it was
            # made from changed (a discovery opens every counter file; the check lists).
            rediscover = not self._sysfs.unchanged()
            self._discovered_at = now
        else:
            rediscover = False
        if rediscover:
            self._read_problems.report(self._sysfs.discover())
            self._discovered_at = now
            self._hw_read_at = None  # new descriptors: read everything once
            self._labels.clear()
            self._event_labels = []
            self._layout = build_layout(
                self._sysfs.devices(), self._labels, self._expected, hw_stats=self._hw_stats
            )
            self._port_memo = self._error_memo = self._hw_memo = None
            self._note_sysfs_only_ports()
            if events:
                log.info(
                    "re-discovered InfiniBand devices after udev events",
                    extra={"events": len(events), "devices": list(self._sysfs.listing())},
                )

    def _note_sysfs_only_ports(self) -> None:
        """perfquery speaks to InfiniBand ports only: say once which ports it will not see."""
        if self._fallbacks is None:
            return
        for port in self._layout.ports:
            if port.link_layer != "InfiniBand":
                self._once.warning(
                    (f"{port.device}:{port.port}", "roce"),
                    "not an InfiniBand link layer: reading this port from sysfs alone",
                    device=port.device,
                    port=port.port,
                    link_layer=port.link_layer,
                )

    # -- mapping ------------------------------------------------------------------------
    # Families are rebuilt only from inputs that changed: traffic moves every cycle, but
    # port states, error counters and hw_counters mostly do not, and comparing a tuple
    # of values is far cheaper than rebuilding their families. SeriesFamily objects are never
    # mutated after collect() returns, so handing out the same one again is safe.
    def _families(self, reading: IbReading) -> list[SeriesFamily]:
        layout = self._layout
        gathered = layout.gather(reading.values)
        head, changes = self._port_families(reading)
        traffic = []
        for series, span in layout.traffic:
            words = gathered[span]
            if series.family == DATA:
                words = tuple(None if v is None else v * DATA_WORD_BYTES for v in words)
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
        families = [
            *head, *traffic, *errors, *changes, *self._hw_memo[1], *self._events_family(),
            self._read_errors_family(),
        ]  # fmt: skip
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
        fallbacks = self._fallbacks
        widened = fallbacks is not None and True in saturated
        if fallbacks is not None and widened:
            pma, saturated = fallbacks.widen(layout, reading, pma, saturated)
        (errors, pick_errors), (wait, pick_wait) = layout.errors, layout.wait
        if not self._saturation_zeros:
            # Lean: a flag is exported only while it is set (the alert, the dashboards and
            # the report read `== 1` or its time at 1, which an absent 0 does not change).
            # A tuple, so the renderer knows the memoised family again by its values.
            saturated = tuple([True if flag else None for flag in saturated])
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
                    fallback = {} if self._fallbacks is None else self._fallbacks.ibstat_rates()
                gbps = fallback.get((port.device, port.port))
            downed = layout.link_downed[index]
            rows.append((
                1,
                None if now.state_id is None or now.phys_state_id is None else int(active),
                now.state_id,
                now.phys_state_id,
                # A port that is not up reports a leftover rate that means nothing.
                gbps * BYTES_PER_GBIT if active and gbps is not None else None,
                layout.expected[index],
                self._state_changes.count(port, now, None if downed is None else values[downed]),
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

    def _read_errors_family(self) -> SeriesFamily | None:
        """Skipped sysfs values so far; absent until the first one."""
        if not self._read_problems.total:
            return None
        return self._family(
            READ_ERRORS, [self._labels.labels(READ_ERRORS, ())], [self._read_problems.total]
        )


@dataclass(frozen=True, kw_only=True)
class InfinibandSettings:
    """`--collector.infiniband.*` flags."""

    expected_rate: tuple[ExpectedRate, ...] = setting(
        (),
        parse=parse_expected_rates,
        metavar="[DEVICE[:PORT]=]GBPS,...",
        help="expected link rate in Gb/s, e.g. 400 or 'mlx5_[0-7]=400,mlx5_8=200' (first "
        "match wins); exported beside the trained rate so a degraded link is visible",
    )
    rediscover_interval: float = duration_setting(
        60.0,
        minimum=1.0,
        maximum=86400.0,
        help="check at least this often, in addition to udev hotplug events, whether the "
        "InfiniBand devices, ports, counter files or their attributes changed, and "
        "re-discover them if so",
    )
    perfquery_interval: float = duration_setting(
        30.0,
        minimum=1.0,
        maximum=86400.0,
        help="refresh the 64-bit perfquery -x error counters of a port with a saturated "
        "sysfs counter at most this often",
    )
    hw_stats_interval: float = duration_setting(
        30.0,
        minimum=1.0,
        maximum=86400.0,
        flag="{prefix}.hw-stats.interval",
        deprecated=("collector.infiniband.hw-stats-interval",),
        help="read the driver's hw_counters files at most this often (the driver refreshes "
        "them from the device, on mlx5 with firmware commands); the port counters are read "
        "every collection",
    )
    hw_stats: bool = setting(
        True,
        help=f"export the driver's hw_counters as {INFINIBAND_PORT_HW_STAT_TOTAL} "
        "(about 26 series a ConnectX-7 port); off in the lean profile, which keeps the PMA "
        "port counters every alert reads",
    )
    saturation_zeros: bool = setting(
        True,
        help=f"export {INFINIBAND_PORT_ERROR_SATURATED} at 0 for every counter that "
        "is not pinned; off (lean profile), a flag is exported only while it is 1",
    )
    tool_timeout: float = duration_setting(
        2.0,
        minimum=0.01,
        maximum=60.0,
        help="timeout for each perfquery/ibstat call",
    )


def create(context: CollectorContext, settings: InfinibandSettings) -> InfinibandCollector:
    """Build the collector from the shared context and its settings."""
    sysfs = InfinibandSysfs(root=context.sysfs_root)
    return InfinibandCollector(
        sysfs=sysfs,
        tools=IbTools.find(
            search_path=context.tool_path,
            timeout_seconds=settings.tool_timeout,
            listing=sysfs.listing,
            sysfs_root=str(context.sysfs_root),
        ),
        events=open_device_events(),
        expected_rates=settings.expected_rate,
        rediscover_seconds=settings.rediscover_interval,
        perfquery_seconds=settings.perfquery_interval,
        hw_stats_seconds=settings.hw_stats_interval,
        hw_stats=settings.hw_stats,
        saturation_zeros=settings.saturation_zeros,
    )


SPEC = CollectorSpec(
    name="infiniband",
    help="InfiniBand/RoCE ports: state, rate, counters, saturation, flaps, topology",
    settings=InfinibandSettings,
    create=create,
    metrics=SPECS,
)
