"""Repeat offenders stay out: each node's taint history, and quarantine.

The untaint evidence for gpu-overheat is "hottest GPU below 75 °C", which an idle tainted
node always meets: a node with a failing cold plate untaints after the hold, overheats under
the next job, is tainted again, and so on for ever, costing a job restart each time. "Cool
while idle" is not evidence that a cooling fault is fixed. So each node keeps, in the
cluster (annotation `fleetwatch.io/taint-history`, never only in memory: it survives a
restart and a change of leader), when it was tainted for each reason: the newest
`--quarantine.after` times within `--quarantine.window`, at most `MAX_REASONS` reasons, so it
stays small. The `after`-th taint for the same reason within the window quarantines that
reason on the node: its taint stays until a person runs `fleetwatch untaint` (or sets the
`fleetwatch.io/untaint` annotation), which also forgets that reason's history. A quarantined
node carries the label `fleetwatch.io/quarantined=<reason>` (the first in sorted order when
several are quarantined; the annotation lists them all) and gets a `NodeQuarantined` Event.
A history a person broke is logged, counted and read as empty; the label alone still keeps
its reason quarantined. Both keys are under `fleetwatch.io/`, which the chart's admission
policy lets the tainter change.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from fleetwatch.durations import format_duration
from fleetwatch.k8snames import is_taint_reason
from fleetwatch.tainter.kube_objects import NodeView, parse_rfc3339, rfc3339
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import KEY_PREFIX
from fleetwatch.tainter.settings import QuarantineSettings

log = logging.getLogger(__name__)

HISTORY_ANNOTATION: Final = "fleetwatch.io/taint-history"
QUARANTINE_LABEL: Final = "fleetwatch.io/quarantined"
MAX_REASONS: Final = 32
"""Most reasons one node's history keeps (those tainted most recently)."""


class EventSink(Protocol):
    """Records a Node Event (`tainter.events.SyncReport.event`)."""

    async def __call__(
        self, node: NodeView, reason: str, message: str, *, warning: bool = False
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class History:
    """When a node was tainted for each reason (Unix seconds, oldest first), and which of
    its reasons are quarantined."""

    taints: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    quarantined: frozenset[str] = frozenset()

    def to_annotation(self) -> str | None:
        """The annotation value (compact JSON, sorted), or None when there is nothing."""
        if not self.taints and not self.quarantined:
            return None
        return json.dumps(
            {
                "taints": {r: [rfc3339(t) for t in ts] for r, ts in sorted(self.taints.items())},
                "quarantined": sorted(self.quarantined),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_annotation(cls, text: str) -> History:
        """Parse the annotation; ValueError naming what is wrong."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        taints = data.get("taints", {})
        quarantined = data.get("quarantined", [])
        if not isinstance(taints, dict) or not isinstance(quarantined, list):
            raise ValueError("expected 'taints' (an object) and 'quarantined' (a list)")
        reasons = [*taints, *quarantined]
        if not all(isinstance(r, str) and is_taint_reason(r) for r in reasons):
            raise ValueError("a reason is not a valid taint reason")
        parsed = {}
        for reason, times in taints.items():
            if not isinstance(times, list):
                raise ValueError(f"'taints.{reason}' must be a list of times")
            parsed[reason] = tuple(sorted(parse_rfc3339(t) for t in times))
        return cls(taints=parsed, quarantined=frozenset(quarantined))


def quarantined_reasons(node: NodeView, history: History) -> frozenset[str]:
    """The node's quarantined reasons: those its history lists, and the label's."""
    label = node.labels.get(QUARANTINE_LABEL, "")
    return history.quarantined | ({label} if is_taint_reason(label) else set())


@dataclass(frozen=True, slots=True)
class Marks:
    """What one write changes of a node's history and quarantine (None deletes), and the
    reasons it quarantines."""

    labels: Mapping[str, str | None] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    quarantined: tuple[str, ...] = ()


def _marks(node: NodeView, history: History, *, quarantined: tuple[str, ...] = ()) -> Marks:
    """The label and annotation changes that make `node` carry `history`."""
    label = min(history.quarantined) if history.quarantined else None
    text = history.to_annotation()
    return Marks(
        labels={QUARANTINE_LABEL: label} if label != node.labels.get(QUARANTINE_LABEL) else {},
        annotations=(
            {HISTORY_ANNOTATION: text} if text != node.annotations.get(HISTORY_ANNOTATION) else {}
        ),
        quarantined=quarantined,
    )


def read_history(node: NodeView) -> History:
    """The node's history; raises ValueError when the annotation cannot be read."""
    text = node.annotations.get(HISTORY_ANNOTATION)
    return History() if text is None else History.from_annotation(text)


def release(node: NodeView, reasons: Collection[str] | None) -> Marks:
    """Forget the history and lift the quarantine of `reasons` (None: all) on `node`: what
    `fleetwatch untaint` writes with the taints it removes. An unreadable history is
    dropped with them."""
    try:
        history = read_history(node)
    except ValueError:
        history = History()
    quarantined = quarantined_reasons(node, history)
    drop = set(history.taints) | quarantined if reasons is None else set(reasons)
    kept = History(
        taints={r: ts for r, ts in history.taints.items() if r not in drop},
        quarantined=quarantined - drop,
    )
    return _marks(node, kept)


class Quarantine:
    """Keeps each node's taint history and quarantines repeat offenders; reports it."""

    def __init__(
        self,
        *,
        settings: QuarantineSettings,
        metrics: TainterMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._nodes: set[str] = set()  # tainted nodes that carry the quarantine label

    def history(self, node: NodeView) -> History:
        """The node's history; an unreadable one (a person edited it) is logged, counted
        and read as empty, never a failure of the sync."""
        try:
            return read_history(node)
        except ValueError as exc:
            self._metrics.malformed_annotations.labels(annotation=HISTORY_ANNOTATION).inc()
            log.warning(
                "taint history unreadable; read as empty",
                extra={"node": node.name, "annotation": HISTORY_ANNOTATION, "error": str(exc)},
            )
            return History()

    def plan(
        self,
        node: NodeView,
        history: History,
        *,
        added: Collection[str],
        released: Collection[str],
    ) -> Marks:
        """The history after this write adds taints for `added` and a person's request
        removes those of `released`; a reason added for the `after`-th time within the
        window is quarantined."""
        if not added and not released:
            return Marks()
        now = int(self._clock())
        since = now - self._settings.window
        after = self._settings.after
        taints = {r: tuple(t for t in ts if t > since) for r, ts in history.taints.items()}
        quarantined = set(quarantined_reasons(node, history)) - set(released)
        for reason in released:
            taints.pop(reason, None)
        newly = []
        for reason in sorted(added):
            taints[reason] = (*taints.get(reason, ()), now)[-after:]
            if len(taints[reason]) >= after and reason not in quarantined:
                quarantined.add(reason)
                newly.append(reason)
        recent = sorted((r for r in taints if taints[r]), key=lambda r: taints[r][-1])
        kept = History(
            taints={r: taints[r] for r in recent[-MAX_REASONS:]},
            quarantined=frozenset(quarantined),
        )
        return _marks(node, kept, quarantined=tuple(newly))

    def hold_for_inspection(self, node: NodeView, history: History, reason: str) -> Marks:
        """The marks that quarantine `reason` on `node` now (its repairs did not hold:
        `tainter.repair`), whatever its count of taints; the caller tells it."""
        if reason in quarantined_reasons(node, history):
            return Marks()
        kept = History(taints=history.taints, quarantined=history.quarantined | {reason})
        return _marks(node, kept)

    def holds(self, node: NodeView, history: History, reason: str) -> bool:
        """True while `reason`'s taint on `node` is quarantined (only a person lifts it)."""
        return reason in quarantined_reasons(node, history)

    async def report(self, node: NodeView, marks: Marks, *, event: EventSink) -> None:
        """Count and tell the quarantines this write made (`event` records a Node Event)."""
        for reason in marks.quarantined:
            self._metrics.quarantines.labels(reason=reason).inc()
            log.error(
                "node quarantined: its taint stays until `fleetwatch untaint`",
                extra={"node": node.name, "reason": reason, "after": self._settings.after},
            )
            await event(
                node,
                "NodeQuarantined",
                f"{KEY_PREFIX}{reason} tainted {self._settings.after} times within "
                f"{format_duration(self._settings.window)}: the taint stays until a person "
                f"runs `fleetwatch untaint {node.name} --reason={reason}`",
                warning=True,
            )
        self.note(node)

    def note(self, node: NodeView) -> None:
        """Count `node` as quarantined while it is tainted by us and carries the label."""
        tainted = any(t.key.startswith(KEY_PREFIX) for t in node.taints)
        if tainted and QUARANTINE_LABEL in node.labels:
            self._nodes.add(node.name)
        else:
            self._nodes.discard(node.name)
        self._metrics.quarantined_nodes.set(len(self._nodes))

    def observe(self, tainted: Iterable[NodeView]) -> None:
        """Replace the quarantined nodes with live state (the nodes fleetwatch tainted)."""
        self._nodes = set()
        for node in tainted:
            self.note(node)
        self._metrics.quarantined_nodes.set(len(self._nodes))
