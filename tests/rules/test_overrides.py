"""An operator's override file changes the policy without a fork: merged over the shipped
rules config, judged by the same schema, and read alike by the rules writer (`fleetwatch
rules generate`), the tainter (its clear conditions and reasons) and the Slurm health check.
A bad override is refused naming the file and the key. (The report: tests/report; the
chart's values, the same mapping: tests/deploy.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from fleetwatch.cli import build_parser, main
from fleetwatch.rules.config import ConfigError, load_config, merged
from fleetwatch.rules.override import RulesConfigFile
from fleetwatch.rules.write_rules import rendered_files
from fleetwatch.tainter.cli import settings_from_args
from tests.rules.overrides import BAD_OVERRIDES, H100, OVERRIDE, write


def _rules(files: dict[str, str]) -> dict[str, dict[str, object]]:
    return {
        rule["alert"]: rule
        for text in files.values()
        for group in yaml.safe_load(text)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def test_merge_replaces_lists_whole_and_null_removes_a_key() -> None:
    base = {"a": {"b": 1, "c": [1, 2], "d": "x"}, "e": 2}
    assert merged(base, {"a": {"c": [3], "d": None}}) == {"a": {"b": 1, "c": [3]}, "e": 2}
    assert base == {"a": {"b": 1, "c": [1, 2], "d": "x"}, "e": 2}


def test_an_override_never_reaches_the_next_load(tmp_path: Path) -> None:
    """The shipped config.yaml is parsed once a process; each load gets its own copy, so an
    override merged over it never reaches the next load."""
    overridden = load_config(override=write(tmp_path / "override.yaml"))
    assert overridden.thresholds["gpu_temperature_celsius"] == 83
    shipped = load_config()
    assert shipped.thresholds["gpu_temperature_celsius"] == 78
    assert shipped.alerts["GPUOverheating"].for_ != overridden.alerts["GPUOverheating"].for_
    assert [p.model for p in shipped.overheat_policy] == ["NVIDIA B200", "NVIDIA GB200"]


def test_the_override_changes_the_config_and_keeps_the_rest(tmp_path: Path) -> None:
    shipped = load_config()
    config = load_config(override=write(tmp_path / "override.yaml"))
    assert config.thresholds["gpu_temperature_celsius"] == 83
    assert config.thresholds["job_busy_ratio"] == 0.6
    assert [p.model for p in config.overheat_policy] == [H100, "NVIDIA B200"]
    assert config.overheat_limit(H100).celsius == 80
    assert config.overheat_limit("NVIDIA GB200").celsius == 83  # the list was replaced whole
    assert config.alerts["GPUOverheating"].for_ == "30s"
    assert config.alerts["GPUOverheating"].taint == shipped.alerts["GPUOverheating"].taint
    unchanged = {k: v for k, v in shipped.thresholds.items() if k not in OVERRIDE["thresholds"]}
    assert {k: config.thresholds[k] for k in unchanged} == unchanged


def test_rules_generate_writes_rules_that_follow_the_override(tmp_path: Path) -> None:
    override = write(tmp_path / "override.yaml")
    out = tmp_path / "rules"
    assert main(["rules", "generate", f"--rules.config-file={override}", f"--out={out}"]) == 0
    written = {path.name: path.read_text() for path in out.iterdir()}
    assert sorted(written) == [
        "fleetwatch.global.yaml",
        "fleetwatch.recording.yaml",
        "fleetwatch.rules.yaml",
    ]
    rules = _rules(written)
    hot = rules["GPUOverheating"]
    assert hot["for"] == "30s"
    expr = str(hot["expr"])
    assert "(83 - fleetwatch_gpu_temperature_celsius" in expr
    assert f'name=~"{H100}|NVIDIA B200"' in expr
    assert "(80 - fleetwatch_gpu_temperature_celsius" in expr
    assert 'fleetwatch_gpu_temperature_margin_celsius{job="fleetwatch"} - 8\n' in expr
    assert "GB200" not in expr
    assert f"{H100}: above 80 °C" in str(rules["GPUOverheatingFleetWide"]["annotations"])
    busy = "namespace_training_job:fleetwatch_gpu_tensor_active:median_max_over_time > "
    assert f"{busy}0.6" in str(rules["GPUStraggler"]["expr"])
    # Without an override: the shipped rule files, byte for byte.
    shipped = tmp_path / "shipped"
    assert main(["rules", "generate", f"--out={shipped}"]) == 0
    for path, text in rendered_files(load_config(), Path()).items():
        if path.parent == Path("rules") and path.name != "fleetwatch.remediation.yaml":
            assert (shipped / path.name).read_text() == text


def test_the_tainter_clears_and_declares_by_the_override(tmp_path: Path) -> None:
    override = write(tmp_path / "override.yaml")
    token = tmp_path / "token"
    token.write_text("secret\n")
    args = build_parser().parse_args(
        ["taint", f"--web.token-file={token}", f"--rules.config-file={override}"]
    )
    settings = settings_from_args(args)
    clear = settings.evidence_queries["gpu-overheat"]
    assert "[5m]" in clear
    assert "[2m]" not in clear
    assert "> 83 - 79\n" in clear
    assert "(80 - max_over_time(fleetwatch_gpu_temperature_celsius" in clear
    assert f'name="{H100}"' in clear
    assert settings.rules_config_file == override
    contract = RulesConfigFile(config_file=override)
    assert settings.evidence_queries == dict(contract.contract(contract.load()).clear)
    assert settings.policy.declared_reasons is not None
    assert "gpu-overheat" in settings.policy.declared_reasons


def test_an_override_can_stop_an_alert_from_tainting(tmp_path: Path) -> None:
    override = write(tmp_path / "o.yaml", {"alerts": {"NVLinkDown": {"taint": None}}})
    token = tmp_path / "token"
    token.write_text("secret\n")
    args = build_parser().parse_args(
        ["taint", f"--web.token-file={token}", f"--rules.config-file={override}"]
    )
    settings = settings_from_args(args)
    assert settings.policy.declared_reasons is not None
    assert "nvlink-down" not in settings.policy.declared_reasons
    assert "nvlink-down" not in settings.evidence_queries


@pytest.mark.parametrize(("override", "message"), BAD_OVERRIDES)
def test_a_bad_override_is_refused_naming_the_file_and_the_key(
    tmp_path: Path, override: dict[str, object], message: str
) -> None:
    path = write(tmp_path / "bad.yaml", override)
    with pytest.raises(ConfigError, match=re.escape(f"{path}: {message}")):
        load_config(override=path)


def test_each_command_refuses_a_bad_override_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    override, message = BAD_OVERRIDES[2]
    path = write(tmp_path / "bad.yaml", override)
    assert main(["rules", "generate", f"--rules.config-file={path}", f"--out={tmp_path}"]) == 1
    assert f"{path}: {message}" in capsys.readouterr().err
    token = tmp_path / "token"
    token.write_text("secret\n")
    args = build_parser().parse_args(
        ["taint", f"--web.token-file={token}", f"--rules.config-file={path}"]
    )
    with pytest.raises(SystemExit, match=re.escape(f"{path}: {message}")):
        settings_from_args(args)


def test_the_untaint_temperature_stays_below_the_threshold(tmp_path: Path) -> None:
    path = write(tmp_path / "o.yaml", {"thresholds": {"gpu_temperature_celsius": 74}})
    with pytest.raises(ConfigError, match="untaint_gpu_temperature_celsius: 75 is not below"):
        load_config(override=path)
