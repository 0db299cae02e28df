"""The repair each taken-out reason declares beside its alert, in the remediation contract.

Every alert that taints says what puts the node back (none, a GPU reset, a reboot, a
person's hardware inspection), from NVIDIA's Xid catalog where an Xid is the reason; the
Xid alert covers many Xids, so its repair is told by its `xid` label. The generator refuses
an unknown repair, a tainting alert without one, and alerts of one reason that disagree.
"""

from __future__ import annotations

import dataclasses

import pytest

from fleetwatch.catalog.nvidia_xids import shipped_catalog
from fleetwatch.rules import groups
from fleetwatch.rules.config import AlertPolicy, Config, ConfigError, load_config
from fleetwatch.rules.contract import (
    ACTION_REPAIRS,
    GPU_RESET,
    HARDWARE_INSPECTION,
    NO_REPAIR,
    REBOOT,
    REPAIR,
    RepairByLabel,
    load_contract,
    parse_contract,
    worst_repair,
)
from fleetwatch.rules.groups import remediation_contract
from fleetwatch.rules.promql import Alert, Remediation

SHIPPED_REPAIRS = {
    "GPUOverheating": NO_REPAIR,
    "GPUFallenOffBus": REBOOT,
    "GPURowRemapFailed": HARDWARE_INSPECTION,
    "GPUFabricDegraded": GPU_RESET,
    "GPUFabricNotRegistered": GPU_RESET,
    "NVLinkDown": GPU_RESET,
    "CheckpointMountHung": NO_REPAIR,
    "CheckpointMountReadOnly": NO_REPAIR,
    "NodeInterruptsJobs": HARDWARE_INSPECTION,
}
"""The repair of each shipped tainting alert but the Xid one (told by its label)."""


@pytest.mark.parametrize("alert", sorted(SHIPPED_REPAIRS))
def test_each_shipped_tainting_alert_declares_its_repair(alert: str) -> None:
    config = load_config()
    reason = config.alerts[alert].taint
    assert reason is not None, f"{alert} taints in the shipped config"
    contract = load_contract()
    assert contract.repair_of(reason, {"alertname": alert}) == SHIPPED_REPAIRS[alert]


def test_every_shipped_tainting_alert_is_covered() -> None:
    tainting = {name for name, policy in load_config().alerts.items() if policy.taint}
    assert tainting == set(SHIPPED_REPAIRS) | {"GPUXidCritical"}


def test_the_xid_alerts_repair_is_the_catalog_action_of_its_xid() -> None:
    catalog = shipped_catalog()
    contract = load_contract()
    critical = load_config().thresholds["xid_critical"]
    assert critical, "the shipped config lists critical Xids"
    for code in critical:
        entry = catalog.entry(code)
        assert entry is not None
        want = ACTION_REPAIRS[entry.action]
        assert contract.repair_of("xid-critical", {"xid": str(code)}) == want, code
    # What NVIDIA says, spelled out for three Xids: 48 (double-bit ECC) resets the GPU,
    # 151 reboots the node, 54 (the board's mechanicals) needs a person.
    assert contract.repair_of("xid-critical", {"xid": "48"}) == GPU_RESET
    assert contract.repair_of("xid-critical", {"xid": "151"}) == REBOOT
    assert contract.repair_of("xid-critical", {"xid": "54"}) == HARDWARE_INSPECTION
    # A code the map does not hold, or an alert without the label: a person decides.
    assert contract.repair_of("xid-critical", {"xid": "999"}) == HARDWARE_INSPECTION
    assert contract.repair_of("xid-critical", {}) == HARDWARE_INSPECTION


def test_an_override_list_of_xids_gets_the_repairs_of_those_codes() -> None:
    config = load_config()
    thresholds = {**config.thresholds, "xid_critical": [79, 48, 777]}
    entry = remediation_contract(dataclasses.replace(config, thresholds=thresholds))
    repair = entry["xid-critical"][REPAIR]
    assert repair == {
        "by_label": "xid",
        "map": {"48": GPU_RESET, "79": REBOOT, "777": HARDWARE_INSPECTION},
        "otherwise": HARDWARE_INSPECTION,
    }


def test_the_most_disruptive_repair_wins() -> None:
    assert worst_repair([GPU_RESET, REBOOT, NO_REPAIR]) == REBOOT
    assert worst_repair([HARDWARE_INSPECTION, REBOOT]) == HARDWARE_INSPECTION
    assert worst_repair([]) == NO_REPAIR


def _plus_alert(monkeypatch: pytest.MonkeyPatch, *remediations: Remediation) -> Config:
    """The shipped config with alerts TestAlert0.. that taint with these remediations."""
    alerts = [
        Alert(name=f"TestAlert{i}", expr="vector(1)", summary="s", description="d", remediation=r)
        for i, r in enumerate(remediations)
    ]
    monkeypatch.setattr(
        groups,
        "ALERT_GROUPS",
        (*groups.ALERT_GROUPS, ("fleetwatch-test", (lambda c, p: alerts,))),
    )
    config = load_config()
    policies = dict(config.alerts)
    for i, remediation in enumerate(remediations):
        policies[f"TestAlert{i}"] = AlertPolicy(
            severity="critical", for_="0s", taint=remediation.reason
        )
    return dataclasses.replace(
        config,
        alerts=policies,
        rule_groups={**config.rule_groups, "fleetwatch-test": "node"},
    )


def _manual(repair: str | RepairByLabel | None) -> Remediation:
    return Remediation(reason="test-reason", manual="why", local=(), repair=repair)


def test_an_unknown_repair_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _plus_alert(monkeypatch, _manual("replace-the-datacenter"))
    with pytest.raises(ConfigError, match=r"TestAlert0\.taint: .*unknown repair 'replace-the"):
        remediation_contract(config)
    with pytest.raises(ValueError, match="unknown repair 'pray'"):
        RepairByLabel(label="xid", repairs={"1": "pray"}, otherwise=NO_REPAIR)


def test_a_tainting_alert_without_a_repair_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _plus_alert(monkeypatch, _manual(None))
    with pytest.raises(ConfigError, match=r"TestAlert0\.taint: .*declares no repair"):
        remediation_contract(config)


def test_alerts_of_one_reason_must_agree_on_the_repair(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _plus_alert(monkeypatch, _manual(REBOOT), _manual(GPU_RESET))
    with pytest.raises(ConfigError, match="'test-reason': its alerts declare different repairs"):
        remediation_contract(config)


@pytest.mark.parametrize(
    ("repair", "problem"),
    [
        ("melt", "r.repair: unknown repair 'melt'"),
        ("{by_label: xid}", "r.repair: expected a repair or by_label, map and otherwise"),
        ("{by_label: xid, map: {'1': melt}, otherwise: none}", "r.repair.map.1: unknown repair"),
        ("{by_label: xid, map: [], otherwise: none}", "r.repair.map: expected a mapping"),
    ],
)
def test_a_bad_repair_in_the_contract_file_is_refused(repair: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace(".", r"\.").replace("(", r"\(")):
        parse_contract(f"r: {{manual: why, repair: {repair}}}\n", source="c.yaml")
