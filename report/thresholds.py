"""The report's thresholds, read from the installed rules config.

The alert rules, the dashboards and the report must agree on what a straggler, an idle
GPU in a job or a job slowdown is, so the report keeps no copies of those numbers nor of
the definitions: it reads the same `rules/config.yaml` the rules are generated from
(`shipped_config()`: with the operator's override file merged over it, when the report is
given `--rules.config-file`, so its findings follow the thresholds the rules were generated
with), turns its thresholds into one frozen `Policy`, and applies the rules' definitions
(`fleetwatch.rules.definitions`). Only the report's own statistics (the thermal-outlier
test) are defined here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fleetwatch.durations import parse_duration
from fleetwatch.rules.config import Config, load_config

# Thermal outliers (a report-only finding): robust z-score of a GPU's temperature excess
# over its peers at similar power, and the smallest excess worth a row.
OUTLIER_Z = 3.5
OUTLIER_MIN_EXCESS_CELSIUS = 3.0


@dataclass(frozen=True, kw_only=True)
class Policy:
    """What makes a finding, as the rules define it (names follow rules/config.yaml).

    Its training-job thresholds are the `JobThresholds` of `fleetwatch.rules.definitions`.
    """

    temperature_celsius: float
    tensor_idle_ratio: float
    job_busy_ratio: float
    idle_in_job_fraction: float
    straggler_clock_fraction: float
    straggler_clock_reasons: tuple[str, ...]
    clock_event_fraction: float
    job_slowdown_fraction: float
    job_slowdown_baseline_seconds: float

    @classmethod
    def from_config(cls, config: Config) -> Policy:
        """The findings' thresholds from a validated rules config."""
        t = config.thresholds
        return cls(
            temperature_celsius=float(t["gpu_temperature_celsius"]),
            tensor_idle_ratio=float(t["tensor_idle_ratio"]),
            job_busy_ratio=float(t["job_busy_ratio"]),
            idle_in_job_fraction=float(t["idle_in_job_fraction"]),
            straggler_clock_fraction=float(t["straggler_clock_fraction"]),
            straggler_clock_reasons=tuple(str(r) for r in t["straggler_clock_reasons"]),
            clock_event_fraction=float(t["clock_event_fraction"]),
            job_slowdown_fraction=float(t["job_slowdown_fraction"]),
            job_slowdown_baseline_seconds=parse_duration(str(t["job_slowdown_baseline"])),
        )


_OVERRIDE: ContextVar[Path | None] = ContextVar("rules_config_override", default=None)
"""The override file the report runs with (`judged_by`); None: the installed config."""


@contextmanager
def judged_by(override: Path | None) -> Iterator[Config]:
    """Within the block, `shipped_config()` and `shipped_policy()` are the installed rules
    config with `override` merged over it; yields that config. ConfigError, naming the file
    and the key, for an override the rules' schema refuses."""
    config = _config(override)
    token = _OVERRIDE.set(override)
    try:
        yield config
    finally:
        _OVERRIDE.reset(token)


@cache
def _config(override: Path | None) -> Config:
    return load_config(override=override)


def shipped_config() -> Config:
    """The rules config the report judges by: the installed one, with the override of
    `judged_by` merged over it (each read once per process)."""
    return _config(_OVERRIDE.get())


def shipped_policy() -> Policy:
    """The policy of the rules config the report judges by."""
    return _policy(_OVERRIDE.get())


@cache
def _policy(override: Path | None) -> Policy:
    return Policy.from_config(_config(override))
