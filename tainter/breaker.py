"""The circuit breaker: caps how many nodes fleetwatch may taint at once.

A fleet-wide incident (a bad rule, a cooling failure, a broken exporter release) must not
take most of the cluster out of scheduling. The cap is the smaller of an absolute count
and a fraction of the nodes matching a selector; the fraction always allows one node when
it is above 0, so a small cluster can still take its one overheating node out. A new node
taint that would exceed the cap is refused and opens the breaker; while open, every new
node taint is refused, removals go on, and only an explicit reset closes it (or, when
configured, the count falling below the cap). Decisions are made under one lock with
reservations, so a storm of concurrent requests taints exactly the cap and not one more.
Whether it is open is kept in the cluster (`BreakerStore`), so it survives a restart and
a change of leader.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from typing import Final

from fleetwatch.tainter.election import Leadership, NotLeader
from fleetwatch.tainter.kube import ApiError, Lease, LeaseApi, Malformed
from fleetwatch.tainter.settings import BreakerPolicy


class Breaker:
    """Tracks the nodes tainted by fleetwatch and decides whether one more may be."""

    def __init__(self, *, policy: BreakerPolicy) -> None:
        self._policy = policy
        self._lock = asyncio.Lock()
        self._tainted: set[str] = set()
        self._reserved: set[str] = set()
        self._selected_nodes: int | None = None
        self.open = False

    @property
    def tainted(self) -> frozenset[str]:
        """Nodes currently known to carry a fleetwatch taint."""
        return frozenset(self._tainted)

    @property
    def selected_nodes(self) -> int | None:
        """How many nodes match the selector, or None before the first node list."""
        return self._selected_nodes

    def limit(self) -> int:
        """The most nodes that may be tainted now (0 while the node count is unknown).

        The fraction of a cluster under 1/fraction nodes rounds down to 0, which would
        make the tainter useless there; one node is always allowed (0.1 of 5 nodes: 1).
        `--breaker.max-fraction=0` or `--breaker.max-nodes=0` still allow none.
        """
        if not self._selected_nodes:
            return 0
        by_fraction = math.floor(self._policy.max_fraction * self._selected_nodes)
        if self._policy.max_fraction > 0:
            by_fraction = max(1, by_fraction)
        return min(self._policy.max_nodes, by_fraction)

    def set_selected_nodes(self, count: int) -> None:
        """How many nodes match the selector (live, from the last node list)."""
        self._selected_nodes = count

    def observe(self, tainted: set[str]) -> None:
        """Replace the tainted set with live state read from the nodes."""
        self._tainted = set(tainted)
        self._maybe_auto_close()

    async def reserve(self, node: str) -> bool:
        """May `node` get its first fleetwatch taint? True reserves a slot; then call
        `commit` or `release`. A node already tainted by us is always allowed."""
        async with self._lock:
            if node in self._tainted or node in self._reserved:
                self._reserved.add(node)
                return True
            if self.open:
                return False
            if len(self._tainted | self._reserved) + 1 > self.limit():
                self.open = True
                return False
            self._reserved.add(node)
            return True

    def commit(self, node: str, *, tainted: bool) -> None:
        """Record the outcome of a write for a reserved (or any) node."""
        self._reserved.discard(node)
        if tainted:
            self._tainted.add(node)
        else:
            self._tainted.discard(node)
            self._maybe_auto_close()

    def release(self, node: str) -> None:
        """Give back a reservation whose write did not happen."""
        self._reserved.discard(node)

    def reset(self) -> None:
        """Close the breaker (an operator decided the taints so far are right)."""
        self.open = False

    def trip(self) -> None:
        """Open the breaker (it was open in the cluster when this process took over)."""
        self.open = True

    def _maybe_auto_close(self) -> None:
        if (
            self._policy.auto_close
            and self.open
            and len(self._tainted | self._reserved) < self.limit()
        ):
            self.open = False


BREAKER_ANNOTATION: Final = "fleetwatch.io/breaker"


@dataclass(frozen=True, slots=True)
class BreakerRecord:
    """The breaker's state as kept in the cluster: open or closed, since when, by whom."""

    open: bool
    changed_at: str
    changed_by: str

    def to_annotation(self) -> str:
        """The annotation value (JSON, keys sorted so equal states compare equal)."""
        return json.dumps(
            {"open": self.open, "changedAt": self.changed_at, "changedBy": self.changed_by},
            sort_keys=True,
        )

    @classmethod
    def from_annotation(cls, text: str) -> BreakerRecord:
        """Parse the annotation; ValueError naming what is wrong."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("open"), bool):
            raise ValueError(f"{BREAKER_ANNOTATION}: expected an object with a boolean 'open'")
        return cls(
            open=data["open"],
            changed_at=str(data.get("changedAt", "")),
            changed_by=str(data.get("changedBy", "")),
        )


class BreakerStore:
    """The breaker's state on the tainter's Lease (annotation `fleetwatch.io/breaker`).

    In the cluster, not in a process: a new leader inherits an open breaker, and
    `fleetwatch breaker reset` closes it with the caller's own credentials, so RBAC on
    the Lease decides who may. Writes are merge patches guarded by resourceVersion; with
    `leadership`, only while leader (a deposed leader never overwrites its successor)."""

    def __init__(
        self,
        *,
        api: LeaseApi,
        namespace: str,
        name: str,
        leadership: Leadership | None = None,
    ) -> None:
        self._api = api
        self._leadership = leadership
        self.namespace = namespace
        self.name = name

    @property
    def where(self) -> str:
        """`namespace/name` of the Lease, for messages."""
        return f"{self.namespace}/{self.name}"

    async def read(self) -> tuple[Lease | None, BreakerRecord | None]:
        """The Lease (None when missing) and the record on it (None when never written).

        Raises ApiError; a record that cannot be parsed raises Malformed."""
        try:
            lease = await self._api.get_lease(namespace=self.namespace, name=self.name)
        except ApiError as exc:
            if exc.status == 404:
                return None, None
            raise
        text = lease.annotations.get(BREAKER_ANNOTATION)
        if text is None:
            return lease, None
        try:
            return lease, BreakerRecord.from_annotation(text)
        except ValueError as exc:
            raise Malformed(f"{BREAKER_ANNOTATION} annotation on {self.where}: {exc}") from exc

    async def write(self, record: BreakerRecord) -> None:
        """Store `record`, creating the Lease (unheld) when it does not exist yet.

        Raises Conflict when the Lease changed since it was read: read again, and
        NotLeader when this replica lost the Lease."""
        if self._leadership is not None and not self._leadership.is_leader:
            raise NotLeader
        lease, _ = await self.read()
        annotations = {BREAKER_ANNOTATION: record.to_annotation()}
        if lease is None:
            await self._api.create_lease(
                namespace=self.namespace,
                lease=Lease(
                    name=self.name,
                    resource_version="",
                    holder="",
                    duration_seconds=0,
                    acquire_time=None,
                    renew_time=None,
                    transitions=0,
                    annotations=annotations,
                ),
            )
            return
        await self._api.patch_lease_annotations(
            namespace=self.namespace,
            name=self.name,
            resource_version=lease.resource_version,
            annotations=annotations,
        )
