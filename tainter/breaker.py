"""The circuit breaker: caps how fast, and how much of the fleet, fleetwatch takes out.

A fleet-wide incident (a bad rule, a cooling failure, a broken exporter release) must not
take the cluster out of scheduling, and a normal week on a large fleet (dozens of nodes
waiting for a repair) must not stop fleetwatch from taking out the next overheating GPU.
So the breaker caps what it exists for, and nothing else:

- `new_taints`, the rate cap: at most `--breaker.max-new-taints` nodes taken out (given
  their first fleetwatch taint, whatever the reason) per sliding `--breaker.window`. An
  alert storm takes out that many nodes and no more.
- `share`, the share cap: at most `--breaker.max-fraction` of the selected (GPU) nodes out
  at once because of fleetwatch taints the tainter may lift itself. A node that waits for a
  person (it carries a manual-untaint reason such as gpu-lost, a reason without untaint
  evidence, or it is quarantined) does not count: it stays out whatever fleetwatch decides
  next, so counting it would only let the repair backlog jam the breaker, and it passed the
  rate cap when it was taken out. A take-out that makes the node wait for a person is
  therefore not checked against the share either; the fraction always allows one node
  when it is above 0, so a small cluster can still take its one overheating node out.

Adding a reason to a node already out is not taking it out: always allowed. A refused
take-out opens the breaker, naming the cap; while open every take-out is refused, removals
go on, and `fleetwatch breaker reset` (which also restarts the rate count) or, with
`--breaker.auto-close`, falling below both caps closes it. Decisions are made under one
lock with reservations, so a storm of concurrent requests takes out exactly the cap.
Whether it is open, which cap opened it and the take-outs within the window are kept in the
cluster (`BreakerStore`), so they survive a restart and a change of leader.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from fleetwatch.durations import format_duration
from fleetwatch.tainter.backend import LeaseApi
from fleetwatch.tainter.election import Leadership, NotLeader
from fleetwatch.tainter.kube_objects import (
    ApiError,
    Lease,
    Malformed,
    NodeView,
    parse_rfc3339,
    rfc3339,
)
from fleetwatch.tainter.payload import KEY_PREFIX, AlertState
from fleetwatch.tainter.quarantine import QUARANTINE_LABEL
from fleetwatch.tainter.settings import BreakerPolicy
from fleetwatch.tainter.taint_policy import Refusal
from fleetwatch.tainter.writes import our_taints

CAP_NEW_TAINTS: Final = "new_taints"
CAP_SHARE: Final = "share"
UNKNOWN_CAP: Final = "unknown"
"""The cap named by a refusal while a breaker opened by an older version is open."""


def counts_toward_share(
    *, reasons: Iterable[str], labels: Mapping[str, str | None], manual: Callable[[str], bool]
) -> bool:
    """Whether a node out with taints for `reasons` and these labels counts toward the
    share cap: not when it waits for a person (a reason that is `manual`, or quarantine)."""
    return labels.get(QUARANTINE_LABEL) is None and not any(manual(r) for r in reasons)


def node_out(node: NodeView, *, manual: Callable[[str], bool]) -> bool | None:
    """None when `node` carries no fleetwatch taint (it is not out), else whether it counts
    toward the share cap (`counts_toward_share`)."""
    reasons = [key.removeprefix(KEY_PREFIX) for key in our_taints(node)]
    if not reasons:
        return None
    return counts_toward_share(reasons=reasons, labels=node.labels, manual=manual)


@dataclass(frozen=True, slots=True)
class TakeOut:
    """A node taken out (given its first fleetwatch taint), and when (Unix seconds)."""

    at: int
    node: str


@dataclass(frozen=True, slots=True)
class BreakerRefusal:
    """A take-out the breaker refused: the cap that refused (a metric label) and, for
    people, what it counted and how to close it."""

    cap: str
    detail: str

    def of(self, alert: AlertState) -> Refusal:
        """The refusal of `alert`, as the webhook answer names it."""
        return Refusal(alert=alert, why=f"breaker_{self.cap}", detail=self.detail)


class Breaker:
    """Counts take-outs within the window and the nodes out, and decides whether one more
    node may be taken out."""

    def __init__(self, *, policy: BreakerPolicy, clock: Callable[[], float] = time.time) -> None:
        self._policy = policy
        self._clock = clock
        self._lock = asyncio.Lock()
        self._out: dict[str, bool] = {}  # node out → whether it counts toward the share
        self._reserved: dict[str, bool] = {}  # take-outs in flight → counts toward the share
        self._taken_out: list[TakeOut] = []  # within the window, oldest first
        self._selected_nodes: int | None = None
        self.open = False
        self.opened_by = ""  # the cap that opened it
        self.opened_at = ""

    @property
    def tainted(self) -> frozenset[str]:
        """Nodes currently known to carry a fleetwatch taint."""
        return frozenset(self._out)

    @property
    def sharing(self) -> frozenset[str]:
        """Nodes out that count toward the share cap (the tainter may lift their taints)."""
        return frozenset(node for node, counts in self._out.items() if counts)

    @property
    def selected_nodes(self) -> int | None:
        """How many nodes match the selector, or None before the first node list."""
        return self._selected_nodes

    def taken_out(self) -> tuple[TakeOut, ...]:
        """The take-outs within the window, oldest first (the newest `max_new_taints`:
        older ones leave the window first, so they never change a decision)."""
        since = self._clock() - self._policy.window
        kept = [t for t in self._taken_out if t.at > since]
        self._taken_out = kept[max(0, len(kept) - self._policy.max_new_taints) :]
        return tuple(self._taken_out)

    def limit(self) -> int:
        """The most nodes that may be out at once counting toward the share (0 while the
        node count is unknown).

        The fraction of a cluster under 1/fraction nodes rounds down to 0, which would
        make the tainter useless there; one node is always allowed (0.1 of 5 nodes: 1).
        `--breaker.max-fraction=0` still allows none.
        """
        if not self._selected_nodes:
            return 0
        by_fraction = math.floor(self._policy.max_fraction * self._selected_nodes)
        if self._policy.max_fraction > 0:
            by_fraction = max(1, by_fraction)
        return by_fraction

    def set_selected_nodes(self, count: int) -> None:
        """How many nodes match the selector (live, from the last node list)."""
        self._selected_nodes = count

    def observe(self, out: Mapping[str, bool]) -> None:
        """Replace the nodes out with live state read from the nodes: node → whether it
        counts toward the share (`node_out`)."""
        self._out = dict(out)
        self._maybe_auto_close()

    async def reserve(self, node: str, *, shares: bool) -> BreakerRefusal | None:
        """May `node`, which carries no fleetwatch taint, be taken out? None reserves a
        slot (then call `commit` or `release`); else the refusal, and the breaker opens.
        `shares`: whether the node, once out, counts toward the share cap."""
        async with self._lock:
            if self.open:
                return self._refusal(self.opened_by or UNKNOWN_CAP)
            if len(self.taken_out()) + len(self._reserved) + 1 > self._policy.max_new_taints:
                return self._trip_now(CAP_NEW_TAINTS)
            if shares and self._sharing_with(node) + 1 > self.limit():
                return self._trip_now(CAP_SHARE)
            self._reserved[node] = shares
            return None

    def may_repair(self, in_flight: Collection[str]) -> str | None:
        """Why one more repair may not start now (None: it may), given the nodes whose
        repair is in flight: not while the breaker is open, and repairs in flight count
        toward the share cap with the nodes out that count toward it."""
        if self.open:
            return f"circuit breaker open by the {self.opened_by or UNKNOWN_CAP} cap"
        busy = self.sharing | frozenset(in_flight)
        if len(busy) + 1 > max(1, self.limit()):
            return (
                f"share cap: {len(busy)} node(s) out or in repair of "
                f"{self._selected_nodes or 0} (--breaker.max-fraction="
                f"{self._policy.max_fraction:g})"
            )
        return None

    def commit(self, node: str, *, out: bool | None) -> None:
        """Record the outcome of a write: `out` as `node_out` says of the node as written.
        A reserved node that is now out counts as taken out now."""
        reserved = self._reserved.pop(node, None) is not None
        if out is None:
            self._out.pop(node, None)
        else:
            self._out[node] = out
            if reserved:
                self._taken_out.append(TakeOut(at=int(self._clock()), node=node))
        self._maybe_auto_close()

    def release(self, node: str) -> None:
        """Give back a reservation whose write did not happen."""
        self._reserved.pop(node, None)

    def reset(self) -> None:
        """Close the breaker and restart the rate count (an operator decided the
        take-outs so far are right)."""
        self.open = False
        self.opened_by = self.opened_at = ""
        self._taken_out = []

    def explain(self, cap: str) -> str:
        """What `cap` counts now and how to close it, for a refusal."""
        if cap == CAP_NEW_TAINTS:
            window = format_duration(self._policy.window)
            text = (
                f"rate cap: {len(self.taken_out()) + len(self._reserved)} node(s) taken out "
                f"within the last "
                f"{window} (--breaker.max-new-taints={self._policy.max_new_taints} per "
                f"--breaker.window={window}); `fleetwatch breaker reset` closes the breaker "
                "and restarts the count"
            )
            if self._policy.auto_close:
                text += ", or it closes by itself once the oldest take-out leaves the window"
            return text
        if cap == CAP_SHARE:
            return (
                f"share cap: {self._sharing_with('')} of {self._selected_nodes or 0} "
                "selected nodes are out because of fleetwatch taints the tainter may lift itself "
                f"(--breaker.max-fraction={self._policy.max_fraction:g} allows {self.limit()}; "
                "nodes waiting for a person do not count); untaint recovered nodes or raise "
                "--breaker.max-fraction, then `fleetwatch breaker reset` closes the breaker"
                + (" (or it closes by itself below the cap)" if self._policy.auto_close else "")
            )
        return "circuit breaker open; `fleetwatch breaker reset` closes it"

    # -- in the cluster ------------------------------------------------------------------

    def record(self, *, by: str) -> BreakerRecord:
        """The breaker's state as it is stored in the cluster."""
        return BreakerRecord(
            open=self.open,
            changed_at=rfc3339(self._clock()),
            changed_by=by,
            cap=self.opened_by,
            opened_at=self.opened_at,
            taken_out=self.taken_out(),
        )

    def matches(self, record: BreakerRecord) -> bool:
        """True when `record` stores the breaker's state as it is now."""
        return (record.open, record.cap, record.taken_out) == (
            self.open,
            self.opened_by,
            self.taken_out(),
        )

    def adopt(self, record: BreakerRecord) -> None:
        """Take the state stored in the cluster (a reset, or what a previous leader left)."""
        self.open = record.open
        self.opened_by = record.cap if record.open else ""
        self.opened_at = record.opened_at if record.open else ""
        self._taken_out = sorted(record.taken_out, key=lambda t: t.at)
        self.taken_out()

    # -- inside ---------------------------------------------------------------------------

    def _sharing_with(self, node: str) -> int:
        counted = {n for n, counts in self._out.items() if counts}
        counted |= {n for n, counts in self._reserved.items() if counts}
        counted.discard(node)
        return len(counted)

    def _trip_now(self, cap: str) -> BreakerRefusal:
        self.open = True
        self.opened_by = cap
        self.opened_at = rfc3339(self._clock())
        return self._refusal(cap)

    def _refusal(self, cap: str) -> BreakerRefusal:
        since = f" since {self.opened_at}" if self.opened_at else ""
        return BreakerRefusal(
            cap=cap, detail=f"circuit breaker open{since} by the {self.explain(cap)}"
        )

    def _maybe_auto_close(self) -> None:
        if (
            self._policy.auto_close
            and self.open
            and len(self.taken_out()) + len(self._reserved) < self._policy.max_new_taints
            and self._sharing_with("") < self.limit()
        ):
            self.open = False
            self.opened_by = self.opened_at = ""


BREAKER_ANNOTATION: Final = "fleetwatch.io/breaker"


@dataclass(frozen=True, slots=True)
class BreakerRecord:
    """The breaker's state as kept in the cluster: open or closed, by which cap and since
    when, the take-outs within the window, and who wrote it when."""

    open: bool
    changed_at: str
    changed_by: str
    cap: str = ""
    opened_at: str = ""
    taken_out: tuple[TakeOut, ...] = ()

    def to_annotation(self) -> str:
        """The annotation value (JSON, keys sorted so equal states compare equal)."""
        return json.dumps(
            {
                "open": self.open,
                "changedAt": self.changed_at,
                "changedBy": self.changed_by,
                "cap": self.cap,
                "openedAt": self.opened_at,
                "takenOut": [{"node": t.node, "at": rfc3339(t.at)} for t in self.taken_out],
            },
            sort_keys=True,
        )

    @classmethod
    def from_annotation(cls, text: str) -> BreakerRecord:
        """Parse the annotation (a record without the newer keys is a plain open/closed
        one); ValueError naming what is wrong."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("open"), bool):
            raise ValueError(f"{BREAKER_ANNOTATION}: expected an object with a boolean 'open'")
        return cls(
            open=data["open"],
            changed_at=str(data.get("changedAt", "")),
            changed_by=str(data.get("changedBy", "")),
            cap=str(data.get("cap", "")),
            opened_at=str(data.get("openedAt", "")),
            taken_out=_take_outs(data.get("takenOut", [])),
        )


def _take_outs(value: Any) -> tuple[TakeOut, ...]:
    if not isinstance(value, list):
        raise ValueError(f"{BREAKER_ANNOTATION}: 'takenOut' must be a list")
    found = []
    for item in value:
        if not (
            isinstance(item, dict)
            and isinstance(item.get("node"), str)
            and isinstance(item.get("at"), str)
        ):
            raise ValueError(
                f"{BREAKER_ANNOTATION}: each 'takenOut' entry needs a string 'node' and 'at'"
            )
        found.append(TakeOut(at=parse_rfc3339(item["at"]), node=item["node"]))
    return tuple(found)


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
