"""What an alert may ask for: the taint policy, safe by default.

A `NoExecute` taint evicts every pod on the node that does not tolerate it, so one rule
author (or anyone holding the webhook token) could kill a training job on thousands of
GPUs with one label. So: `NoSchedule` (the default) and `PreferNoSchedule` are allowed,
`NoExecute` only for reasons the operator lists; a reason must be one the shipped rules
config declares (the chart passes the list it rendered) unless undeclared reasons are
allowed; and a node carries at most `max_per_node` fleetwatch taints, which keeps the
node object (taints and the audit annotation) far below what the API server accepts.
`TaintPolicy`'s fields are the `--taint.*` flags. How each reason's taint is lifted also
comes from the rules package: its remediation contract (`shipped_contract`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from fleetwatch.flags import number_setting, setting
from fleetwatch.tainter.payload import AlertState, PayloadError, taint_key

if TYPE_CHECKING:
    from fleetwatch.rules.contract import Contract

NO_EXECUTE: Final = "NoExecute"


def shipped_reasons() -> frozenset[str]:
    """The taint reasons the installed rules config declares (`alerts.NAME.taint`)."""
    from fleetwatch.rules.config import load_config

    return frozenset(a.taint for a in load_config().alerts.values() if a.taint)


def shipped_contract() -> Contract:
    """The installed rules' remediation contract: each reason's clear condition, or why a
    person must lift it."""
    from fleetwatch.rules.contract import load_contract

    return load_contract()


def reason(text: str) -> str:
    """A taint reason as a flag type: a valid name for the key `fleetwatch.io/<reason>`."""
    try:
        taint_key(text)
    except PayloadError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def reasons(text: str) -> frozenset[str]:
    """A comma-separated list of reasons (empty allowed) as a flag type."""
    return frozenset(reason(r.strip()) for r in text.split(",") if r.strip())


def listed(found: frozenset[str]) -> str:
    """A set of reasons as `--help` shows a default."""
    return ",".join(sorted(found)) or "none"


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
            "why": self.why,
            "refused": self.detail,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TaintPolicy:
    """The operator's limits (`--taint.*`). `declared_reasons` None allows any valid reason;
    the command fills it with the rules config's reasons unless undeclared ones are allowed."""

    declared_reasons: frozenset[str] | None = setting(
        None,
        parse=reasons,
        metavar="REASON,...",
        help="the reasons alerts may ask for (default: those the installed rules config declares)",
    )
    allow_noexecute: frozenset[str] = setting(
        frozenset(),
        parse=reasons,
        metavar="REASON,...",
        shown=listed,
        help="reasons whose alerts may ask for NoExecute (it evicts running pods)",
    )
    allow_undeclared_reasons: bool = setting(False, help="accept any valid reason, declared or not")
    max_per_node: int = number_setting(
        8, minimum=1, maximum=100, integer=True, help="most fleetwatch taints on one node"
    )

    def check(self, alert: AlertState) -> Refusal | None:
        """Why `alert` may not taint at all, or None. (The per-node cap depends on the
        node and is applied when its change is planned.)"""
        declared = None if self.allow_undeclared_reasons else self.declared_reasons
        if declared is not None and alert.reason not in declared:
            return Refusal(
                alert=alert,
                why="undeclared_reason",
                detail=f"reason {alert.reason!r} is not declared in the rules config "
                f"(declared: {', '.join(sorted(declared)) or 'none'}; "
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
