"""One operator's rules config override, shared by the tests that show each reader follows
it (the rules writer and the chart in tests/rules and tests/deploy, the tainter, the
report): the per-model overheat policy, three thresholds and the untaint hold-down, and
an alert's timing. The same mapping is the override file's content and the chart's
values, as docs/configuration.md says."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import yaml

H100: Final = "NVIDIA H100 80GB HBM3"

OVERRIDE: Final[dict[str, Any]] = {
    "thresholds": {
        "gpu_temperature_celsius": 83,
        "overheat_policy": [
            {"model": H100, "celsius": 80},
            {"model": "NVIDIA B200", "margin_celsius": 8},
        ],
        "untaint_gpu_temperature_celsius": 79,
        "untaint_hold_down": "5m",
        "job_busy_ratio": 0.6,
    },
    "alerts": {"GPUOverheating": {"for": "30s"}},
}

BAD_OVERRIDES: Final[list[tuple[dict[str, Any], str]]] = [
    (
        {"thresholds": {"gpu_temprature_celsius": 80}},
        "thresholds.gpu_temprature_celsius: unknown key",
    ),
    ({"thresholds": {"event_window": 10}}, "thresholds.event_window: expected a duration"),
    ({"thresholds": {"job_busy_ratio": 1.5}}, "thresholds.job_busy_ratio: 1.5 is out of range"),
    (
        {"thresholds": {"nvlink_errors_per_second": {"replay": -1}}},
        "thresholds.nvlink_errors_per_second.replay: -1 is out of range",
    ),
    (
        {"thresholds": {"overheat_policy": [{"model": H100, "celsius": 80, "margin_celsius": 5}]}},
        "thresholds.overheat_policy[0]: expected exactly one of celsius and margin_celsius",
    ),
    (
        {"thresholds": {"overheat_policy": [{"model": H100, "celsius": 400}]}},
        "thresholds.overheat_policy[0].celsius: 400 is out of range",
    ),
    (
        {"alerts": {"GPUOverheating": {"for": "soon"}}},
        "alerts.GPUOverheating.for: invalid duration 'soon'",
    ),
    ({"thresholdz": {}}, "thresholdz: unknown key"),
]
"""Overrides the schema refuses, and what the refusal says (after the file's name)."""


def write(path: Path, override: dict[str, Any] = OVERRIDE) -> Path:
    """`override` as an override file at `path`."""
    path.write_text(yaml.safe_dump(override, sort_keys=False))
    return path
