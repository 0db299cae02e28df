"""The generated rules: no drift from config.yaml, promtool-clean, fully tested and documented,
and every parameter substitutable for the Helm chart."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import generate as generate_step
from fleetwatch.catalog.nvidia_xids import shipped_catalog
from fleetwatch.rules import write_rules as generate
from fleetwatch.rules.config import ConfigError, load_config, parameters
from fleetwatch.rules.definitions import kube_state_metrics_label
from fleetwatch.rules.groups import alert_groups, recording_groups, remediation_contract
from testbed.tool_servers import promtool
from tests.rules.promql import (
    ROOT,
    RULES_DIR,
    catalog_names,
    metric_names,
    recorded_names,
)

RULE_FILES = [
    RULES_DIR / "fleetwatch.rules.yaml",
    RULES_DIR / "fleetwatch.recording.yaml",
    RULES_DIR / "fleetwatch.global.yaml",
]
TEST_FILES = sorted((RULES_DIR / "tests").glob("*.test.yaml"))
SETTING_TEST_FILES = sorted((RULES_DIR / "tests").glob("*/*.test.yaml"))
"""Tests of alerts the shipped config turns off, each run on the rules generated with the
setting its directory names (tests/rules/test_storage_rules.py)."""


def committed_alerts() -> list[dict[str, Any]]:
    groups = [g for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_check_mode_reports_drift(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        (RULES_DIR / "config.yaml")
        .read_text()
        .replace("gpu_temperature_celsius: 78", "gpu_temperature_celsius: 80")
    )
    assert generate_step.main(["--config", str(config), "--check"]) == 1
    assert generate_step.main(["--check"]) == 0


@pytest.mark.integration  # runs promtool
def test_promtool_check_rules_is_clean() -> None:
    result = promtool("check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.integration  # runs promtool
@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda path: path.name)
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


def test_there_are_promtool_unit_tests() -> None:
    assert len(TEST_FILES) >= 4


def test_every_alert_has_severity_for_annotations_and_runbook() -> None:
    alerts = committed_alerts()
    assert len(alerts) >= 25
    for rule in alerts:
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert "for" in rule, name
        annotations = rule["annotations"]
        assert annotations["summary"].strip(), name
        assert annotations["description"].strip(), name
        runbook = RULES_DIR / "runbooks" / annotations["runbook_url"].rsplit("/", 1)[-1]
        assert runbook.is_file(), f"{name}: no runbook {runbook}"
        text = runbook.read_text()
        for section in ("## What it means", "## How to confirm", "## What to do", "untaint"):
            assert section in text, f"{runbook.name} lacks {section!r}"


def test_every_alert_has_firing_not_firing_and_absent_test_cases() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    absent: set[str] = set()
    for path in (*TEST_FILES, *SETTING_TEST_FILES):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                if case["name"].startswith("Absent series"):
                    absent.add(check["alertname"])
                (firing if check["exp_alerts"] else silent).add(check["alertname"])
    names = {rule["alert"] for rule in committed_alerts()}
    assert names - firing == set(), "alerts without a firing test case"
    assert names - silent == set(), "alerts without a not-firing test case"
    assert names - absent == set(), "alerts missing from the absent-series test case"


def test_taint_alerts_carry_the_contract_labels() -> None:
    taints = {r["alert"]: r["labels"].get("fleetwatch_taint") for r in committed_alerts()}
    assert taints["GPUOverheating"] == "gpu-overheat"
    assert taints["GPUXidCritical"] == "xid-critical"
    assert taints["GPUFallenOffBus"] == "gpu-lost"
    assert taints["GPURowRemapFailed"] == "row-remap-failed"
    assert taints["GPUFabricDegraded"] == "gpu-fabric"
    untainted = ("GPUOverheatingSoon", "GPUStraggler", "GPUIdleInJob", "TrainingJobSlowdown")
    assert {name: taints[name] for name in untainted} == dict.fromkeys(untainted)
    overheating = next(r for r in committed_alerts() if r["alert"] == "GPUOverheating")
    assert overheating["keep_firing_for"] == "2m"
    # The default policy's 78 °C, as the headroom every overheat rule compares with 0.
    assert "(78 - " in overheating["expr"]


def test_substitute_reaches_every_parameter() -> None:
    config = load_config()
    params = parameters(config)
    assert params["thresholds.gpu_temperature_celsius"] == "78"
    critical = shipped_catalog().critical()
    assert {48, 54, 156} <= set(critical)
    assert params["thresholds.xid_critical"] == "|".join(map(str, critical))
    assert params["alerts.GPUOverheating.for"] == "5s"

    def placeholder(name: str, default: str) -> str:
        assert params[name] == default
        return f"<<{name}>>"

    text = (
        yaml.safe_dump(alert_groups(config, placeholder))
        + yaml.safe_dump(recording_groups(config, placeholder))
        + yaml.safe_dump(remediation_contract(config, placeholder))
    )
    # The report's Goodput keys (thresholds.goodput, but for the live rules' live_*) are
    # read by the report's Goodput section, not by a rule (docs/goodput.md).
    report_only = [n for n in params if n.startswith("thresholds.goodput.") and ".live_" not in n]
    unused = [name for name in params if f"<<{name}>>" not in text and name not in report_only]
    # The untaint thresholds are read by the clear conditions of the remediation contract.
    assert unused == [], "parameters no rule uses"
    overheating = alert_groups(config, placeholder)[0]["rules"][0]
    assert "(<<thresholds.gpu_temperature_celsius>> - " in overheating["expr"]
    assert overheating["for"] == "<<alerts.GPUOverheating.for>>"
    assert "{{ $labels.node }}" in overheating["annotations"]["summary"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("severity: warning, for: 5s", "severity: urgent, for: 5s"),
            "alerts.GPUOverheating.severity",
        ),
        (
            ("GPUPowerBrake: {severity: warning, for: 30s}", "GPUPowerBrake: {severity: warning}"),
            "alerts.GPUPowerBrake.for: required key is missing",
        ),
        (
            ("GPUPowerBrake: {", "GPUPowerBrakes: {"),
            "alerts.GPUPowerBrake: required key is missing",
        ),
        (("scrape: 5s", "scrape: fast"), "intervals.scrape: invalid duration 'fast'"),
        (("tensor_idle_ratio: 0.05", "tensor_idle_ratio: true"), "thresholds.tensor_idle_ratio"),
        (("taint: gpu-overheat}", "taint: Gpu Overheat}"), "alerts.GPUOverheating.taint"),
        (
            ("- jobset.sigs.k8s.io/jobset-name", "- Not A Label!"),
            "training_jobs.job_label_keys[0]: 'Not A Label!' is not a pod label key",
        ),
        (
            ("job_label_keys:", "job_label_key:"),
            "training_jobs.job_label_keys: required key is missing",
        ),
        (
            ("tensor_active_metric: DCGM_FI_PROF", "tensor_active_metric: DCGM-FI-PROF"),
            "training_jobs.dcgm_tensor_active_metric: 'DCGM-FI-PROF",
        ),
        (
            ("kube_state_metrics: 'job=", "kube_state_metric: 'job="),
            "selectors.kube_state_metric: unknown key",
        ),
        (
            ('"NVIDIA B200", margin_celsius: 5', '"NVIDIA B200", margin_celsius: 5, celsius: 90'),
            "thresholds.overheat_policy[0]: expected exactly one of celsius and margin_celsius",
        ),
        (
            ('"NVIDIA GB200", margin_celsius: 5', '"NVIDIA B200", margin_celsius: 5'),
            "thresholds.overheat_policy[1].model: 'NVIDIA B200' is listed twice",
        ),
        (
            ('"NVIDIA B200", margin_celsius: 5', '"NVIDIA B200", margin_celsius: five'),
            "thresholds.overheat_policy[0].margin_celsius: expected a number, got 'five'",
        ),
        (
            ('model: "NVIDIA B200"', 'model: "NVIDIA B200|.*"'),
            "thresholds.overheat_policy[0].model: 'NVIDIA B200|.*': expected a GPU name",
        ),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    text = (RULES_DIR / "config.yaml").read_text()
    assert edit[0] in text
    path = tmp_path / "config.yaml"
    path.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        generate.rendered_files(load_config(path), ROOT)
    assert str(path) in str(info.value)
    assert generate_step.main(["--config", str(path), "--check"]) == 2


def test_every_metric_a_rule_reads_is_catalogued_or_recorded() -> None:
    known = catalog_names() | recorded_names()
    used: dict[str, set[str]] = {}
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                for name in metric_names(rule["expr"]):
                    used.setdefault(name, set()).add(rule.get("alert") or rule["record"])
    assert "fleetwatch_gpu_temperature_celsius" in used
    missing = {name: sorted(rules) for name, rules in used.items() if name not in known}
    assert missing == {}, "metrics not in docs/metrics.md nor recorded"


def test_job_label_keys_become_kube_state_metrics_label_names() -> None:
    config = load_config()
    assert [kube_state_metrics_label(k) for k in config.job_label_keys] == [
        "label_jobset_sigs_k8s_io_jobset_name",
        "label_training_kubeflow_org_job_name",
        "label_batch_kubernetes_io_job_name",
        "label_app_kubernetes_io_instance",
    ]
    assert 'label_jobset_sigs_k8s_io_jobset_name!=""' in RULE_FILES[2].read_text()
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in RULE_FILES[1].read_text()
