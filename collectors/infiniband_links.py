"""What the InfiniBand counters alone cannot say: flaps between cycles, and pinned counters.

- `StateChangeCounter`: port state transitions seen between collections plus those
  implied by `link_downed`, so a flap shorter than a collection interval still counts;
- `ToolFallbacks`: infiniband-diags where sysfs falls short. `perfquery -x` reads the
  64-bit extended error counters (CapMask2 bit 1) that replace PMA counters pinned at
  their all-ones maximum, refreshed at most once per interval per port; `ibstat` gives
  the rate of an active port whose sysfs `rate` could not be read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from fleetwatch.collectors.infiniband_layout import Layout
from fleetwatch.collectors.sources.ibtools import IbToolError, IbTools
from fleetwatch.collectors.sources.sysfs import IbPort, IbPortState, IbReading
from fleetwatch.logs import LogOnce

_ACTIVE = 4
_LINK_DOWNED_MAX = 255  # 8-bit PMA counter: pinned there, it says nothing more


class StateChangeCounter:
    """Per port, the state transitions seen so far (a counter that only grows)."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        self._totals: dict[tuple[str, int], int] = {}

    def count(self, port: IbPort, now: IbPortState, downed: int | None) -> int:
        """Transitions since the last cycle added to the total: seen, or implied by link_downed.

        `link_downed` counts up→down transitions, so d new downs mean 2d transitions if
        the port is in the same up/down state as before, 2d-1 if it went down, 2d+1 if
        it came up. A saturated or missing link_downed falls back to what was seen.
        """
        key = (port.device, port.port)
        if downed is not None and downed >= _LINK_DOWNED_MAX:
            downed = None
        previous, current = self._last.get(key), (now.state_id, downed)
        if previous == current:
            return self._totals[key]
        self._last[key] = current
        total = self._totals.get(key, 0)
        if previous is not None:
            before_state, before_downed = previous
            seen = 1 if before_state != now.state_id else 0
            implied = 0
            if downed is not None and before_downed is not None and downed > before_downed:
                downs = downed - before_downed
                was_up, is_up = before_state == _ACTIVE, now.state_id == _ACTIVE
                implied = 2 * downs + (0 if was_up == is_up else (1 if is_up else -1))
            total += max(seen, implied)
        self._totals[key] = total
        return total


class ToolFallbacks:
    """perfquery and ibstat where sysfs falls short; each failure logged once."""

    def __init__(
        self,
        *,
        tools: IbTools,
        perfquery_seconds: float,
        once: LogOnce,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tools = tools
        self._perfquery_seconds = perfquery_seconds
        self._once = once
        self._monotonic = monotonic
        # Per port: when perfquery -x last ran, and what it gave ({} when it failed).
        self._extended: dict[tuple[str, int], tuple[float, Mapping[str, int]]] = {}

    def widen(
        self,
        layout: Layout,
        reading: IbReading,
        pma: Sequence[int | None],
        flags: Sequence[bool | None],
    ) -> tuple[list[int | None], list[bool | None]]:
        """The PMA error counters with pinned ones replaced by `perfquery -x` 64-bit values."""
        values, saturated = list(pma), list(flags)
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

    def ibstat_rates(self) -> dict[tuple[str, int], float]:
        """Rates from `ibstat`, for active ports whose sysfs `rate` could not be read."""
        try:
            cas, error = self.tools.ibstat()
        except IbToolError as exc:
            self._once.warning(
                ("ibstat", str(exc)),
                "ibstat failed; rates missing from sysfs stay absent",
                reason=str(exc),
            )
            return {}
        if error is not None:
            self._once.warning(("ibstat", error), "ibstat listing was cut short", reason=error)
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
        key, now = (port.device, port.port), self._monotonic()
        cached = self._extended.get(key)
        if cached is not None and now - cached[0] < self._perfquery_seconds:
            return cached[1]
        counters: Mapping[str, int] = {}
        try:
            counters = self.tools.perfquery_extended(port.device, port.port).error_counters()
        except IbToolError as exc:
            self._once.warning(
                (f"perfquery {port.device}:{port.port}", str(exc)),
                "perfquery failed; using saturated sysfs counters",
                device=port.device,
                port=port.port,
                reason=str(exc),
            )
        self._extended[key] = (now, counters)
        return counters
