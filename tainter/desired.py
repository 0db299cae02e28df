"""The desired state: which (node, taint key) alerts want tainted, and recent resolves.

An `Intent` is one (node, key) with the firing alert instances that want it and when one
was last seen firing (the untaint hold counts from then). `ResolvedMemory` remembers the
alert instances that resolved recently, so a late (retried) firing of one does not taint
again. `Intents` holds both, indexed by node, so a node's sync reads only that node's
intents; it folds alert states in (a notification, or Alertmanager's active alerts on
reconcile) and the controller (`tainter.controller`) syncs nodes to match.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from fleetwatch.rules.contract import NO_REPAIR, worst_repair
from fleetwatch.tainter.payload import KEY_PREFIX, AlertState

log = logging.getLogger(__name__)


@dataclass
class Intent:
    """Why (node, key) should be tainted: the alerts that want it, and when last seen."""

    node: str
    key: str
    effect: str
    value: str
    firing: dict[str, datetime] = field(default_factory=dict)  # fingerprint → startsAt
    repairs: dict[str, str] = field(default_factory=dict)  # fingerprint → repair asked
    last_firing: float = 0.0  # time.monotonic() when an alert was last seen firing
    refused: bool = False  # a TaintRefused Event was already sent for this episode

    @property
    def reason(self) -> str:
        return self.key.removeprefix(KEY_PREFIX)

    @property
    def repair(self) -> str:
        """The most disruptive repair its firing alerts ask for (none when none does)."""
        return worst_repair([self.repairs.get(fp, NO_REPAIR) for fp in self.firing])


class ResolvedMemory:
    """Alert instances (fingerprint, startsAt) resolved recently, bounded in time and size.

    Alertmanager retries a failed delivery, so a `firing` can arrive after the `resolved`
    of the same instance; without this it would taint a healthy node for good."""

    def __init__(self, *, seconds: float, size: int) -> None:
        self._seconds = seconds
        self._size = size
        self._until: OrderedDict[tuple[str, datetime], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._until)

    def remember(self, fingerprint: str, starts_at: datetime, *, now: float) -> None:
        """Note that this instance resolved; the oldest entries go first when full."""
        key = (fingerprint, starts_at)
        self._until.pop(key, None)
        self._until[key] = now + self._seconds
        while len(self._until) > self._size:
            self._until.popitem(last=False)

    def resolved(self, fingerprint: str, starts_at: datetime, *, now: float) -> bool:
        """True when this instance resolved within the memory time."""
        while self._until and next(iter(self._until.values())) <= now:
            self._until.popitem(last=False)
        return (fingerprint, starts_at) in self._until


class Intents:
    """Every `Intent`, by node then taint key, and the instances resolved recently.

    A node's entry goes when its last intent does, so alerts for ever new node names cannot
    grow memory beyond the intents themselves."""

    def __init__(self, *, resolved_seconds: float, resolved_size: int) -> None:
        self._by_node: dict[str, dict[str, Intent]] = {}
        self.resolved = ResolvedMemory(seconds=resolved_seconds, size=resolved_size)

    def __len__(self) -> int:
        return sum(len(keys) for keys in self._by_node.values())

    def all(self) -> list[Intent]:
        """Every intent, node by node."""
        return [intent for keys in self._by_node.values() for intent in keys.values()]

    def nodes(self) -> set[str]:
        """The nodes that have at least one intent."""
        return set(self._by_node)

    def on(self, node: str) -> Mapping[str, Intent]:
        """`node`'s intents by taint key (read-only; empty when it has none)."""
        return self._by_node.get(node, {})

    def add(self, intent: Intent) -> None:
        self._by_node.setdefault(intent.node, {})[intent.key] = intent

    def forget(self, node: str, key: str) -> None:
        keys = self._by_node.get(node)
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self._by_node[node]

    def consume(self, node: str, key: str, *, now: float) -> None:
        """The firing alerts of (node, key) were answered by a repair: treat them as resolved,
        so a late firing of the same instance does not take the repaired node out again (a
        new instance, once the node is back, does)."""
        intent = self.on(node).get(key)
        if intent is None:
            return
        for fingerprint, starts_at in intent.firing.items():
            self.resolved.remember(fingerprint, starts_at, now=now)
        intent.firing.clear()
        intent.repairs.clear()
        intent.last_firing = now

    def forget_node(self, node: str) -> None:
        self._by_node.pop(node, None)

    def record(self, alerts: Iterable[AlertState], *, now: float) -> set[str]:
        """Fold alert states (ones the taint policy allows) in; returns the nodes touched.

        A resolve is remembered, and a late firing of an instance that resolved is ignored;
        a resolve for a (node, key) never wanted changes nothing."""
        touched: set[str] = set()
        for alert in alerts:
            if not alert.firing:
                self.resolved.remember(alert.fingerprint, alert.starts_at, now=now)
            elif self.resolved.resolved(alert.fingerprint, alert.starts_at, now=now):
                log.info(
                    "late firing of an alert already resolved; ignored",
                    extra={"node": alert.node, "key": alert.key, "fingerprint": alert.fingerprint},
                )
                continue
            intent = self.on(alert.node).get(alert.key)
            if intent is None:
                if not alert.firing:
                    continue  # a resolve for something we never tainted for
                intent = Intent(
                    node=alert.node, key=alert.key, effect=alert.effect, value=alert.alertname
                )
                self.add(intent)
            touched.add(alert.node)
            if alert.firing:
                intent.firing[alert.fingerprint] = alert.starts_at
                intent.repairs[alert.fingerprint] = alert.repair
                intent.last_firing = now
            elif alert.fingerprint in intent.firing:
                del intent.firing[alert.fingerprint]
                intent.repairs.pop(alert.fingerprint, None)
                intent.last_firing = now
        return touched

    def resolve_missing(self, active: Iterable[AlertState], *, now: float) -> None:
        """Treat as resolved every firing instance not among Alertmanager's `active`
        alerts: its resolve was lost (the tainter was down, or it went to another
        replica)."""
        live = {(a.node, a.key, a.fingerprint) for a in active}
        for intent in self.all():
            for fingerprint, starts_at in list(intent.firing.items()):
                if (intent.node, intent.key, fingerprint) not in live:
                    log.info(
                        "alert no longer active in Alertmanager; treating as resolved",
                        extra={"node": intent.node, "key": intent.key, "fingerprint": fingerprint},
                    )
                    del intent.firing[fingerprint]
                    intent.repairs.pop(fingerprint, None)
                    self.resolved.remember(fingerprint, starts_at, now=now)
                    intent.last_firing = now
