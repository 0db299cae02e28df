"""The remediation contract, as its readers load it: how each taint reason is lifted, and how
one scrape of a node's exporter judges each alert that asks for it.

Each alert that may taint declares its remediation beside its expression in rules/alerts/
(`fleetwatch.rules.promql.Remediation`); the rules generator writes the contract of the
reasons config.yaml's alerts ask for to rules/fleetwatch.remediation.yaml, which ships in
this package. Per reason, either `clear`: a PromQL query for one node (`$node` in place of
its name) that returns a non-empty result only when positive evidence says the condition
is gone; or `manual`: why only a person may lift the taint. The tainter loads it at start
(`load_contract`) and writes no PromQL of its own.

Per alert (`local`), the same file says how the Slurm health check judges the alert when no
Prometheus answers: `LocalCheck`s over the samples of one scrape, with thresholds named in
rules/config.yaml and read when the check runs, or `NeedsPrometheus` with why one scrape
cannot tell (a rate, a history baseline, a state that is a fault only when it lasts). The
health check has no per-alert code of its own.

Per reason, `repair` says what puts the node back once it is out (`REPAIRS`: none, a GPU
reset, a node reboot, or a person's hardware inspection), from NVIDIA's Xid catalog where an
Xid is the reason. One alert may cover many Xids, so a repair may be by label
(`RepairByLabel`: the alert's `xid` label looked up in a map written from the catalog); the
tainter and the Slurm drain controller tell the repair from the firing alert's labels
(`Contract.repair_of`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from fleetwatch.catalog.nvidia_xids import XidCatalog
from fleetwatch.rules.config import PACKAGE, ConfigError, shipped_text

NODE_PLACEHOLDER: Final = "$node"
"""Where a clear condition names its node: the tainter puts the node's name in its place."""
CONTRACT_FILE: Final = "fleetwatch.remediation.yaml"
"""The contract's file name in this package (rules/ in a source checkout)."""
CLEAR: Final = "clear"
MANUAL: Final = "manual"
ALERTS: Final = "alerts"
LOCAL: Final = "local"
TAINT_LABEL: Final = "fleetwatch_taint"
"""The alert label that carries an alert's taint reason (its ALERTS series carry it too)."""
JOIN_ON: Final = "join_on"
"""The contract file's key for the labels a joined family is matched on (PromQL's `on`)."""
REPAIR: Final = "repair"
NO_REPAIR: Final = "none"
GPU_RESET: Final = "gpu-reset"
REBOOT: Final = "reboot"
HARDWARE_INSPECTION: Final = "hardware-inspection"
REPAIRS: Final = (NO_REPAIR, GPU_RESET, REBOOT, HARDWARE_INSPECTION)
"""What puts a taken-out node back, least to most disruptive: none (the job restarts
elsewhere, the node waits for its clear condition or a person), a GPU reset, a node reboot,
or a person inspecting the hardware."""
ACTION_REPAIRS: Final[Mapping[str, str]] = {
    "none": NO_REPAIR,
    "update_software": NO_REPAIR,
    "restart_application": NO_REPAIR,
    "reset_gpu": GPU_RESET,
    "reboot_node": REBOOT,
    "check_mechanicals": HARDWARE_INSPECTION,
    "contact_support": HARDWARE_INSPECTION,
}
"""NVIDIA's catalog actions (`fleetwatch.catalog.nvidia_xids.ACTIONS`) as repairs."""
OPERATORS: Final = ("<", "<=", "==", "!=", ">=", ">")
"""The comparisons a local check may make, written as in PromQL."""
# What a local check is about, as its `subject` names it from the sample's labels.
GPU_SUBJECT: Final = "GPU {gpu} ({uuid})"
LINK_SUBJECT: Final = "NVLink {link} of GPU {gpu} ({uuid})"
PORT_SUBJECT: Final = "InfiniBand port {device}/{port}"
MOUNT_SUBJECT: Final = "mount {mountpoint}"


@dataclass(frozen=True, kw_only=True)
class Threshold:
    """A number of rules/config.yaml's `thresholds:` by name (`checkpoint.x` for a table's
    entry), read from the config the check runs with, so it moves with the alert's."""

    name: str


@dataclass(frozen=True, kw_only=True)
class Series:
    """The value of another family of the same scrape: its sample whose labels `on` equal
    the checked sample's (its only sample when `on` is empty)."""

    family: str
    on: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class OverheatPolicy:
    """The temperature a GPU may reach under its model's overheat policy (config.yaml's
    `overheat_policy`, else `gpu_temperature_celsius`): the model is label `model_label` of
    family `info`, the margin to the slowdown limit (for a margin policy) family `margin`,
    each joined on labels `on`. A margin policy with no margin reading judges nothing."""

    info: str
    model_label: str
    margin: str
    on: tuple[str, ...]


def check_repair(repair: str, where: str) -> str:
    """`repair` when it is one of REPAIRS; ConfigError naming `where` otherwise."""
    if repair not in REPAIRS:
        raise ConfigError(
            f"{where}: unknown repair {repair!r} (expected one of {', '.join(REPAIRS)})"
        )
    return repair


def worst_repair(repairs: Collection[str]) -> str:
    """The most disruptive of `repairs` (a reboot also resets the GPUs); none when empty."""
    return max(repairs, key=REPAIRS.index, default=NO_REPAIR)


@dataclass(frozen=True, kw_only=True)
class RepairByLabel:
    """A repair told by one label of the firing alert: `repairs[value]`, else `otherwise`
    (a value the map does not hold, or no such label)."""

    label: str
    repairs: Mapping[str, str]
    otherwise: str

    def __post_init__(self) -> None:
        where = f"repair by label {self.label!r}"
        for value, repair in self.repairs.items():
            check_repair(repair, f"{where}: {value}")
        check_repair(self.otherwise, f"{where}: otherwise")

    def of(self, labels: Mapping[str, str]) -> str:
        """The repair an alert with these labels asks for."""
        return self.repairs.get(labels.get(self.label, ""), self.otherwise)


Repair = str | RepairByLabel
"""A reason's repair: one of REPAIRS, or told by a label of the alert."""


def catalog_repair(catalog: XidCatalog, code: int) -> str:
    """The repair NVIDIA's catalog action for Xid `code` asks for; hardware inspection for a
    code the catalog does not hold (a person decides)."""
    entry = catalog.entry(code)
    return HARDWARE_INSPECTION if entry is None else ACTION_REPAIRS[entry.action]


def xid_repairs(catalog: XidCatalog, codes: Collection[int], *, label: str) -> RepairByLabel:
    """Per Xid of `codes`, the repair its catalog action asks for, by the alert's `label`."""
    return RepairByLabel(
        label=label,
        repairs={str(code): catalog_repair(catalog, code) for code in sorted(codes)},
        otherwise=HARDWARE_INSPECTION,
    )


def repair_data(repair: Repair) -> Any:
    """`repair` as the contract file writes it (`parse_repair` reads it back)."""
    if isinstance(repair, RepairByLabel):
        return {
            "by_label": repair.label,
            "map": dict(repair.repairs),
            "otherwise": repair.otherwise,
        }
    return repair


def parse_repair(data: Any, where: str) -> Repair:
    """One reason's `repair` entry; ConfigError naming `where` and what is wrong."""
    if isinstance(data, str):
        return check_repair(data, where)
    if not isinstance(data, dict) or set(data) != {"by_label", "map", "otherwise"}:
        raise ConfigError(f"{where}: expected a repair or by_label, map and otherwise")
    mapping = data["map"]
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where}.map: expected a mapping of label values to repairs")
    repairs = {str(k): check_repair(v, f"{where}.map.{k}") for k, v in mapping.items()}
    return RepairByLabel(
        label=_text(data, "by_label", where),
        repairs=repairs,
        otherwise=check_repair(data["otherwise"], f"{where}.otherwise"),
    )


Limit = float | Threshold | Series | OverheatPolicy
"""What a local check compares a sample with."""


@dataclass(frozen=True, kw_only=True)
class LocalCheck:
    """One condition one scrape shows: each sample of `family` whose labels equal `labels`
    and whose value compares `op` true with `limit` is a finding. `subject` names what the
    sample is about, a template of its labels (`GPU {gpu} ({uuid})`); empty: the node."""

    family: str
    op: str
    limit: Limit
    labels: Mapping[str, str] = field(default_factory=dict)
    subject: str = ""

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise ValueError(f"local check of {self.family}: {self.op!r} is not one of {OPERATORS}")


@dataclass(frozen=True, kw_only=True)
class NeedsPrometheus:
    """An alert no single scrape can judge, and why: the health check leaves it to the
    Prometheus it asks."""

    why: str

    def __post_init__(self) -> None:
        if not self.why:
            raise ValueError("NeedsPrometheus: say why one scrape cannot judge the alert")


Local = tuple[LocalCheck, ...] | NeedsPrometheus
"""How one scrape judges an alert: any of its checks holding, or not at all."""


@dataclass(frozen=True, kw_only=True)
class Contract:
    """Each reason's clear condition, or why a person must lift it; every reason has one.
    `alerts` lists the alerts asking for each reason, `local` how one scrape judges each
    alert."""

    clear: Mapping[str, str]
    manual: Mapping[str, str]
    alerts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    local: Mapping[str, Local] = field(default_factory=dict)
    repairs: Mapping[str, Repair] = field(default_factory=dict)

    @property
    def reasons(self) -> frozenset[str]:
        """Every reason the contract covers."""
        return frozenset(self.clear) | frozenset(self.manual)

    def repair_of(self, reason: str, labels: Mapping[str, str]) -> str:
        """The repair an alert with `labels` asks for when it takes a node out for `reason`."""
        return repair_of(self.repairs, reason, labels)


def repair_of(repairs: Mapping[str, Repair], reason: str, labels: Mapping[str, str]) -> str:
    """The repair an alert with `labels` asks for when it takes a node out for `reason`
    (none for a reason `repairs` does not hold)."""
    repair = repairs.get(reason, NO_REPAIR)
    return repair.of(labels) if isinstance(repair, RepairByLabel) else repair


def threshold_value(thresholds: Mapping[str, Any], name: str) -> float:
    """The number `thresholds.<name>` of a config (`a.b`: entry b of table a); ConfigError
    naming the key when there is none or it is not a number."""
    value: Any = thresholds
    for part in name.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"thresholds.{name}: a local check needs it, and it is not a number")
    return float(value)


def _limit_data(limit: Limit) -> Any:
    if isinstance(limit, Threshold):
        return {"threshold": limit.name}
    if isinstance(limit, Series):
        return {"series": limit.family} | ({JOIN_ON: list(limit.on)} if limit.on else {})
    if isinstance(limit, OverheatPolicy):
        return {
            "overheat_policy": {
                "info": limit.info,
                "model_label": limit.model_label,
                "margin": limit.margin,
                JOIN_ON: list(limit.on),
            }
        }
    return limit


def local_data(local: Local) -> Any:
    """`local` as the contract file writes it (`parse_local` reads it back)."""
    if isinstance(local, NeedsPrometheus):
        return {"needs_prometheus": local.why}
    checks = []
    for check in local:
        entry: dict[str, Any] = {"family": check.family}
        if check.labels:
            entry["labels"] = dict(check.labels)
        entry |= {"op": check.op, "limit": _limit_data(check.limit)}
        if check.subject:
            entry["subject"] = check.subject
        checks.append(entry)
    return checks


def _names(data: Any, where: str) -> tuple[str, ...]:
    if not isinstance(data, list) or not all(isinstance(name, str) and name for name in data):
        raise ConfigError(f"{where}: expected a list of label names")
    return tuple(data)


def _text(data: Any, key: str, where: str) -> str:
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key}: expected a non-empty string")
    return value


def _parse_limit(data: Any, where: str) -> Limit:
    if isinstance(data, int | float) and not isinstance(data, bool):
        return float(data)
    if isinstance(data, dict) and set(data) == {"threshold"}:
        return Threshold(name=_text(data, "threshold", where))
    if isinstance(data, dict) and "series" in data and set(data) <= {"series", JOIN_ON}:
        on = _names(data.get(JOIN_ON, []), f"{where}.{JOIN_ON}")
        return Series(family=_text(data, "series", where), on=on)
    if isinstance(data, dict) and set(data) == {"overheat_policy"}:
        policy = data["overheat_policy"]
        inner = f"{where}.overheat_policy"
        if not isinstance(policy, dict) or set(policy) != {
            "info",
            "model_label",
            "margin",
            JOIN_ON,
        }:
            raise ConfigError(f"{inner}: expected info, model_label, margin and {JOIN_ON}")
        return OverheatPolicy(
            info=_text(policy, "info", inner),
            model_label=_text(policy, "model_label", inner),
            margin=_text(policy, "margin", inner),
            on=_names(policy[JOIN_ON], f"{inner}.{JOIN_ON}"),
        )
    raise ConfigError(f"{where}: expected a number, threshold, series or overheat_policy")


def parse_local(data: Any, where: str) -> Local:
    """One alert's `local` entry; ConfigError naming `where` and what is wrong."""
    if isinstance(data, dict) and set(data) == {"needs_prometheus"}:
        return NeedsPrometheus(why=_text(data, "needs_prometheus", where))
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{where}: expected a list of checks or needs_prometheus")
    checks = []
    for index, item in enumerate(data):
        at = f"{where}[{index}]"
        if not isinstance(item, dict) or set(item) - {"family", "labels", "op", "limit", "subject"}:
            raise ConfigError(f"{at}: expected family, labels, op, limit and subject")
        labels = item.get("labels", {})
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise ConfigError(f"{at}.labels: expected a mapping of label names to values")
        subject = item.get("subject", "")
        if not isinstance(subject, str):
            raise ConfigError(f"{at}.subject: expected a string")
        if item.get("op") not in OPERATORS:
            raise ConfigError(f"{at}.op: expected one of {', '.join(OPERATORS)}")
        checks.append(
            LocalCheck(
                family=_text(item, "family", at),
                op=item["op"],
                limit=_parse_limit(item.get("limit"), f"{at}.limit"),
                labels=labels,
                subject=subject,
            )
        )
    return tuple(checks)


def parse_contract(text: str, *, source: str) -> Contract:
    """The contract in `text`; ConfigError naming `source`, the reason and what is wrong."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of taint reasons")
    clear: dict[str, str] = {}
    manual: dict[str, str] = {}
    alerts: dict[str, tuple[str, ...]] = {}
    local: dict[str, Local] = {}
    repairs: dict[str, Repair] = {}
    for reason, entry in data.items():
        if not isinstance(entry, dict) or set(entry) - {ALERTS, CLEAR, MANUAL, LOCAL, REPAIR}:
            raise ConfigError(
                f"{source}: {reason}: expected alerts, clear or manual, local and repair"
            )
        if REPAIR in entry:
            repairs[str(reason)] = parse_repair(entry[REPAIR], f"{source}: {reason}.{REPAIR}")
        kinds = [kind for kind in (CLEAR, MANUAL) if kind in entry]
        if len(kinds) != 1 or not isinstance(entry[kinds[0]], str) or not entry[kinds[0]]:
            raise ConfigError(f"{source}: {reason}: expected exactly one of clear, manual")
        (clear if kinds[0] == CLEAR else manual)[str(reason)] = entry[kinds[0]]
        named = _names(entry.get(ALERTS, []), f"{source}: {reason}.{ALERTS}")
        alerts[str(reason)] = named
        checks = entry.get(LOCAL, {})
        if not isinstance(checks, dict) or set(checks) - set(named):
            raise ConfigError(f"{source}: {reason}.{LOCAL}: expected a mapping of its alerts")
        for alert, declared in checks.items():
            local[alert] = parse_local(declared, f"{source}: {reason}.{LOCAL}.{alert}")
    return Contract(clear=clear, manual=manual, alerts=alerts, local=local, repairs=repairs)


def load_contract(path: Path | None = None) -> Contract:
    """The contract this package ships (rules/fleetwatch.remediation.yaml), or the one
    generated at `path` (from a config of one's own); ConfigError naming what is wrong."""
    if path is None:
        return parse_contract(shipped_text(CONTRACT_FILE), source=f"{PACKAGE}/{CONTRACT_FILE}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    return parse_contract(text, source=str(path))
