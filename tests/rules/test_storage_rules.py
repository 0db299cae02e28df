"""Checkpoint storage rules that the shipped config turns off: CheckpointBelowTarget fires on
the rules generated with a target (rules/tests/checkpoint-target/), as promtool runs them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fleetwatch.rules.config import load_config
from fleetwatch.rules.groups import alert_groups, dump_groups, recording_groups
from testbed.tool_servers import promtool
from tests.rules.promql import RULES_DIR

TARGET_TESTS = RULES_DIR / "tests" / "checkpoint-target"
TARGET_KEY = "thresholds.checkpoint.target_bytes_per_second"


def _with_target(name: str, default: str) -> str:
    """The shipped parameters, with a checkpoint target of 2e9 bytes per second."""
    return "2e9" if name == TARGET_KEY else default


def test_the_shipped_target_is_off() -> None:
    assert load_config().thresholds["checkpoint"]["target_bytes_per_second"] == 0


@pytest.mark.integration  # runs promtool
def test_below_target_fires_with_a_target(tmp_path: Path) -> None:
    config = load_config()
    groups = recording_groups(config, _with_target) + alert_groups(config, _with_target)
    (tmp_path / "rules.yaml").write_text(dump_groups(groups))
    test_file = tmp_path / "storage.test.yaml"
    shutil.copy(TARGET_TESTS / "storage.test.yaml", test_file)
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
