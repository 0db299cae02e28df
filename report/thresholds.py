"""The report's thresholds, read from the installed rules config.

The alert rules, the dashboards and the report must agree on what a straggler, an idle
GPU in a job or a job slowdown is, so the report keeps no copies of those numbers nor of
the definitions: it reads the same `rules/config.yaml` the rules are generated from
(`shipped_config()`), turns its thresholds into one frozen `Policy`, and applies the
rules' definitions (`fleetwatch.rules.definitions`). Only the report's own statistics
(the thermal-outlier test) are defined here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

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


@cache
def shipped_config() -> Config:
    """The installed rules config (read once per process)."""
    return load_config()


@cache
def shipped_policy() -> Policy:
    """The policy of the installed rules config."""
    return Policy.from_config(shipped_config())
