"""The report's thresholds and training-job identity, read from the installed rules config.

The alert rules, the dashboards and the report must agree on what a straggler, an idle
GPU in a job or a job slowdown is, so the report keeps no copies of those numbers: it
reads the same `rules/config.yaml` the rules are generated from (`load_config()`), and
turns it into one frozen `Policy`. Only the report's own statistics (the thermal-outlier
test) are defined here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from fleetwatch.rules.config import Config, load_config
from fleetwatch.rules.definitions import kube_state_metrics_label

from fleetwatch.flags import duration

# Thermal outliers (a report-only finding): robust z-score of a GPU's temperature excess
# over its peers at similar power, and the smallest excess worth a row.
OUTLIER_Z = 3.5
OUTLIER_MIN_EXCESS_CELSIUS = 3.0


@dataclass(frozen=True, kw_only=True)
class Policy:
    """What makes a finding, as the rules define it (names follow rules/config.yaml)."""

    temperature_celsius: float
    tensor_idle_ratio: float
    job_busy_ratio: float
    idle_in_job_fraction: float
    straggler_clock_fraction: float
    straggler_clock_reasons: tuple[str, ...]
    job_slowdown_fraction: float
    job_slowdown_baseline_seconds: float
    kube_state_metrics_selector: str
    dcgm_tensor_active_metric: str
    job_label_columns: tuple[str, ...]
    """kube_pod_labels columns naming a pod's training job, first present wins."""

    @classmethod
    def from_config(cls, config: Config) -> Policy:
        """The findings' thresholds and job identity from a validated rules config."""
        t = config.thresholds
        return cls(
            temperature_celsius=float(t["gpu_temperature_celsius"]),
            tensor_idle_ratio=float(t["tensor_idle_ratio"]),
            job_busy_ratio=float(t["job_busy_ratio"]),
            idle_in_job_fraction=float(t["idle_in_job_fraction"]),
            straggler_clock_fraction=float(t["straggler_clock_fraction"]),
            straggler_clock_reasons=tuple(str(r) for r in t["straggler_clock_reasons"]),
            job_slowdown_fraction=float(t["job_slowdown_fraction"]),
            job_slowdown_baseline_seconds=duration(str(t["job_slowdown_baseline"])),
            kube_state_metrics_selector=config.kube_state_metrics_selector,
            dcgm_tensor_active_metric=config.dcgm_tensor_active_metric,
            job_label_columns=tuple(kube_state_metrics_label(k) for k in config.job_label_keys),
        )


@cache
def shipped_policy() -> Policy:
    """The policy of the installed rules config (read once per process)."""
    return Policy.from_config(load_config())
