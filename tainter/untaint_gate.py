"""Whether a taint may be lifted now: positive evidence, never the absence of an alert.

A taint whose alerts all resolved is removed only when its reason is not manual (the
remediation contract or the operator's settings say a person lifts it, or it has no untaint
evidence; unless its repair came back: `tainter.repair`), the hold time has passed since
an alert last fired for it, and Prometheus confirms that the condition is clear
(`tainter.sources`). Each deferral is counted by why; quarantine, which also keeps taints,
is `tainter.quarantine`. The hold is a duration of this process (`time.monotonic`, as is
every intent's `last_firing`): the wall clock stepping forward (NTP, a VM resumed) never
lifts a taint early.
"""

from __future__ import annotations

import logging
import time

from fleetwatch.tainter.desired import Intent
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.settings import ControllerSettings
from fleetwatch.tainter.sources import EvidenceSource

log = logging.getLogger(__name__)


class UntaintGate:
    """Decides, per intent whose alerts resolved, whether its taint may go."""

    def __init__(
        self, *, settings: ControllerSettings, evidence: EvidenceSource, metrics: TainterMetrics
    ) -> None:
        self._settings = settings
        self._evidence = evidence
        self._metrics = metrics

    def manual(self, reason: str) -> bool:
        """True when only a person lifts `reason`'s taint: a manual-untaint reason, or one
        without untaint evidence."""
        return reason in self._settings.manual_reasons or not self._evidence.has_query(reason)

    async def may_untaint(self, intent: Intent, *, repaired: bool = False) -> bool:
        """Positive evidence: not manual, hold time passed, Prometheus says clear. A manual
        reason whose repair came back since it was taken out (`repaired`: the reboot or GPU
        reset a person would have done) is lifted as a person would lift it."""
        if self.manual(intent.reason):
            if repaired:
                return True
            self._metrics.untaint_deferred.labels(why="manual").inc()
            return False
        if time.monotonic() - intent.last_firing < self._settings.hold_seconds:
            self._metrics.untaint_deferred.labels(why="hold").inc()
            return False
        result = await self._evidence.condition_clear(node=intent.node, reason=intent.reason)
        if not result.clear:
            self._metrics.untaint_deferred.labels(why="evidence").inc()
            log.info(
                "taint kept: no positive evidence",
                extra={"node": intent.node, "key": intent.key, "detail": result.detail},
            )
            return False
        return True
