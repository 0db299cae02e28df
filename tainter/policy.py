"""What an alert may ask for: the taint policy, safe by default.

A `NoExecute` taint evicts every pod on the node that does not tolerate it, so one rule
author (or anyone holding the webhook token) could kill a training job on thousands of
GPUs with one label. So: `NoSchedule` (the default) and `PreferNoSchedule` are allowed,
`NoExecute` only for reasons the operator lists; a reason must be one the shipped rules
config declares (the chart passes the list it rendered) unless undeclared reasons are
allowed; and a node carries at most `max_per_node` fleetwatch taints, which keeps the
node object (taints and the audit annotation) far below what the API server accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from fleetwatch.tainter.payload import AlertState

NO_EXECUTE: Final = "NoExecute"


def shipped_reasons() -> frozenset[str]:
    """The taint reasons the installed rules config declares (`alerts.NAME.taint`)."""
    from fleetwatch.rules.config import load_config

    return frozenset(a.taint for a in load_config().alerts.values() if a.taint)


@dataclass(frozen=True, slots=True)
class Refusal:
    """An alert the policy refused, and why (`why` is a metric label; `detail` for people)."""

    alert: AlertState
    why: str
    detail: str

    def to_json(self) -> dict[str, str]:
        """How the webhook answer names the refused alert."""
        return {
            "alertname": self.alert.alertname,
            "node": self.alert.node,
            "reason": self.alert.reason,
            "fingerprint": self.alert.fingerprint,
            "refused": self.detail,
        }


@dataclass(frozen=True, slots=True)
class TaintPolicy:
    """The operator's limits. `declared_reasons` None allows any valid reason."""

    declared_reasons: frozenset[str] | None
    allow_noexecute: frozenset[str] = frozenset()
    max_per_node: int = 8

    def check(self, alert: AlertState) -> Refusal | None:
        """Why `alert` may not taint at all, or None. (The per-node cap depends on the
        node and is applied when its change is planned.)"""
        if self.declared_reasons is not None and alert.reason not in self.declared_reasons:
            return Refusal(
                alert=alert,
                why="undeclared_reason",
                detail=f"reason {alert.reason!r} is not declared in the rules config "
                f"(declared: {', '.join(sorted(self.declared_reasons)) or 'none'}; "
                "--taint.allow-undeclared-reasons allows any)",
            )
        if alert.effect == NO_EXECUTE and alert.reason not in self.allow_noexecute:
            return Refusal(
                alert=alert,
                why="noexecute",
                detail=f"effect NoExecute evicts running pods and is not allowed for reason "
                f"{alert.reason!r} (--taint.allow-noexecute lists the reasons that may)",
            )
        return None

    def capped(self, alert: AlertState) -> Refusal:
        """The refusal of an alert whose node already carries `max_per_node` taints."""
        return Refusal(
            alert=alert,
            why="max_per_node",
            detail=f"node {alert.node} already carries {self.max_per_node} fleetwatch taints "
            "(--taint.max-per-node)",
        )
