"""Files an operator writes, fuzzed: simulator scenario files (the shipped scenarios) and the
rules config's override file (docs/configuration.md's example and parts of the shipped config).
A file is a scenario or config, or `ScenarioError`/`ConfigError` naming what is wrong; a
config never carries a threshold that is not a finite number."""

from __future__ import annotations

import importlib.resources
import math
import tempfile
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from hypothesis import given

from fleetwatch.rules.config import Config, ConfigError, load_config, parameters, shipped_text
from fleetwatch.sim.scenario import BUILTIN_PACKAGE, Scenario, ScenarioError, load_scenario
from tests.fuzz.harness import FUZZ_COSTLY, exercise, named
from tests.fuzz.mutations import mutated_bytes, mutated_tree

SCENARIOS: Final = tuple(
    resource.read_bytes()
    for resource in importlib.resources.files(BUILTIN_PACKAGE).iterdir()
    if resource.name.endswith(".yaml")
)


def _scenario(raw: bytes) -> Scenario:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzzed.yaml"
        path.write_bytes(raw)
        return load_scenario(str(path))


def scenario_holds(scenario: Scenario) -> None:
    assert 0 <= scenario.gpus <= 72
    assert 0 <= scenario.nvlinks_per_gpu <= 36
    assert all(fault.at >= 0 for fault in scenario.faults)


@FUZZ_COSTLY
@given(mutated_bytes(SCENARIOS, huge=65536))
def test_scenario_file(raw: bytes) -> None:
    exercise("scenario file", _scenario, raw, errors=(ScenarioError,), holds=scenario_holds)


SHIPPED: Final = yaml.safe_load(shipped_text("config.yaml"))
OVERRIDES: Final[tuple[Any, ...]] = (
    {
        "thresholds": {
            "gpu_temperature_celsius": 83,
            "untaint_gpu_temperature_celsius": 79,
            "untaint_hold_down": "5m",
            "job_busy_ratio": 0.4,
            "overheat_policy": [
                {"model": "NVIDIA H100 80GB HBM3", "celsius": 80},
                {"model": "NVIDIA B200", "margin_celsius": 5},
            ],
        },
        "alerts": {"GPUOverheating": {"for": "30s"}},
    },
    {"thresholds": SHIPPED["thresholds"]},
    {"alerts": SHIPPED["alerts"]},
    {key: SHIPPED[key] for key in ("selectors", "intervals", "training_jobs")},
)
_NOT_FINITE: Final = frozenset({"nan", "inf", "+inf", "-inf", ".nan", ".inf", "-.inf"})


def _override(text: bytes) -> Config:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "override.yaml"
        path.write_bytes(text)
        return load_config(override=path)


def config_holds(config: Config) -> None:
    for name, value in parameters(config).items():
        assert isinstance(value, str), name
        assert value.strip().lower() not in _NOT_FINITE, (name, value)
        try:
            number = float(value)
        except ValueError:
            continue
        assert math.isfinite(number), (name, value)


@FUZZ_COSTLY
@given(mutated_tree(OVERRIDES))
def test_rules_override_tree(tree: Any) -> None:
    exercise(
        "rules config override (YAML values)",
        _override,
        yaml.safe_dump(tree).encode(),
        errors=(ConfigError,),
        holds=config_holds,
    )


@FUZZ_COSTLY
@given(mutated_bytes([yaml.safe_dump(tree).encode() for tree in OVERRIDES], huge=65536))
def test_rules_override_bytes(raw: bytes) -> None:
    exercise(
        "rules config override (file bytes)",
        _override,
        raw,
        errors=(ConfigError,),
        holds=config_holds,
    )


def test_an_override_that_is_not_utf8_is_a_config_error() -> None:
    """Found by the fuzzer: a file of bytes that are not UTF-8 raised UnicodeDecodeError."""
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        _override(b"\xff\xfethresholds: {}\n")


def test_yaml_nested_too_deep_is_a_config_or_scenario_error() -> None:
    """Found by the fuzzer: PyYAML recurses once per level, and 10000 levels of `[` raised
    RecursionError out of the config and scenario loaders. 1000 levels raise it too (600 do
    here, with Python's recursion limit of 1000), in a tenth of the time: PyYAML's scanner
    takes time quadratic in the depth before the parser gives up."""
    deep = b"thresholds: " + b"[" * 1000 + b"\n"
    with pytest.raises(ConfigError, match="nested too deep"):
        _override(deep)
    with pytest.raises(ScenarioError, match="nested too deep"):
        _scenario(deep)


def test_numbers_of_thousands_of_digits_are_config_errors() -> None:
    """Found by the fuzzer (`./dev.sh fuzz --examples 300`): PyYAML's int() and the duration
    parser's int() refuse 5000 digits with ValueError, and 400 digits of hours overflow."""
    with pytest.raises(ConfigError):
        _override(b"thresholds:\n  gpu_temperature_celsius: " + b"9" * 5000 + b"\n")
    for digits in (5000, 400):
        with pytest.raises(ConfigError, match="a number too large"):
            _override(b"alerts:\n  GPUOverheating:\n    for: " + b"9" * digits + b"h\n")
    with pytest.raises(ScenarioError):
        _scenario(b"gpus: " + b"9" * 5000 + b"\n")


def test_a_threshold_no_float_holds_is_a_config_error() -> None:
    """Found by the fuzzer: a threshold of 400 digits is an int PyYAML reads and no float
    holds; `math.isfinite` raised OverflowError out of the schema."""
    with pytest.raises(ConfigError, match="not a finite number") as raised:
        _override(b"thresholds:\n  gpu_temperature_celsius: " + b"8" * 400 + b"\n")
    named(str(raised.value))


def test_scenario_values_too_large_are_named_by_an_excerpt() -> None:
    """Found by the fuzzer: a fault's `at` of 400 digits raised OverflowError out of the
    scenario checks, and a fault kind of 8 KiB was quoted whole in the ScenarioError."""
    healthy = next(seed for seed in SCENARIOS if b"faults: []" in seed)
    for fault in (b"9" * 400 + b", kind: xid, gpu: 0, xid: 79", b"1, kind: " + b"m" * 8192):
        with pytest.raises(ScenarioError) as raised:
            _scenario(healthy.replace(b"faults: []", b"faults: [{at: " + fault + b"}]"))
        named(str(raised.value))


def test_keys_that_yaml_reads_as_no_string_are_config_or_scenario_errors() -> None:
    """Found by `./dev.sh fuzz --examples 100000`: a bare anchor (`&lerts:`) is a null key and
    `4:` an int key; sorting them beside string keys raised TypeError out of both loaders, and
    naming a null key `None[:200]` out of the config's."""
    for override, where in (
        (b"&lerts:\n  GPUOverheating: {for: 30s}\n", "(top level)"),
        (b"thresholds: {4: 1}\n", "thresholds"),
    ):
        with pytest.raises(ConfigError, match="is not a string") as raised:
            _override(override)
        assert where in str(raised.value)
    healthy = next(seed for seed in SCENARIOS if b"faults: []" in seed)
    for key in (b"4", b"~", b"1.5"):
        with pytest.raises(ScenarioError, match="is not a string"):
            _scenario(healthy.replace(b"faults: []", b"faults: [{at: 1, " + key + b": 0}]"))
    with pytest.raises(ScenarioError, match="is not a string"):
        _scenario(healthy + b"4: 0\n")


def test_a_yaml_error_is_named_by_an_excerpt() -> None:
    """Found by `./dev.sh fuzz --examples 100000`: PyYAML's error for an unknown tag quotes
    the tag whole (8 KiB of `!`), and the loaders passed it on whole."""
    for raw in (b"!" * 8192, b"a: 1\n" + b"b" * 8192 + b": [\n"):
        with pytest.raises(ConfigError, match="not valid YAML") as raised:
            _override(raw)
        named(str(raised.value))
        with pytest.raises(ScenarioError, match="not valid YAML") as failed:
            _scenario(raw)
        named(str(failed.value))


def test_an_integer_too_long_to_write_is_named_by_its_size() -> None:
    """Found by `./dev.sh fuzz --examples 100000`: YAML reads `0x999…` of any length as an
    int, and Python refuses to write one of more than 4,300 decimal digits: quoting it in the
    error raised ValueError out of the config loader (the schema's number check). Every
    quoted value goes through `fleetwatch.shown`, in both loaders."""
    huge = b"0x" + b"9" * 4000
    for override, where in (
        (b"thresholds: {checkpoint: {burst_floor_megabytes_per_second: " + huge + b"}}", "bits"),
        (b"thresholds: {checkpoint: {burst_floor_megabytes_per_second: [" + huge + b"]}}", "list"),
        (b"alerts: {GPUOverheating: {for: " + huge + b"}}", "bits"),
        (b"alerts: {GPUOverheating: {for: 30s, severity: " + huge + b"}}", "bits"),
        (b"alerts: {GPUOverheating: {for: 30s, severity: critical, taint: " + huge + b"}}", "bits"),
        (b"? " + huge + b"\n: 1\n", "bits"),
    ):
        with pytest.raises(ConfigError, match=where) as raised:
            _override(override)
        named(str(raised.value))
    healthy = next(seed for seed in SCENARIOS if b"faults: []" in seed)
    for fault in (huge + b", kind: xid, gpu: 0, xid: 79", b"1, kind: xid, xid: 79, gpu: " + huge):
        with pytest.raises(ScenarioError, match="bits") as failed:
            _scenario(healthy.replace(b"faults: []", b"faults: [{at: " + fault + b"}]"))
        named(str(failed.value))


def test_a_misspelt_interval_or_selector_is_refused() -> None:
    """A key of `intervals:` or `selectors:` the config does not have was ignored: a
    misspelt `evalution: 10s` left the evaluation interval as shipped, silently."""
    for override in (b"intervals: {evalution: 10s}", b"selectors: {exporters: 'job=\"x\"'}"):
        with pytest.raises(ConfigError, match="unknown key"):
            _override(override)


def test_a_bad_config_value_is_named_by_an_excerpt() -> None:
    """Found by `./dev.sh fuzz --examples 500`: a job label key that is a 10 KiB mapping was
    quoted whole in the ConfigError the tainter and the report print."""
    override = {"training_jobs": {"job_label_keys": [{"k": "x" * 10000}]}}
    with pytest.raises(ConfigError, match="job_label_keys") as raised:
        _override(yaml.safe_dump(override).encode())
    named(str(raised.value))
