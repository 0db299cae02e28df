"""The desired state: which (node, taint key) alerts want tainted, and recent resolves.

An `Intent` is one (node, key) with the firing alert instances that want it and when one
was last seen firing (the untaint hold counts from then). `ResolvedMemory` remembers the
alert instances that resolved recently, so a late (retried) firing of one does not taint
again. The controller (`tainter.controller`) folds notifications into them and syncs
nodes to match.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime

from fleetwatch.tainter.payload import KEY_PREFIX


@dataclass
class Intent:
    """Why (node, key) should be tainted: the alerts that want it, and when last seen."""

    node: str
    key: str
    effect: str
    value: str
    firing: dict[str, datetime] = field(default_factory=dict)  # fingerprint → startsAt
    last_firing: float = 0.0  # time.time() when an alert was last seen firing
    refused: bool = False  # a TaintRefused Event was already sent for this episode

    @property
    def reason(self) -> str:
        return self.key.removeprefix(KEY_PREFIX)


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
