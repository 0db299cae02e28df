"""The rules config (rules/config.yaml): loading, validation and its parameters.

config.yaml is the one definition of every threshold, selector and duration the alert and
recording rules, the Helm chart's PrometheusRule, the dashboards, the tainter and the
report use. This module is what they import at run time (it writes no file):

- `load_config(path, override=...)` validates config.yaml (the installed one by default),
  with an operator's override file merged over it, and names what is wrong (the file, the
  key, why); the thresholds' schema is `fleetwatch.rules.schema`'s;
- `parameters(config)` lists every substitutable parameter with its rendered default
  (`thresholds.gpu_temperature_celsius` -> "78", `alerts.GPUOverheating.for` -> "5s");
- `Params` looks a threshold up by name through a `Substitute`, so the Helm chart can put
  `{{ .Values... }}` where the rule files put the default, and renders the per-model
  overheat policy (`PolicyList`) from the config or, for the chart, as a Helm loop.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

import yaml

from fleetwatch.catalog.nvidia_xids import shipped_catalog
from fleetwatch.durations import DurationError, parse_duration
from fleetwatch.k8snames import TAINT_REASON_RULE, is_label_key, is_taint_reason
from fleetwatch.rules.schema import CELSIUS, MODEL_NAME, POLICY_KINDS, SchemaError, Table, table_of
from fleetwatch.shown import shown

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


@runtime_checkable
class ListSubstitute(Protocol):
    """A `Substitute` that also renders the per-model overheat policy its own way (the
    chart: a loop over `.Values.thresholds.overheat_policy`)."""

    def __call__(self, name: str, default: str) -> str: ...

    def overheat_policies(self) -> PolicyList:
        """The overheat policy as the rules it substitutes into read it."""
        ...


def number_text(value: float) -> str:
    """A number as PromQL and the alerts' words write it (78, not 78.0)."""
    return f"{value:g}"


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


PolicyText = Callable[[str, str], str]
"""(model, its limit as text) -> the text one overheat policy entry renders to."""


class PolicyList(Protocol):
    """The per-model overheat policy (`thresholds.overheat_policy`) as text: the config's
    own entries (`ListedPolicies`), or a Helm loop over the chart's values
    (helm/generate.py), built from the same templates."""

    def models(self) -> str:
        """Every listed model, as regex alternatives."""
        ...

    def if_any(self, text: str) -> str:
        """`text` when any model is listed, else nothing."""
        ...

    def each(self, *, margin: PolicyText, absolute: PolicyText) -> str:
        """Each listed model's text, in order: `margin(model, margin_celsius)` for a model
        judged by its margin to the slowdown limit, `absolute(model, celsius)` for one
        judged by its temperature."""
        ...


@dataclass(frozen=True)
class ListedPolicies:
    """A `PolicyList` of the entries of a config (the rule files, the report)."""

    policies: Sequence[ModelPolicy]

    def models(self) -> str:
        """Every listed model, as regex alternatives."""
        return "|".join(policy.model for policy in self.policies)

    def if_any(self, text: str) -> str:
        """`text` when any model is listed, else nothing."""
        return text if self.policies else ""

    def each(self, *, margin: PolicyText, absolute: PolicyText) -> str:
        """Each entry through the template of its kind."""
        return "".join(
            margin(policy.model, number_text(policy.margin_celsius))
            if policy.margin_celsius is not None
            else absolute(policy.model, number_text(policy.celsius or 0.0))
            for policy in self.policies
        )


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
    schema: Table
    """The schema of `thresholds` (fleetwatch.rules.schema): what an override may set."""

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
    """The error for `key`; a key or reason quoting a huge value is cut short, so the message
    stays one readable line."""
    return ConfigError(f"{source}: {key[:200]}: {reason[:400]}")


def _mapping(
    source: str, value: Any, key: str, allowed: frozenset[str] | None = None
) -> dict[str, Any]:
    """`value` as a mapping of string keys (YAML reads `4:` or a bare anchor `&a:` as an int
    or null key, which no config key is: found by the fuzzer, they made naming keys raise),
    with none but the `allowed` keys when given (a misspelt key is refused, not ignored)."""
    if not isinstance(value, dict):
        raise _fail(source, key, f"expected a mapping, got {type(value).__name__}")
    for name in value:
        if not isinstance(name, str):
            raise _fail(source, key, f"key {shown(name)} is not a string")
    for unknown in sorted(set(value) - allowed if allowed is not None else ()):
        raise _fail(source, f"{key}.{unknown}", "unknown key")
    return value


def _string(source: str, value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(source, key, f"expected a non-empty string, got {shown(value)}")
    return value


def _duration(source: str, value: Any, key: str) -> str:
    text = _string(source, value, key)
    try:
        parse_duration(text)
    except DurationError as exc:
        raise _fail(source, key, str(exc)) from exc
    return text


def _policy(source: str, name: str, raw: Any) -> AlertPolicy:
    key = f"alerts.{name}"
    data = _mapping(source, raw, key)
    allowed = {"severity", "for", "keep_firing_for", "taint", "taint_effect"}
    for unknown in sorted(set(data) - allowed):
        raise _fail(source, f"{key}.{unknown}", "unknown key")
    severity = data.get("severity")
    if severity not in SEVERITIES:
        raise _fail(source, f"{key}.severity", f"{shown(severity)} is not one of {SEVERITIES}")
    if "for" not in data:
        raise _fail(source, f"{key}.for", "required key is missing")
    taint = data.get("taint")
    if taint is not None and not (isinstance(taint, str) and is_taint_reason(taint)):
        raise _fail(
            source, f"{key}.taint", f"{shown(taint)} is not a taint reason ({TAINT_REASON_RULE})"
        )
    effect = data.get("taint_effect")
    if effect is not None and (effect not in TAINT_EFFECTS or taint is None):
        raise _fail(
            source,
            f"{key}.taint_effect",
            f"{shown(effect)} needs a taint and one of {TAINT_EFFECTS}",
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
                source,
                f"training_jobs.job_label_keys[{index}]",
                f"{shown(key)} is not a pod label key",
            )
    metric = _string(
        source, data["dcgm_tensor_active_metric"], "training_jobs.dcgm_tensor_active_metric"
    )
    if not _METRIC_NAME.match(metric):
        raise _fail(
            source,
            "training_jobs.dcgm_tensor_active_metric",
            f"{shown(metric)} is not a metric name",
        )
    return tuple(keys), metric


def shipped_text(name: str) -> str:
    """One of the files this package ships (`config.yaml`, `alertmanager.yml`, ...)."""
    return resources.files(PACKAGE).joinpath(name).read_text(encoding="utf-8")


@functools.cache
def _shipped_tree() -> Any:
    """The shipped config.yaml, parsed once a process: package data that does not change
    while the process runs (PyYAML's pure-Python parse of it is most of a load's time)."""
    return yaml.safe_load(shipped_text("config.yaml"))


def _read_yaml(path: Path | None, source: str) -> Any:
    """The YAML of `path` (a copy of the shipped config.yaml when None, so no caller's
    config shares a list with another's); ConfigError naming `source`."""
    try:
        if path is None:
            return copy.deepcopy(_shipped_tree())
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except RecursionError as exc:
        raise ConfigError(f"{source}: not valid YAML: nested too deep") from exc
    # PyYAML's int() of a number of thousands of digits (ValueError), or a YAML error, which
    # quotes a tag or key whole: an excerpt, one readable line of the log
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{source}: not valid YAML: {str(exc)[:400]}") from exc


def merged(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """`changes` deep-merged over `base`: mappings merge key by key, any other value
    (a number, a duration, a list such as `overheat_policy`) replaces the base's whole, and
    null removes the key (an alert's `taint` or `keep_firing_for`)."""
    result = dict(base)
    for key, value in changes.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def load_config(path: Path | None = None, *, override: Path | None = None) -> Config:
    """Read and validate config.yaml (the installed one unless `path` is given), with the
    operator's `override` file merged over it (`merged`): a file of the same shape holding
    only the keys it changes, judged by the schema of the config it overrides.

    Raises ConfigError naming the file, the key and the reason: the override file for what
    is refused once it is merged.
    """
    source = str(path) if path is not None else f"{PACKAGE}/config.yaml"
    base = _read_yaml(path, source)
    config = _validated(base, source, None)
    if override is None:
        return config
    changes = _read_yaml(override, str(override))
    if changes is None:
        return config
    top = _mapping(str(override), changes, "(top level)")
    return _validated(merged(base, top), str(override), config.schema)


_TOP_LEVEL: Final = (
    "runbook_url_base",
    "selectors",
    "training_jobs",
    "intervals",
    "thresholds",
    "alerts",
    "rule_groups",
)

_SELECTORS: Final = frozenset({"exporter", "tainter", "kube_state_metrics"})
_INTERVALS: Final = frozenset({"scrape", "evaluation", "rate_window", "history"})


def _thresholds(
    source: str, raw: Any, schema: Table | None
) -> tuple[dict[str, Any], tuple[ModelPolicy, ...], Table]:
    """The `thresholds:` section: its thresholds judged by `schema` (by their own kinds
    when None: the config the schema is taken from), its overheat policy, and the schema."""
    thresholds = dict(_mapping(source, raw, "thresholds"))
    if thresholds.get("xid_critical") == XID_CATALOG:
        # The one list of Xids worth a taint is NVIDIA's catalog (fleetwatch.catalog.nvidia_xids).
        thresholds["xid_critical"] = list(shipped_catalog().critical())
    overheat_policy = _overheat_policy(source, thresholds.pop("overheat_policy", []))
    try:
        if schema is None:
            schema = table_of(thresholds, "thresholds")
        else:
            schema.check(thresholds, "thresholds")
    except SchemaError as exc:
        raise _fail(source, exc.key, exc.reason) from exc
    threshold = thresholds.get("gpu_temperature_celsius")
    untaint = thresholds.get("untaint_gpu_temperature_celsius")
    if isinstance(threshold, int | float) and isinstance(untaint, int | float):
        _check_hysteresis(source, float(threshold), float(untaint))
    return thresholds, overheat_policy, schema


def _check_hysteresis(source: str, threshold: float, untaint: float) -> None:
    """The untaint temperature lies below the overheat threshold (the hysteresis)."""
    if untaint >= threshold:
        raise _fail(
            source,
            "thresholds.untaint_gpu_temperature_celsius",
            f"{untaint:g} is not below gpu_temperature_celsius ({threshold:g}): a taint would "
            "lift while its GPU is still past the threshold",
        )


def _validated(data: Any, source: str, schema: Table | None) -> Config:
    """The config in `data`, its thresholds judged by `schema` (their own kinds when None)."""
    top = _mapping(source, data, "(top level)")
    for missing in [key for key in _TOP_LEVEL if key not in top]:
        raise _fail(source, missing, "required key is missing")
    for unknown in sorted(set(top) - set(_TOP_LEVEL)):
        raise _fail(source, unknown, "unknown key")
    selectors = _mapping(source, top["selectors"], "selectors", _SELECTORS)
    intervals = _mapping(source, top["intervals"], "intervals", _INTERVALS)
    thresholds, overheat_policy, schema = _thresholds(source, top["thresholds"], schema)
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
        schema=schema,
    )


def _overheat_policy(source: str, raw: Any) -> tuple[ModelPolicy, ...]:
    """`thresholds.overheat_policy`: a list of {model, celsius | margin_celsius}, each
    model once (fleetwatch.rules.schema: `policy_entry_json`, the chart's schema of it)."""
    key = "thresholds.overheat_policy"
    if not isinstance(raw, list):
        raise _fail(source, key, "expected a list of {model, celsius | margin_celsius}")
    policies: list[ModelPolicy] = []
    for index, item in enumerate(raw):
        where = f"{key}[{index}]"
        entry = _mapping(source, item, where)
        for unknown in sorted(set(entry) - {"model", *POLICY_KINDS}):
            raise _fail(source, f"{where}.{unknown}", "unknown key")
        model = _string(source, entry.get("model"), f"{where}.model")
        if not MODEL_NAME.fullmatch(model):
            raise _fail(
                source,
                f"{where}.model",
                f"{shown(model)}: expected a GPU name of letters, digits, spaces, '-', '_' and '.'",
            )
        if any(policy.model == model for policy in policies):
            raise _fail(source, f"{where}.model", f"{shown(model)} is listed twice")
        limits = [name for name in POLICY_KINDS if name in entry]
        if len(limits) != 1:
            raise _fail(source, where, "expected exactly one of celsius and margin_celsius")
        try:
            CELSIUS.check(entry[limits[0]], f"{where}.{limits[0]}")
        except SchemaError as exc:
            raise _fail(source, exc.key, exc.reason) from exc
        policies.append(ModelPolicy(model=model, **{limits[0]: float(entry[limits[0]])}))
    return tuple(policies)


def _rule_groups(source: str, raw: Any) -> dict[str, str]:
    """The `rule_groups:` section: each group's scope. Which groups exist is the rules'
    (fleetwatch.rules.groups checks that every one is named here, and no other)."""
    scopes = _mapping(source, raw, "rule_groups")
    for name, scope in scopes.items():
        if scope not in SCOPES:
            raise _fail(source, f"rule_groups.{name}", f"{shown(scope)} is not one of {SCOPES}")
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
        self.overheat_policies: PolicyList = (
            substitute.overheat_policies()
            if isinstance(substitute, ListSubstitute)
            else ListedPolicies(config.overheat_policy)
        )
        """The per-model overheat policy, as the substitute renders it."""

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
