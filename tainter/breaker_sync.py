"""The breaker as the cluster sees it: its record on the Lease, and its gauges.

Whether the breaker is open, which cap opened it and the take-outs within its window are
kept in the cluster (`tainter.breaker.BreakerStore`), so they survive a restart and a change
of leader, and `fleetwatch breaker reset` can close it from outside. `BreakerSync` keeps the
process's breaker and that record in agreement: it adopts a change made in the cluster and
stores one made here, and a failure to store never fails a webhook (the breaker loop
retries). `publish_gauges` shows the breaker's state in the tainter's metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fleetwatch.tainter.breaker import Breaker, BreakerRecord, BreakerStore
from fleetwatch.tainter.kube_objects import ApiError
from fleetwatch.tainter.metrics import TainterMetrics

log = logging.getLogger(__name__)


def publish_gauges(breaker: Breaker, metrics: TainterMetrics) -> None:
    """Set the breaker's gauges (tainted nodes, open, limit, share, take-outs) from it."""
    metrics.tainted_nodes.set(len(breaker.tainted))
    metrics.breaker_open.set(1 if breaker.open else 0)
    metrics.breaker_limit.set(breaker.limit())
    metrics.breaker_sharing.set(len(breaker.sharing))
    metrics.breaker_new_taints.set(len(breaker.taken_out()))


class BreakerSync:
    """Keeps `breaker` and its record in `store` in agreement (no store: nothing to do).

    `on_closed(by)` runs when a record closes a breaker that was open here."""

    def __init__(
        self,
        *,
        breaker: Breaker,
        store: BreakerStore | None,
        owner: str,
        metrics: TainterMetrics,
        on_closed: Callable[[str], None],
    ) -> None:
        self._breaker = breaker
        self._store = store
        self._owner = owner
        self._metrics = metrics
        self._on_closed = on_closed
        self._stored: BreakerRecord | None = None  # the record last read or written

    def forget(self) -> None:
        """Forget the record last seen, so the next `sync` adopts what is stored (a replica
        about to lead)."""
        self._stored = None

    async def sync(self, *, store: bool = True) -> None:
        """Make the breaker agree with the cluster: adopt a change made there (a reset by
        `fleetwatch breaker reset`, or the state a previous leader left: open or not, and
        its take-outs within the window), or store a change made here (it opened, took a
        node out, or auto-closed). A follower passes `store=False`: it only adopts, so its
        metrics show the cluster's state and it writes nothing. Raises ApiError."""
        if self._store is None:
            return
        _, record = await self._store.read()
        if record is not None and record != self._stored:
            self._stored = record
            was_open = self._breaker.open
            self._breaker.adopt(record)
            if record.open and not was_open:
                log.warning(
                    "circuit breaker open, as stored in the cluster",
                    extra={"since": record.opened_at, "cap": record.cap, "by": record.changed_by},
                )
            elif not record.open and was_open:
                self._on_closed(record.changed_by)
            publish_gauges(self._breaker, self._metrics)
            return
        if store and (record is None or not self._breaker.matches(record)):
            new = self._breaker.record(by=self._owner)
            await self._store.write(new)
            self._stored = new
            log.info(
                "circuit breaker state stored",
                extra={"open": new.open, "lease": self._store.where},
            )

    async def store_change(self) -> None:
        """Store the breaker's state now if it changed here; a failure is logged and
        left to the breaker loop, so it never fails a webhook."""
        stored = self._stored
        if self._store is None or (stored is not None and self._breaker.matches(stored)):
            return
        try:
            await self.sync()
        except ApiError as exc:
            log.warning(
                "cannot store the breaker state yet; the breaker loop retries",
                extra={"error": str(exc)},
            )
