"""Alertmanager webhook payloads (version 4) parsed into taint requests.

Validation is strict about what the tainter acts on and tolerant of everything else:
unknown keys are ignored (newer Alertmanagers add fields), alerts that do not ask for a
taint are skipped, and anything malformed raises `PayloadError` naming the field, so the
receiver answers 4xx and writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from fleetwatch.k8snames import TAINT_REASON_RULE, is_label_value, is_node_name, is_taint_reason

TAINT_LABEL: Final = "fleetwatch_taint"
EFFECT_LABEL: Final = "fleetwatch_taint_effect"
KEY_PREFIX: Final = "fleetwatch.io/"
EFFECTS: Final = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})
DEFAULT_EFFECT: Final = "NoSchedule"


class PayloadError(ValueError):
    """A webhook body that will never be acted on; the message names what is wrong."""


@dataclass(frozen=True, slots=True)
class AlertState:
    """One alert of a notification, reduced to what the tainter needs."""

    fingerprint: str
    firing: bool
    node: str
    reason: str
    effect: str
    alertname: str
    starts_at: datetime
    ends_at: datetime | None
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)
    repair: str = "none"
    """The repair its reason's remediation contract asks for, given its labels (the
    controller fills it in: `tainter.repair`)."""

    @property
    def key(self) -> str:
        """The taint key this alert asks for: `fleetwatch.io/<reason>`."""
        return KEY_PREFIX + self.reason


def taint_key(reason: str) -> str:
    """`gpu-overheat` → `fleetwatch.io/gpu-overheat`, after checking the reason is a valid key."""
    if not is_taint_reason(reason):
        raise PayloadError(
            f"label {TAINT_LABEL}={reason[:80]!r} is not a valid taint key name "
            f"({TAINT_REASON_RULE})"
        )
    return KEY_PREFIX + reason


def parse_time(value: Any, where: str) -> datetime | None:
    """RFC 3339 time, with its zone (Alertmanager writes every time in UTC); Go's zero time
    (`0001-01-01T00:00:00Z`) means "not set". PayloadError naming `where` otherwise."""
    if not isinstance(value, str):
        raise PayloadError(f"{where}: expected an RFC 3339 time string")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise PayloadError(f"{where}: {value[:80]!r} is not an RFC 3339 time") from exc
    if parsed.tzinfo is None:
        raise PayloadError(f"{where}: {value[:80]!r} has no time zone")
    return None if parsed.year <= 1 else parsed


def required_time(value: Any, where: str) -> datetime:
    """`parse_time` of a time that must be set (an alert's start)."""
    parsed = parse_time(value, where)
    if parsed is None:
        raise PayloadError(f"{where}: missing")
    return parsed


def string_map(value: Any, where: str) -> Mapping[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise PayloadError(f"{where}: expected an object of string values")
    return value


def alert_from_labels(
    *,
    labels: Mapping[str, str],
    fingerprint: object,
    firing: bool,
    starts_at: datetime,
    ends_at: datetime | None,
    where: str,
) -> AlertState | None:
    """The taint request an alert makes, or None when it asks for none (its fingerprint
    is not judged then: an alert the tainter does not act on is skipped whole)."""
    reason = labels.get(TAINT_LABEL)
    if reason is None or reason == "":
        return None
    taint_key(reason)
    node = labels.get("node", "")
    if not is_node_name(node):
        raise PayloadError(
            f"{where}: alert asks for taint {reason!r} but its label node={node[:80]!r} "
            "is missing or not a valid node name"
        )
    effect = labels.get(EFFECT_LABEL) or DEFAULT_EFFECT
    if effect not in EFFECTS:
        choices = ", ".join(sorted(EFFECTS))
        raise PayloadError(
            f"{where}: label {EFFECT_LABEL}={effect[:80]!r}: expected one of {choices}"
        )
    alertname = labels.get("alertname", "")
    if not alertname or not is_label_value(alertname):
        raise PayloadError(
            f"{where}: label alertname={alertname[:80]!r} is missing or cannot be a taint value"
        )
    if not isinstance(fingerprint, str) or not fingerprint:
        raise PayloadError(f"{where}.fingerprint: expected a non-empty string")
    return AlertState(
        fingerprint=fingerprint,
        firing=firing,
        node=node,
        reason=reason,
        effect=effect,
        alertname=alertname,
        starts_at=starts_at,
        ends_at=ends_at,
        labels=dict(labels),
    )


def parse_webhook(body: Any) -> list[AlertState]:
    """The taint requests in an Alertmanager v4 webhook body (already JSON-decoded).

    Raises PayloadError for a body that is not a version 4 notification or whose
    taint-requesting alerts are malformed; alerts without `fleetwatch_taint` are skipped.
    """
    if not isinstance(body, dict):
        raise PayloadError("body: expected a JSON object")
    if body.get("version") != "4":
        raise PayloadError(f'version: expected "4", got {str(body.get("version"))[:80]!r}')
    alerts = body.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts: expected a list")
    states: list[AlertState] = []
    for index, alert in enumerate(alerts):
        where = f"alerts[{index}]"
        if not isinstance(alert, dict):
            raise PayloadError(f"{where}: expected an object")
        status = alert.get("status")
        if status not in ("firing", "resolved"):
            raise PayloadError(
                f"{where}.status: expected firing or resolved, got {str(status)[:80]!r}"
            )
        labels = string_map(alert.get("labels"), f"{where}.labels")
        state = alert_from_labels(
            labels=labels,
            fingerprint=alert.get("fingerprint", ""),
            firing=status == "firing",
            starts_at=required_time(alert.get("startsAt"), f"{where}.startsAt"),
            ends_at=parse_time(alert.get("endsAt"), f"{where}.endsAt"),
            where=where,
        )
        if state is not None:
            states.append(state)
    return states
