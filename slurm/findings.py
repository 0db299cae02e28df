"""What the Slurm health check finds on its node, by the remediation contract the drain
controller acts on (`fleetwatch.rules.contract`).

Two readings, one policy: the tainting alerts firing for the node in Prometheus
(`from_alerts`), or, where no Prometheus answers, the conditions one scrape of the node's
exporter shows (`from_scrape`), judged by the local checks the contract declares beside each
alert, with the thresholds of the rules config the check runs with. No alert is named here:
an alert added to rules/alerts/ with a taint is judged by its own declaration.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.rules.config import Config, ConfigError
from fleetwatch.rules.contract import (
    TAINT_LABEL,
    Contract,
    Limit,
    LocalCheck,
    NeedsPrometheus,
    OverheatPolicy,
    Series,
    Threshold,
    threshold_value,
)

REASON_PREFIX: Final = "fleetwatch:"
"""Every fleetwatch drain reason starts with it: `fleetwatch:<reason> <alertname>`."""
ALERT_NAME: Final = "alertname"
_COMPARE: Final[Mapping[str, Callable[[float, float], bool]]] = {
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    ">": operator.gt,
}

Sample = tuple[dict[str, str], float]
Samples = Mapping[str, list[Sample]]


@dataclass(frozen=True)
class Finding:
    """A condition that holds: the alert it is, its taint reason, what was seen."""

    alert: str
    reason: str
    detail: str

    @property
    def drain_reason(self) -> str:
        """`fleetwatch:<reason> <alertname>`, as the drain controller writes it."""
        return f"{REASON_PREFIX}{self.reason} {self.alert}"


@dataclass(frozen=True)
class Judgement:
    """What a reading found, in the order a drain names them (the first names the drain),
    and what it could not judge (alert -> why)."""

    findings: list[Finding]
    not_judged: dict[str, str]


def parse_exposition(text: str) -> dict[str, list[Sample]]:
    """Samples of a Prometheus text exposition by metric name; ValueError when it is not one."""
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def _ordered(found: Iterable[Finding], contract: Contract) -> list[Finding]:
    """A reason only a person lifts names the drain before one that clears by itself; then
    the contract's order."""
    order = {reason: index for index, reason in enumerate(contract.alerts)}
    return sorted(
        found, key=lambda f: (f.reason not in contract.manual, order.get(f.reason, len(order)))
    )


def from_alerts(result: Iterable[Sample], contract: Contract) -> Judgement:
    """The firing alerts of Prometheus' answer to `ALERTS{alertstate="firing",
    fleetwatch_taint!="", node="..."}` (each series' labels and value) whose reason the
    contract declares; an alert asking for another reason is not judged (the drain
    controller refuses it too)."""
    found: list[Finding] = []
    not_judged: dict[str, str] = {}
    for labels, _ in result:
        alert, reason = labels.get(ALERT_NAME, "?"), labels.get(TAINT_LABEL, "")
        if reason not in contract.reasons:
            not_judged[alert] = f"its reason {reason!r} is not in the remediation contract"
            continue
        shown = ", ".join(
            f"{key}={value}"
            for key, value in sorted(labels.items())
            if key not in {"__name__", ALERT_NAME, "alertstate", TAINT_LABEL}
        )
        found.append(Finding(alert, reason, f"firing in Prometheus ({shown})"))
    unique = {(f.alert, f.detail): f for f in found}.values()
    return Judgement(_ordered(unique, contract), not_judged)


def from_scrape(samples: Samples, contract: Contract, config: Config) -> Judgement:
    """Every condition the contract's local checks find in one scrape, for the alerts
    `config` makes taint; the alerts that need Prometheus, or whose check cannot be read
    with `config`, are listed as not judged."""
    found: list[Finding] = []
    not_judged: dict[str, str] = {}
    for reason, alerts in contract.alerts.items():
        for alert in alerts:
            policy = config.alerts.get(alert)
            if policy is None or policy.taint is None:
                continue  # the config the check runs with takes no node out on it
            local = contract.local.get(alert)
            if local is None or isinstance(local, NeedsPrometheus):
                not_judged[alert] = local.why if local else "the contract declares no local check"
                continue
            try:
                found += [
                    Finding(alert, reason, detail)
                    for check in local
                    for detail in _check(check, samples, config)
                ]
            except ConfigError as exc:
                not_judged[alert] = f"{config.source}: {exc}"
    in_contract = {alert for alerts in contract.alerts.values() for alert in alerts}
    for alert, policy in config.alerts.items():
        if policy.taint is not None and alert not in in_contract:
            not_judged[alert] = (
                f"{config.source} makes it taint, and the contract has no entry for it: "
                "give --healthcheck.contract the contract generated from these rules"
            )
    return Judgement(_ordered(found, contract), not_judged)


def _matching(samples: Samples, family: str, labels: Mapping[str, str]) -> list[Sample]:
    return [
        (have, value)
        for have, value in samples.get(family, [])
        if all(have.get(key) == want for key, want in labels.items())
    ]


def _joined(
    samples: Samples, family: str, on: tuple[str, ...], labels: Mapping[str, str]
) -> Sample | None:
    """The sample of `family` whose labels `on` equal `labels`' (the first such)."""
    return next(iter(_matching(samples, family, {key: labels.get(key, "") for key in on})), None)


class _Labels(dict[str, str]):
    """A sample's labels for a subject template: a label the sample lacks reads `?`."""

    def __missing__(self, key: str) -> str:
        return "?"


def _subject(template: str, labels: Mapping[str, str]) -> str:
    if not template:
        return "the node"
    try:
        return template.format_map(_Labels(labels))
    except (ValueError, IndexError, AttributeError):  # a malformed template: show it as is
        return template


def _check(check: LocalCheck, samples: Samples, config: Config) -> list[str]:
    """What holds of `check` in `samples`, one line each; ConfigError when a threshold it
    names is not in `config`."""
    compare = _COMPARE[check.op]
    found = []
    for labels, value in _matching(samples, check.family, check.labels):
        limit = _limit(check.limit, labels, value, samples, config)
        if limit is None:
            continue  # nothing to compare with, as a PromQL comparison with no match
        number, words = limit
        if compare(value, number):
            found.append(
                f"{_subject(check.subject, labels)}: {check.family} {value:g} {check.op} {words}"
            )
    return found


def _limit(
    limit: Limit, labels: Mapping[str, str], value: float, samples: Samples, config: Config
) -> tuple[float, str] | None:
    """What a sample (`labels`, `value`) is compared with, and how a person reads it."""
    if isinstance(limit, Threshold):
        number = threshold_value(config.thresholds, limit.name)
        return number, f"{number:g} (thresholds.{limit.name})"
    if isinstance(limit, Series):
        other = _joined(samples, limit.family, limit.on, labels)
        return None if other is None else (other[1], f"{limit.family} {other[1]:g}")
    if isinstance(limit, OverheatPolicy):
        return _overheat_limit(limit, labels, value, samples, config)
    return limit, f"{limit:g}"


def _overheat_limit(
    limit: OverheatPolicy,
    labels: Mapping[str, str],
    celsius: float,
    samples: Samples,
    config: Config,
) -> tuple[float, str] | None:
    """The temperature the GPU may reach under its model's policy (its temperature plus the
    headroom the policy leaves it, `Config.overheat_headroom`)."""
    info = _joined(samples, limit.info, limit.on, labels)
    model = "" if info is None else info[0].get(limit.model_label, "")
    margin_sample = _joined(samples, limit.margin, limit.on, labels)
    margin = None if margin_sample is None else margin_sample[1]
    headroom = config.overheat_headroom(model, celsius, margin)
    if headroom is None:
        return None
    policy = config.overheat_limit(model)
    if not any(own.model == model for own in config.overheat_policy):
        words = "thresholds.gpu_temperature_celsius"
    elif policy.margin_celsius is not None:
        words = (
            f"{model}'s policy: {policy.margin_celsius:g} °C from its slowdown limit, "
            f"{margin:g} °C now"
        )
    else:
        words = f"{model}'s policy"
    return celsius + headroom, f"{celsius + headroom:g} ({words})"
