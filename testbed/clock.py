"""A simulated node's clock that stands still, for golden files, unit tests and benches.

The simulation (`fleetwatch.sim.world`) takes any `Clock`; the exporter runs it on the wall
clock. Frozen at one instant, the same scenario gives byte-for-byte the same readings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FixedClock:
    """Simulated time stands still at `at` seconds after the node started."""

    at: float

    def elapsed(self) -> float:
        return self.at
