"""The metric catalog is the one place a `fleetwatch_` metric name is spelled.

Every production module (the CLI package, exporter, collectors, tainter, report, rules,
simulator, dashboards) is parsed with `ast`; a string literal, f-string parts included,
that holds a `fleetwatch_<name>` token fails the test with file:line unless the module is
in fleetwatch/catalog/ or the token is one of the few identifiers below that are not
metric names. A catalog metric spelled elsewhere should be imported; an unknown name is
either a metric the catalog lacks or a typo. Docstrings are prose and are not checked;
tests, testbed/, bench/ and generated files are not production modules.

Also here: what each spec must carry for docs/metrics.md, and the constant naming rule.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from fleetwatch import catalog
from fleetwatch.catalog import doc
from fleetwatch.catalog.spec import PREFIX, MetricSpec

ROOT: Final = Path(__file__).resolve().parents[1]
PRODUCTION: Final = (
    "src/fleetwatch",
    "exporter",
    "collectors",
    "tainter",
    "report",
    "rules",
    "sim",
    "dashboards",
)
CATALOG_DIR: Final = Path("src/fleetwatch/catalog")
GENERATED: Final = re.compile(r"_pb2(_grpc)?\.py$")
TOKEN: Final = re.compile(r"(?<![A-Za-z0-9_])fleetwatch_[a-z0-9_]*[a-z0-9]")

NOT_METRICS: Final = {
    # The alert label that asks the tainter for a taint, and its effect (the taint contract).
    "fleetwatch_taint": "alert label",
    "fleetwatch_taint_effect": "alert label",
    # argparse namespace attribute holding the deprecated flags a command line used.
    "fleetwatch_deprecated_flags": "argparse attribute",
    # Stems of recording-rule names (`level:metric:operation`) that name no raw metric:
    # namespace_training_job:fleetwatch_gpu_tensor_active:median, ..._sm_clock:median,
    # node_fabric:fleetwatch_errors:rate5m,
    # node:/fleet:fleetwatch_gpu_over_temperature_threshold:count.
    "fleetwatch_gpu_tensor_active": "recording-rule stem",
    "fleetwatch_gpu_sm_clock": "recording-rule stem",
    "fleetwatch_errors": "recording-rule stem",
    "fleetwatch_gpu_over_temperature_threshold": "recording-rule stem",
}
"""Identifiers that start with `fleetwatch_` but are not metric families."""


def metric_tokens() -> dict[str, MetricSpec]:
    """Every way a catalog family's name appears: as declared, as prometheus_client's
    family name (a counter without `_total`), and a histogram's sample names."""
    tokens: dict[str, MetricSpec] = {}
    for spec in catalog.ALL:
        tokens[spec.name] = tokens[spec.family_name] = spec
        if spec.kind == "histogram":
            for suffix in ("_bucket", "_count", "_sum", "_created"):
                tokens[spec.name + suffix] = spec
    return tokens


def _documentation(tree: ast.AST) -> set[int]:
    """ids of the string constants that are statements of their own (docstrings)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, token) of each `fleetwatch_` token in a string literal of `source` (f-string
    parts included, docstrings not)."""
    tree = ast.parse(source)
    prose = _documentation(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            found.extend((node.lineno, token) for token in TOKEN.findall(node.value))
    return sorted(found)


def problems(path: str, source: str) -> list[str]:
    """What `source` (module `path`) spells that it should import or that is unknown."""
    tokens = metric_tokens()
    found = []
    for line, token in spelled_names(source):
        if token in NOT_METRICS:
            continue
        spec = tokens.get(token)
        if spec is None:
            found.append(f"{path}:{line}: {token} is not in fleetwatch.catalog")
        else:
            found.append(f"{path}:{line}: {token} is spelled: import {constant(spec)}")
    return found


def constant(spec: MetricSpec) -> str:
    """Where a spec lives: `fleetwatch.catalog.<area>.<CONSTANT>`."""
    areas = (
        importlib.import_module(f"{catalog.__name__}.{info.name}")
        for info in pkgutil.iter_modules(catalog.__path__)
    )
    for area in areas:
        for name, value in vars(area).items():
            if value is spec:
                return f"{area.__name__}.{name}"
    raise LookupError(spec.name)


def production_modules() -> Iterator[Path]:
    """Production Python modules of the checkout, the catalog's and generated ones not."""
    for top in PRODUCTION:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if CATALOG_DIR in relative.parents or GENERATED.search(path.name):
                continue
            yield relative


def test_no_production_module_spells_a_metric_name() -> None:
    modules = list(production_modules())
    assert len(modules) > 50, "the walk found too few modules"
    found = [
        problem for path in modules for problem in problems(str(path), (ROOT / path).read_text())
    ]
    assert found == []


PLANTED: Final = '''
"""A docstring may name fleetwatch_gpu_temperature_celsius."""
from fleetwatch.catalog.gpu import GPU_TEMPERATURE_CELSIUS

LABEL = "fleetwatch_taint"
OK = f"max({GPU_TEMPERATURE_CELSIUS}) > 80"


def build(node: str) -> str:
    """Also prose: fleetwatch_gpu_power_watts."""
    # A comment may too: fleetwatch_gpu_power_watts.
    return f'rate(fleetwatch_gpu_xid_errors_total{{node="{node}"}}[5m])'


TYPO = "max(fleetwatch_gpu_temprature_celsius)"
WAIT = "fleetwatch_tainter_webhook_duration_seconds_bucket"
'''


def test_checker_catches_planted_literals() -> None:
    assert problems("planted.py", PLANTED) == [
        "planted.py:12: fleetwatch_gpu_xid_errors_total is spelled: import "
        "fleetwatch.catalog.xid.GPU_XID_ERRORS_TOTAL",
        "planted.py:15: fleetwatch_gpu_temprature_celsius is not in fleetwatch.catalog",
        "planted.py:16: fleetwatch_tainter_webhook_duration_seconds_bucket is spelled: import "
        "fleetwatch.catalog.tainter.TAINTER_WEBHOOK_DURATION_SECONDS",
    ]


def test_each_family_is_declared_once_under_its_constant() -> None:
    names = [spec.name for spec in catalog.ALL]
    assert len(names) == len(set(names))
    for spec in catalog.ALL:
        assert constant(spec).rsplit(".", 1)[1] == spec.name.removeprefix(PREFIX).upper()
        assert str(spec) == spec.name


@pytest.mark.parametrize("spec", catalog.ALL, ids=lambda spec: spec.name)
def test_spec_carries_its_documentation(spec: MetricSpec) -> None:
    assert spec.unit, "no unit"
    assert spec.source, "no source"
    assert spec.series, "no series bound"
    assert doc.row(spec).startswith(f"| `{spec.name}` | {spec.kind} |")


def test_metrics_page_lists_every_family_once() -> None:
    listed = [spec for _title, _prose, specs in doc.SECTIONS for spec in specs]
    assert sorted(spec.name for spec in listed) == sorted(spec.name for spec in catalog.ALL)
    assert (ROOT / doc.PATH).read_text() == doc.render()


def test_spec_refuses_a_description_of_a_label_it_lacks() -> None:
    with pytest.raises(ValueError, match="describes label 'sensor'"):
        MetricSpec(
            "fleetwatch_example_celsius", "gauge", "Example.", ("gpu",), label_values={"sensor": ""}
        )


def test_catalog_imports_only_the_standard_library() -> None:
    """The tainter and the report read the catalog without the exporter's dependencies."""
    probe = (
        "import sys, fleetwatch.catalog, fleetwatch.catalog.doc\n"
        "heavy = {'prometheus_client', 'pynvml', 'pyudev', 'aiohttp', 'grpc', 'yaml'}\n"
        "print(sorted(heavy & {name.split('.')[0] for name in sys.modules}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
