"""The rules config (rules/config.yaml): loading, validation and its parameters.

config.yaml is the one definition of every threshold, selector and duration the alert and
recording rules, the Helm chart's PrometheusRule, the dashboards, the tainter and the
report use. This module is what they import at run time (it writes no file):

- `load_config(path)` validates config.yaml (the installed one by default) and names what
  is wrong;
- `parameters(config)` lists every substitutable parameter with its rendered default
  (`thresholds.gpu_temperature_celsius` -> "78", `alerts.GPUOverheating.for` -> "5s");
- `Params` looks a threshold up by name through a `Substitute`, so the Helm chart can put
  `{{ .Values... }}` where the rule files put the default.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

import yaml

from fleetwatch.catalog.nvidia_xids import shipped_catalog
from fleetwatch.durations import DurationError, parse_duration
from fleetwatch.k8snames import TAINT_REASON_RULE, is_label_key, is_taint_reason

PACKAGE: Final = "fleetwatch.rules"
"""The installed package: config.yaml, the rule files and alertmanager.yml ship in it."""
CONFIG_FILE: Final = Path("rules", "config.yaml")
"""Where config.yaml lives in a source checkout, relative to its root."""
# The generated rule files: package data, and where they live in a source checkout.
# Node scope (ALERTS_FILE, RECORDING_FILE) runs wherever a node is scraped; global scope
# (GLOBAL_FILE, its recording and alert groups) needs the whole fleet in one query.
ALERTS_FILE: Final = Path("rules", "fleetwatch.rules.yaml")
RECORDING_FILE: Final = Path("rules", "fleetwatch.recording.yaml")
GLOBAL_FILE: Final = Path("rules", "fleetwatch.global.yaml")
XID_CATALOG: Final = "catalog"
"""`thresholds.xid_critical: catalog` takes the critical Xids from the shipped Xid catalog."""

SEVERITIES: Final = ("critical", "warning", "info")
NODE_SCOPE: Final = "node"
GLOBAL_SCOPE: Final = "global"
SCOPES: Final = (NODE_SCOPE, GLOBAL_SCOPE)
Scope = str
"""Rule scopes: a node rule reads one node's series; a global rule the whole fleet's."""
TAINT_EFFECTS: Final = ("NoSchedule", "NoExecute")
_METRIC_NAME: Final = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_JOB_SELECTOR: Final = re.compile(r'job="([^"]+)"')

Substitute = Callable[[str, str], str]
"""Maps (parameter name, rendered default) to the text that goes into the rule."""


class ConfigError(ValueError):
    """config.yaml is malformed; the message names the file, the key and the reason."""


def keep_defaults(name: str, default: str) -> str:
    """The identity substitute: every parameter keeps its value from config.yaml."""
    del name
    return default


@dataclass(frozen=True, kw_only=True)
class AlertPolicy:
    """How one alert is raised and routed: from the `alerts:` section of config.yaml."""

    severity: str
    for_: str
    keep_firing_for: str | None = None
    taint: str | None = None
    taint_effect: str | None = None


@dataclass(frozen=True, kw_only=True)
class ModelPolicy:
    """GPUOverheating's policy for one GPU model (`thresholds.overheat_policy`): an
    absolute temperature (`celsius`) or a margin to the slowdown limit (`margin_celsius`),
    exactly one of them. `model` is the GPU's name as NVML gives it
    (fleetwatch_gpu_info's `name`)."""

    model: str
    celsius: float | None = None
    margin_celsius: float | None = None


@dataclass(frozen=True, kw_only=True)
class Config:
    """config.yaml, validated."""

    source: str
    runbook_url_base: str
    exporter_selector: str
    tainter_selector: str
    kube_state_metrics_selector: str
    job_label_keys: tuple[str, ...]
    dcgm_tensor_active_metric: str
    scrape_interval: str
    evaluation_interval: str
    rate_window: str
    history_interval: str
    thresholds: Mapping[str, Any]
    alerts: Mapping[str, AlertPolicy]
    rule_groups: Mapping[str, Scope]
    """Each rule group's scope (`rule_groups:`): group name -> "node" or "global"."""
    overheat_policy: tuple[ModelPolicy, ...] = ()
    """Per-model overheat policies; models not listed use `gpu_temperature_celsius`."""

    def overheat_limit(self, model: str) -> ModelPolicy:
        """The overheat policy a GPU of `model` (NVML's name) is judged by: its own entry
        of `overheat_policy`, or the default `gpu_temperature_celsius` as a policy."""
        for policy in self.overheat_policy:
            if policy.model == model:
                return policy
        return ModelPolicy(model=model, celsius=float(self.thresholds["gpu_temperature_celsius"]))

    def overheat_headroom(
        self, model: str, celsius: float | None, margin: float | None
    ) -> float | None:
        """°C left before the overheat policy of a GPU of `model` (negative: past it), from
        its temperature and its margin to the slowdown limit as read once: what the rules'
        headroom (rules/alerts/gpu.py) computes per series, for readers of one scrape (the
        Slurm health check). None where the reading its policy needs is missing (a margin
        the driver does not report)."""
        policy = self.overheat_limit(model)
        if policy.margin_celsius is not None:
            return None if margin is None else margin - policy.margin_celsius
        return None if celsius is None else (policy.celsius or 0.0) - celsius

    def scrape_jobs(self) -> dict[str, str]:
        """The scrape job each component's selector matches, by component (`exporter`,
        `tainter`, `kube_state_metrics`): the `job_name` a scrape config gives that
        component for the rules and dashboards to see it. ConfigError naming the selector
        when one is not a plain `job="NAME"` (then no job name alone satisfies it)."""
        selectors = {
            "exporter": self.exporter_selector,
            "tainter": self.tainter_selector,
            "kube_state_metrics": self.kube_state_metrics_selector,
        }
        jobs = {}
        for component, selector in selectors.items():
            job = _JOB_SELECTOR.fullmatch(selector)
            if job is None:
                raise _fail(self.source, f"selectors.{component}", 'not a plain job="NAME"')
            jobs[component] = job.group(1)
        return jobs


def _fail(source: str, key: str, reason: str) -> ConfigError:
    return ConfigError(f"{source}: {key}: {reason}")


def _mapping(source: str, value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(source, key, f"expected a mapping, got {type(value).__name__}")
    return value


def _string(source: str, value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(source, key, f"expected a non-empty string, got {value!r}")
    return value


def _duration(source: str, value: Any, key: str) -> str:
    text = _string(source, value, key)
    try:
        parse_duration(text)
    except DurationError as exc:
        raise _fail(source, key, str(exc)) from exc
    return text


def _check_threshold(source: str, value: Any, key: str) -> None:
    """A threshold is a finite number, a duration, a list of numbers/words, or a table."""
    if isinstance(value, dict):
        for sub, item in value.items():
            _check_threshold(source, item, f"{key}.{sub}")
    elif isinstance(value, list):
        if not value or not all(isinstance(v, int | str) for v in value):
            raise _fail(source, key, "expected a non-empty list of integers or words")
    elif isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _fail(source, key, f"expected a number, a duration or a list, got {value!r}")
    elif isinstance(value, float) and not math.isfinite(value):
        raise _fail(source, key, f"{value!r} is not a finite number")
    elif isinstance(value, str):
        _duration(source, value, key)


def _policy(source: str, name: str, raw: Any) -> AlertPolicy:
    key = f"alerts.{name}"
    data = _mapping(source, raw, key)
    allowed = {"severity", "for", "keep_firing_for", "taint", "taint_effect"}
    for unknown in sorted(set(data) - allowed):
        raise _fail(source, f"{key}.{unknown}", "unknown key")
    severity = data.get("severity")
    if severity not in SEVERITIES:
        raise _fail(source, f"{key}.severity", f"{severity!r} is not one of {SEVERITIES}")
    if "for" not in data:
        raise _fail(source, f"{key}.for", "required key is missing")
    taint = data.get("taint")
    if taint is not None and not is_taint_reason(str(taint)):
        raise _fail(
            source, f"{key}.taint", f"{taint!r} is not a taint reason ({TAINT_REASON_RULE})"
        )
    effect = data.get("taint_effect")
    if effect is not None and (effect not in TAINT_EFFECTS or taint is None):
        raise _fail(
            source, f"{key}.taint_effect", f"{effect!r} needs a taint and one of {TAINT_EFFECTS}"
        )
    keep = data.get("keep_firing_for")
    return AlertPolicy(
        severity=severity,
        for_=_duration(source, data["for"], f"{key}.for"),
        keep_firing_for=None if keep is None else _duration(source, keep, f"{key}.keep_firing_for"),
        taint=taint,
        taint_effect=effect,
    )


def _training_jobs(source: str, raw: Any) -> tuple[tuple[str, ...], str]:
    """The `training_jobs:` section: the job label keys and dcgm-exporter's metric name."""
    data = _mapping(source, raw, "training_jobs")
    allowed = {"job_label_keys", "dcgm_tensor_active_metric"}
    for missing in sorted(allowed - set(data)):
        raise _fail(source, f"training_jobs.{missing}", "required key is missing")
    for unknown in sorted(set(data) - allowed):
        raise _fail(source, f"training_jobs.{unknown}", "unknown key")
    keys = data["job_label_keys"]
    if not isinstance(keys, list) or not keys:
        raise _fail(source, "training_jobs.job_label_keys", "expected a non-empty list")
    for index, key in enumerate(keys):
        if not isinstance(key, str) or not is_label_key(key):
            raise _fail(
                source, f"training_jobs.job_label_keys[{index}]", f"{key!r} is not a pod label key"
            )
    metric = _string(
        source, data["dcgm_tensor_active_metric"], "training_jobs.dcgm_tensor_active_metric"
    )
    if not _METRIC_NAME.match(metric):
        raise _fail(
            source, "training_jobs.dcgm_tensor_active_metric", f"{metric!r} is not a metric name"
        )
    return tuple(keys), metric


def shipped_text(name: str) -> str:
    """One of the files this package ships (`config.yaml`, `alertmanager.yml`, ...)."""
    return resources.files(PACKAGE).joinpath(name).read_text(encoding="utf-8")


def load_config(path: Path | None = None) -> Config:
    """Read and validate config.yaml (the installed one unless `path` is given).

    Raises ConfigError naming the file, the key and the reason.
    """
    source = str(path) if path is not None else f"{PACKAGE}/config.yaml"
    try:
        data = yaml.safe_load(path.read_text() if path is not None else shipped_text("config.yaml"))
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    top = _mapping(source, data, "(top level)")
    required = {
        "runbook_url_base",
        "selectors",
        "training_jobs",
        "intervals",
        "thresholds",
        "alerts",
        "rule_groups",
    }
    for missing in sorted(required - set(top)):
        raise _fail(source, missing, "required key is missing")
    for unknown in sorted(set(top) - required):
        raise _fail(source, unknown, "unknown key")
    selectors = _mapping(source, top["selectors"], "selectors")
    intervals = _mapping(source, top["intervals"], "intervals")
    thresholds = _mapping(source, top["thresholds"], "thresholds")
    if thresholds.get("xid_critical") == XID_CATALOG:
        # The one list of Xids worth a taint is NVIDIA's catalog (fleetwatch.catalog.nvidia_xids).
        thresholds["xid_critical"] = list(shipped_catalog().critical())
    overheat_policy = _overheat_policy(source, thresholds.pop("overheat_policy", []))
    for name, value in thresholds.items():
        _check_threshold(source, value, f"thresholds.{name}")
    job_label_keys, dcgm_metric = _training_jobs(source, top["training_jobs"])
    alerts = _mapping(source, top["alerts"], "alerts")
    return Config(
        source=source,
        runbook_url_base=_string(source, top["runbook_url_base"], "runbook_url_base"),
        exporter_selector=_string(source, selectors.get("exporter"), "selectors.exporter"),
        tainter_selector=_string(source, selectors.get("tainter"), "selectors.tainter"),
        kube_state_metrics_selector=_string(
            source, selectors.get("kube_state_metrics"), "selectors.kube_state_metrics"
        ),
        job_label_keys=job_label_keys,
        dcgm_tensor_active_metric=dcgm_metric,
        scrape_interval=_duration(source, intervals.get("scrape"), "intervals.scrape"),
        evaluation_interval=_duration(source, intervals.get("evaluation"), "intervals.evaluation"),
        rate_window=_duration(source, intervals.get("rate_window"), "intervals.rate_window"),
        history_interval=_duration(source, intervals.get("history"), "intervals.history"),
        thresholds=thresholds,
        alerts={name: _policy(source, name, raw) for name, raw in alerts.items()},
        rule_groups=_rule_groups(source, top["rule_groups"]),
        overheat_policy=overheat_policy,
    )


_MODEL_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]*")
"""A GPU model name as NVML gives it; it goes into a PromQL regex unescaped."""


def _overheat_policy(source: str, raw: Any) -> tuple[ModelPolicy, ...]:
    """`thresholds.overheat_policy`: a list of {model, celsius | margin_celsius}, each
    model once."""
    key = "thresholds.overheat_policy"
    if not isinstance(raw, list):
        raise _fail(source, key, "expected a list of {model, celsius | margin_celsius}")
    policies: list[ModelPolicy] = []
    for index, item in enumerate(raw):
        where = f"{key}[{index}]"
        entry = _mapping(source, item, where)
        for unknown in sorted(set(entry) - {"model", "celsius", "margin_celsius"}):
            raise _fail(source, f"{where}.{unknown}", "unknown key")
        model = _string(source, entry.get("model"), f"{where}.model")
        if not _MODEL_NAME.fullmatch(model):
            raise _fail(
                source,
                f"{where}.model",
                f"{model!r}: expected a GPU name of letters, digits, spaces, '-', '_' and '.'",
            )
        if any(policy.model == model for policy in policies):
            raise _fail(source, f"{where}.model", f"{model!r} is listed twice")
        limits = [name for name in ("celsius", "margin_celsius") if name in entry]
        if len(limits) != 1:
            raise _fail(source, where, "expected exactly one of celsius and margin_celsius")
        value = entry[limits[0]]
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise _fail(source, f"{where}.{limits[0]}", f"expected a number, got {value!r}")
        policies.append(ModelPolicy(model=model, **{limits[0]: float(value)}))
    return tuple(policies)


def _rule_groups(source: str, raw: Any) -> dict[str, str]:
    """The `rule_groups:` section: each group's scope. Which groups exist is the rules'
    (fleetwatch.rules.groups checks that every one is named here, and no other)."""
    scopes = _mapping(source, raw, "rule_groups")
    for name, scope in scopes.items():
        if scope not in SCOPES:
            raise _fail(source, f"rule_groups.{name}", f"{scope!r} is not one of {SCOPES}")
    return {str(name): str(scope) for name, scope in scopes.items()}


def _render_value(value: Any) -> str:
    """How a config value is written into PromQL: lists become regex alternatives."""
    if isinstance(value, list):
        return "|".join(str(v) for v in value)
    return str(value)


def _flatten(prefix: str, value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(_flatten(f"{prefix}.{key}", item))
        return out
    return {prefix: _render_value(value)}


def parameters(config: Config) -> dict[str, str]:
    """Every substitutable parameter and its rendered default, in config order."""
    params = _flatten("thresholds", dict(config.thresholds))
    for name, policy in config.alerts.items():
        params[f"alerts.{name}.for"] = policy.for_
        if policy.keep_firing_for is not None:
            params[f"alerts.{name}.keep_firing_for"] = policy.keep_firing_for
    return params


class Params:
    """Looks thresholds up by name, through the substitute."""

    def __init__(self, *, config: Config, substitute: Substitute) -> None:
        self._defaults = parameters(config)
        self._substitute = substitute

    def __call__(self, name: str) -> str:
        key = f"thresholds.{name}"
        if key not in self._defaults:
            raise KeyError(f"rules/config.yaml has no threshold {name!r}")
        return self._substitute(key, self._defaults[key])

    def table(self, name: str) -> dict[str, str]:
        """A threshold table (thresholds.<name>.<key>) as {key: rendered value}."""
        prefix = f"thresholds.{name}."
        keys = [k.removeprefix(prefix) for k in self._defaults if k.startswith(prefix)]
        if not keys:
            raise KeyError(f"rules/config.yaml has no threshold table {name!r}")
        return {key: self(f"{name}.{key}") for key in keys}

    def duration(self, key: str) -> str:
        """A duration parameter by its full name (`alerts.<Alert>.for`)."""
        return self._substitute(key, self._defaults[key])
