"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it.

Two or more tainter replicas run; only the one holding the Lease writes nodes. Every
`retry_period` each replica reads the Lease: the holder renews it (`renewTime`), the
others take it over only when the holder has not renewed for `leaseDurationSeconds` as
measured on their own clock since they last saw the record change (no clock skew between
replicas matters). Writes are guarded by resourceVersion, so two candidates racing for an
expired Lease cannot both win: the loser's replace answers 409.

A leader that cannot renew for `renew_deadline` (shorter than the lease duration) stops
being leader on its own clock, before any other replica can take over: `is_leader` reads
the time of the last successful renew, so even a wedged renew loop cannot leave two
writers. A killed leader is replaced within lease duration + retry period; a leader that
shuts down cleanly releases the Lease so a follower takes over at its next retry.

The leader also publishes where it takes webhooks (`--leader-elect.advertise-url`, the
annotation `fleetwatch.io/leader-url`, written in the same guarded replace as the holder, so
the two never disagree); each follower notes it at every read of the Lease, and hands the
notifications it receives to that URL while the holder's Lease is live.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Final

from fleetwatch.tainter.backend import (
    LeaseApi,
    NodeApi,
    RepairTicket,
    RepairView,
    repair_backend,
    view_of,
)
from fleetwatch.tainter.kube_objects import ApiError, Conflict, Lease, NodeView, Taint, now_micro
from fleetwatch.tainter.settings import ElectionSettings

log = logging.getLogger(__name__)

LEADER_URL_ANNOTATION: Final = "fleetwatch.io/leader-url"


def _advertising(annotations: Mapping[str, str], url: str | None) -> dict[str, str]:
    """`annotations` with the leader URL set to `url` (None: removed), others kept."""
    kept = {k: v for k, v in annotations.items() if k != LEADER_URL_ANNOTATION}
    if url is not None:
        kept[LEADER_URL_ANNOTATION] = url
    return kept


class Leadership:
    """Whether this process may write now. Without election it always may."""

    def __init__(
        self, *, renew_deadline: float | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._renew_deadline = renew_deadline
        self._clock = clock
        self._renewed_at: float | None = None
        self._leader_url: str | None = None
        self._leader_until = 0.0

    @property
    def elected(self) -> bool:
        """True when leadership comes from a Lease (false: a single replica, always leader)."""
        return self._renew_deadline is not None

    @property
    def is_leader(self) -> bool:
        """Leader now: never elected, or the Lease was renewed within the renew deadline."""
        if self._renew_deadline is None:
            return True
        return (
            self._renewed_at is not None and self._clock() - self._renewed_at < self._renew_deadline
        )

    def renewed(self, at: float) -> None:
        """The Lease was acquired or renewed; `at` is the clock reading before the call."""
        self._renewed_at = at

    def lost(self) -> None:
        """Stop being leader now."""
        self._renewed_at = None

    def saw_leader(self, url: str | None, *, until: float) -> None:
        """Another replica holds the Lease, advertises `url` (None: nothing), and is leader
        at least until `until` on this clock unless it renews. `saw_leader(None, until=0)`:
        no other replica leads."""
        self._leader_url, self._leader_until = url, until

    @property
    def leader_url(self) -> str | None:
        """Where the replica that leads now takes webhooks: None while this one leads, no
        other one leads (or its Lease ran out unrenewed), or it advertises no URL."""
        if self.is_leader or self._clock() >= self._leader_until:
            return None
        return self._leader_url


class LeaderElector:
    """One candidate. `step()` is one try to acquire or renew; a supervised loop calls it
    every retry period. `on_elected` runs (and must succeed) before this replica acts as
    leader; `on_change` learns every change of leadership (for metrics and wake-ups)."""

    def __init__(
        self,
        *,
        api: LeaseApi,
        settings: ElectionSettings,
        leadership: Leadership,
        on_elected: Callable[[], Awaitable[None]],
        on_change: Callable[[bool], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._settings = settings
        self._leadership = leadership
        self._on_elected = on_elected
        self._on_change = on_change
        self._clock = clock
        self._observed: tuple[str, str | None, int] | None = None  # holder, renewTime, dur
        self._observed_at = 0.0
        self._was_leader = False

    @property
    def retry_period(self) -> float:
        """Seconds between tries."""
        return self._settings.retry_period

    async def step(self) -> None:
        """Try to acquire or renew once; raises ApiError after noting what it means."""
        started = self._clock()
        leading = self._leadership.is_leader
        try:
            acquired = await asyncio.wait_for(
                self._try_acquire_or_renew(), timeout=self._settings.renew_deadline
            )
        except TimeoutError as exc:
            self._settle(acquired=False)
            raise ApiError(status=0, reason="Lease call timed out") from exc
        except ApiError:
            self._settle(acquired=False)
            raise
        if acquired and not leading:
            await self._on_elected()
        if acquired:
            self._leadership.renewed(started)
        self._settle(acquired=acquired)

    def _settle(self, *, acquired: bool) -> None:
        """Publish a change of leadership (renew deadline passed, or newly acquired)."""
        leader = self._leadership.is_leader
        if leader != self._was_leader:
            self._was_leader = leader
            log.warning(
                "became leader" if leader else "lost leadership",
                extra={
                    "identity": self._settings.identity,
                    "lease": f"{self._settings.namespace}/{self._settings.name}",
                    "acquired": acquired,
                },
            )
            self._on_change(leader)

    async def _try_acquire_or_renew(self) -> bool:
        settings = self._settings
        now = now_micro()
        try:
            current = await self._api.get_lease(namespace=settings.namespace, name=settings.name)
        except ApiError as exc:
            if exc.status != 404:
                raise
            return await self._create(now)
        record = (current.holder, current.renew_time, current.duration_seconds)
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()
        ours = current.holder == settings.identity
        expired = self._clock() - self._observed_at >= max(current.duration_seconds, 1)
        if current.holder and not ours and not expired:
            self._leadership.saw_leader(
                current.annotations.get(LEADER_URL_ANNOTATION),
                until=self._observed_at + max(current.duration_seconds, 1),
            )
            return False
        self._leadership.saw_leader(None, until=0.0)
        wanted = replace(
            current,
            annotations=_advertising(current.annotations, settings.advertise_url),
            holder=settings.identity,
            duration_seconds=round(settings.lease_duration),
            renew_time=now,
            acquire_time=current.acquire_time if ours else now,
            transitions=current.transitions if ours else current.transitions + 1,
        )
        try:
            written = await self._api.replace_lease(namespace=settings.namespace, lease=wanted)
        except Conflict:
            return False  # another candidate (or a breaker reset) wrote first: read again
        self._observed = (written.holder, written.renew_time, written.duration_seconds)
        self._observed_at = self._clock()
        return True

    async def _create(self, now: str) -> bool:
        lease = Lease(
            name=self._settings.name,
            resource_version="",
            holder=self._settings.identity,
            duration_seconds=round(self._settings.lease_duration),
            acquire_time=now,
            renew_time=now,
            transitions=0,
            annotations=_advertising({}, self._settings.advertise_url),
        )
        try:
            await self._api.create_lease(namespace=self._settings.namespace, lease=lease)
        except Conflict:
            return False
        return True

    async def release(self) -> None:
        """Give the Lease up on a clean shutdown so a follower takes over at once."""
        if not self._leadership.is_leader:
            return
        self._leadership.lost()
        self._settle(acquired=False)
        settings = self._settings
        try:
            current = await self._api.get_lease(namespace=settings.namespace, name=settings.name)
            if current.holder != settings.identity:
                return
            await self._api.replace_lease(
                namespace=settings.namespace,
                lease=replace(
                    current,
                    holder="",
                    duration_seconds=1,
                    renew_time=now_micro(),
                    annotations=_advertising(current.annotations, None),
                ),
            )
        except ApiError as exc:
            log.warning(
                "could not release the Lease; a follower takes over when it expires",
                extra={"error": str(exc)},
            )
        else:
            log.info("Lease released", extra={"identity": settings.identity})


class NotLeader(ApiError):
    """A write was attempted by a replica that is not the leader (answered as 503)."""

    def __init__(self) -> None:
        super().__init__(status=503, reason="not the leader: this replica does not write")


class LeaderOnlyNodeApi:
    """A NodeApi whose writes (node patches and Events) happen only while leader.

    Checked at the moment of each write, so a replica that loses the Lease in the middle
    of a notification stops writing at once; reads pass through."""

    def __init__(self, *, real: NodeApi, leadership: Leadership) -> None:
        self._real = real
        self._leadership = leadership

    async def get_node(self, name: str) -> NodeView:
        return await self._real.get_node(name)

    async def list_nodes(self, *, label_selector: str = "") -> list[NodeView]:
        return await self._real.list_nodes(label_selector=label_selector)

    async def patch_node(
        self,
        name: str,
        *,
        resource_version: str,
        taints: Sequence[Taint] | None,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> NodeView:
        if not self._leadership.is_leader:
            raise NotLeader
        return await self._real.patch_node(
            name,
            resource_version=resource_version,
            taints=taints,
            labels=labels,
            annotations=annotations,
        )

    async def create_event(
        self, *, node: NodeView, reason: str, message: str, warning: bool
    ) -> None:
        if not self._leadership.is_leader:
            raise NotLeader
        await self._real.create_event(node=node, reason=reason, message=message, warning=warning)

    @property
    def can_repair(self) -> bool:
        return repair_backend(self._real) is not None

    async def repair_view(
        self, name: str, *, repair: str, ticket: RepairTicket | None
    ) -> RepairView:
        return await view_of(self._real, name, repair=repair, ticket=ticket)

    async def start_repair(
        self, node: NodeView, *, repair: str, reason: str, alert: str
    ) -> RepairTicket:
        """The wrapped backend's repair, only while leader."""
        real = repair_backend(self._real)
        if not self._leadership.is_leader or real is None:
            raise NotLeader
        return await real.start_repair(node, repair=repair, reason=reason, alert=alert)
