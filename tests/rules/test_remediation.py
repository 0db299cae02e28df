"""The remediation contract: every taint has its undo, declared beside its alert.

Each alert config.yaml makes taint declares, in rules/alerts/, a clear condition or that a
person must lift it, and how one scrape of the node's exporter judges it (local checks) or
why only Prometheus can; the shipped contract (rules/fleetwatch.remediation.yaml) covers
exactly the reasons the tainter accepts; a config that asks for a taint no remediation (or
no local judgement) backs is refused, naming the key.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from fleetwatch.rules import groups
from fleetwatch.rules.config import (
    AlertPolicy,
    Config,
    ConfigError,
    Params,
    keep_defaults,
    load_config,
)
from fleetwatch.rules.contract import (
    CLEAR,
    MANUAL,
    NODE_PLACEHOLDER,
    LocalCheck,
    NeedsPrometheus,
    Threshold,
    load_contract,
    parse_contract,
)
from fleetwatch.rules.groups import alert_groups, remediation_contract
from fleetwatch.rules.promql import Alert, Remediation
from fleetwatch.tainter.taint_policy import shipped_reasons

MANUAL_REASONS = {"xid-critical", "gpu-lost", "row-remap-failed", "lemon-node"}
"""What needs a person: a GPU reset, a reboot or a repair that no series shows done, or
the inspection of a lemon node, which passes every check."""


def test_every_tainting_alert_has_a_clear_condition_or_is_manual() -> None:
    config = load_config()
    contract = remediation_contract(config)
    tainting = {name: p.taint for name, p in config.alerts.items() if p.taint}
    assert tainting, "the shipped config taints"
    for name, reason in tainting.items():
        entry = contract[reason]
        assert name in entry["alerts"]
        assert (CLEAR in entry) != (MANUAL in entry), reason
    assert {r for r, e in contract.items() if MANUAL in e} == MANUAL_REASONS
    assert {r for r, e in contract.items() if CLEAR in e} == {
        "gpu-overheat",
        "gpu-fabric",
        "nvlink-down",
        "checkpoint-mount-hung",
        "checkpoint-mount-read-only",
    }


def test_the_tainters_reasons_are_the_shipped_contracts() -> None:
    contract = load_contract()
    assert contract.reasons == shipped_reasons()
    assert set(contract.manual) == MANUAL_REASONS
    assert contract.clear == {
        reason: entry[CLEAR]
        for reason, entry in remediation_contract(load_config()).items()
        if CLEAR in entry
    }


def test_clear_conditions_are_per_node_under_the_exporter_selector() -> None:
    config = load_config()
    for reason, query in load_contract().clear.items():
        assert NODE_PLACEHOLDER in query, reason
        # Every selector of the query carries the exporter's job and the node.
        selectors = re.findall(r"\b(\w+)\{([^}]*)\}", query)
        assert selectors, reason
        for metric, matchers in selectors:
            assert config.exporter_selector in matchers, (reason, metric)
            assert f'node="{NODE_PLACEHOLDER}"' in matchers, (reason, metric)
        assert f"[{config.thresholds['untaint_hold_down']}]" in query, reason


def test_the_clear_conditions_read_the_untaint_thresholds_of_the_config() -> None:
    config = load_config()
    thresholds = dict(config.thresholds)
    thresholds.update(untaint_gpu_temperature_celsius=70, untaint_hold_down="7m")
    contract = remediation_contract(dataclasses.replace(config, thresholds=thresholds))
    # The hysteresis is the threshold minus the untaint threshold, for every model.
    assert "> 78 - 70\n" in contract["gpu-overheat"][CLEAR]
    assert all("[7m]" in e[CLEAR] for e in contract.values() if CLEAR in e)


def _with_taint(alert: str, reason: str) -> Config:
    config = load_config()
    alerts = dict(config.alerts)
    alerts[alert] = dataclasses.replace(alerts[alert], taint=reason)
    return dataclasses.replace(config, alerts=alerts)


def test_a_taint_without_a_remediation_is_refused() -> None:
    config = _with_taint("GPUPowerBrake", "power-brake")
    with pytest.raises(ConfigError, match=r"alerts\.GPUPowerBrake\.taint: .*no remediation"):
        alert_groups(config)
    with pytest.raises(ConfigError, match=r"alerts\.GPUPowerBrake\.taint"):
        remediation_contract(config)


def test_a_taint_for_another_reason_than_the_remediations_is_refused() -> None:
    config = _with_taint("GPUOverheating", "hot")
    with pytest.raises(
        ConfigError,
        match=r"alerts\.GPUOverheating\.taint: 'hot' is not the reason .*'gpu-overheat'",
    ):
        remediation_contract(config)


def test_an_opted_in_alert_brings_its_clear_condition() -> None:
    contract = remediation_contract(_with_taint("InfiniBandPortDown", "infiniband-port-down"))
    assert "fleetwatch_infiniband_port_up" in contract["infiniband-port-down"][CLEAR]


def test_alerts_sharing_a_reason_clear_together() -> None:
    entry = remediation_contract(load_config())["gpu-fabric"]
    assert entry["alerts"] == ["GPUFabricDegraded", "GPUFabricNotRegistered"]
    assert "fleetwatch_gpu_fabric_degraded" in entry[CLEAR]
    assert "fleetwatch_gpu_fabric_state_id" in entry[CLEAR]


def test_a_remediation_is_clear_or_manual_not_both() -> None:
    with pytest.raises(ValueError, match="exactly one of clear, manual"):
        Remediation(reason="x")
    with pytest.raises(ValueError, match="exactly one of clear, manual"):
        Remediation(reason="x", clear="up", manual="why")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("- a\n", "expected a mapping of taint reasons"),
        ("r: {alerts: [A]}\n", "r: expected exactly one of clear, manual"),
        ("r: {clear: up, manual: why}\n", "r: expected exactly one of clear, manual"),
        ("r: {clear: up, when: now}\n", "r: expected alerts, clear or manual, local and repair"),
        ("r: {clear: ''}\n", "r: expected exactly one of clear, manual"),
        ("r: [", "not valid YAML"),
    ],
)
def test_a_bad_contract_names_the_reason_and_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"contract.yaml: {problem}")):
        parse_contract(text, source="contract.yaml")


# -- How one scrape judges each tainting alert (the Slurm health check's local checks) -------

NEEDS_PROMETHEUS = {
    "GPUXidCritical",
    "GPUFabricNotRegistered",
    "CheckpointMountReadOnly",
    "NodeInterruptsJobs",
}
"""What one scrape cannot judge: a counter's growth in a window, a state that is a fault only
when it lasts, a read-only mount that was writable (a history baseline), interruptions of
different jobs within a day."""


def test_every_tainting_alert_has_a_local_check_or_needs_prometheus() -> None:
    config = load_config()
    contract = load_contract()
    tainting = {name for name, p in config.alerts.items() if p.taint}
    assert set(contract.local) == tainting
    needs = {name for name, local in contract.local.items() if isinstance(local, NeedsPrometheus)}
    assert needs == NEEDS_PROMETHEUS
    for name in tainting - needs:
        checks = contract.local[name]
        assert isinstance(checks, tuple), name
        assert checks, name
        for check in checks:
            if isinstance(check.limit, Threshold):
                assert check.limit.name in config.thresholds, (name, check.limit)


def test_the_shipped_local_checks_are_the_ones_declared_beside_the_alerts() -> None:
    """The contract file reads back as the declarations it was written from."""
    config = load_config()
    p = Params(config=config, substitute=keep_defaults)
    declared = {
        alert.name: alert.remediation.local
        for _, builders in groups.ALERT_GROUPS
        for build in builders
        for alert in build(config, p)
        if alert.remediation is not None
    }
    shipped = load_contract().local
    assert shipped == {name: declared[name] for name in shipped}


def _plus_alert(monkeypatch: pytest.MonkeyPatch, remediation: Remediation) -> Config:
    """The shipped config and rule groups with one more alert, tainting for `remediation`."""

    def more(config: Config, p: Params) -> list[Alert]:
        return [
            Alert(
                name="TestAlert",
                expr="up == 0",
                summary="s",
                description="d",
                remediation=remediation,
            )
        ]

    monkeypatch.setattr(
        groups, "ALERT_GROUPS", (*groups.ALERT_GROUPS, ("fleetwatch-test", (more,)))
    )
    config = load_config()
    alerts = dict(config.alerts)
    alerts["TestAlert"] = AlertPolicy(severity="critical", for_="0s", taint=remediation.reason)
    return dataclasses.replace(config, alerts=alerts)


def test_a_tainting_alert_with_neither_local_check_nor_needs_prometheus_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _plus_alert(monkeypatch, Remediation(reason="test-reason", manual="why"))
    with pytest.raises(
        ConfigError,
        match=r"alerts\.TestAlert\.taint: TestAlert's remediation .* declares no local check",
    ):
        remediation_contract(config)


def test_a_local_check_on_a_threshold_the_config_lacks_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check = LocalCheck(family="up", op="==", limit=Threshold(name="no_such_threshold"))
    config = _plus_alert(
        monkeypatch,
        Remediation(reason="test-reason", manual="why", local=(check,), repair="none"),
    )
    with pytest.raises(ConfigError, match=r"thresholds\.no_such_threshold: .*TestAlert"):
        remediation_contract(config)


def test_a_local_check_is_a_comparison_and_needs_prometheus_says_why() -> None:
    with pytest.raises(ValueError, match="'=~' is not one of"):
        LocalCheck(family="up", op="=~", limit=0)
    with pytest.raises(ValueError, match="say why"):
        NeedsPrometheus(why="")


@pytest.mark.parametrize(
    ("local", "problem"),
    [
        ("{needs_prometheus: ''}", "A: needs_prometheus: expected a non-empty string"),
        ("[]", "A: expected a list of checks or needs_prometheus"),
        ("[{family: up, op: '=~', limit: 0}]", "A[0].op: expected one of"),
        ("[{family: up, op: '==', limit: {threshold: x, y: 1}}]", "A[0].limit: expected a"),
        ("[{family: up, op: '==', limit: 0, when: now}]", "A[0]: expected family, labels"),
        ("[{family: up, op: '==', limit: 0, labels: [a]}]", "A[0].labels: expected a mapping"),
    ],
)
def test_a_bad_local_check_names_the_alert_and_the_problem(local: str, problem: str) -> None:
    text = f"r: {{alerts: [A], manual: why, local: {{A: {local}}}}}\n"
    with pytest.raises(ConfigError, match=re.escape(f"contract.yaml: r.local.{problem}")):
        parse_contract(text, source="contract.yaml")


def test_local_checks_of_an_alert_the_reason_does_not_list_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"r\.local: expected a mapping of its alerts"):
        parse_contract(
            "r: {alerts: [A], manual: why, local: {B: {needs_prometheus: x}}}\n",
            source="contract.yaml",
        )
