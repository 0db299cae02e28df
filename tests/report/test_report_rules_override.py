"""The report judges by the operator's rules override (`--rules.config-file`): the
thresholds of its findings and the overheat policy its thermal query and drain rows name
follow the file, as the rules generated from it do (tests/rules/test_overrides.py); a bad
override stops the report, naming the file and the key."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from fleetwatch.cli import build_parser
from fleetwatch.report import cli as report_cli
from fleetwatch.report.actions import overheat_words
from fleetwatch.report.query_table import QUERIES
from fleetwatch.report.thresholds import judged_by, shipped_config, shipped_policy
from fleetwatch.rules.definitions import straggler_gate
from tests.rules.overrides import BAD_OVERRIDES, H100, write

TEMP_ABOVE = next(q for q in QUERIES if q.name == "temp_above_seconds")
BUSY = 0.55
"""A job's median tensor activity: training by the shipped job_busy_ratio (0.3), not by the
override's (0.6)."""


def _args(tmp_path: Path, override: Path) -> argparse.Namespace:
    return build_parser().parse_args(
        [
            "report",
            f"--rules.config-file={override}",
            "--prometheus-url=http://127.0.0.1:9",
            f"--out={tmp_path / 'report'}",
        ]
    )


def test_the_findings_follow_the_override(tmp_path: Path) -> None:
    override = write(tmp_path / "override.yaml")
    settings = report_cli.REPORT_FLAGS.read(_args(tmp_path, override))
    shipped = shipped_policy()
    with judged_by(override):
        policy = shipped_policy()
        window = report_cli._window(settings)
    straggled = [True] * 3
    assert (
        straggler_gate(shipped, job_recent_max_tensor=[BUSY] * 3, straggled=straggled) == [True] * 3
    )
    assert (
        straggler_gate(policy, job_recent_max_tensor=[BUSY] * 3, straggled=straggled) == [False] * 3
    )
    assert window.threshold_celsius == 83
    query = TEMP_ABOVE.build(window)
    assert "(83 - " in query
    assert f'name="{H100}"' in query
    assert "GB200" not in query
    assert f"{H100}: above 80 °C" in overheat_words(window)
    # Outside the block, the installed config again.
    assert shipped_policy() == shipped
    assert [p.model for p in shipped_config().overheat_policy] == ["NVIDIA B200", "NVIDIA GB200"]


def test_a_bad_override_stops_the_report_naming_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    override, message = BAD_OVERRIDES[2]
    path = write(tmp_path / "bad.yaml", override)
    with caplog.at_level(logging.ERROR):
        assert report_cli.run(_args(tmp_path, path)) == 1
    assert f"{path}: {message}" in caplog.text
    assert not (tmp_path / "report").exists()
