"""A metric is named once: in its catalog declaration, and nowhere else in production code.

Every production module (the CLI package, exporter, collectors, tainter, report, rules,
simulator, dashboards) is parsed with `ast`; a string literal, f-string parts included,
that holds a `fleetwatch_<name>` token fails the test with file:line unless the module is
in fleetwatch/catalog/ or the token is one of the few identifiers below that are not
metric names. A catalog metric spelled elsewhere should be imported; an unknown name is
either a metric the catalog lacks or a typo. Docstrings are prose and are not checked;
tests, testbed/, bench/ and generated files are not production modules.

Inside the catalog, each name is spelled by one statement, the declaration that assigns its
constant (another family's help or docs/metrics.md's prose interpolates the constant), and
every family is declared through its area's `Families`. The collectors list no family: each
emits what `collected_by` gives for its name, and no collector module holds a tuple or list
of specs.

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
from types import ModuleType
from typing import Final

import pytest

from fleetwatch import catalog
from fleetwatch.catalog import collected_by, doc
from fleetwatch.catalog.spec import PREFIX, Families, MetricSpec, Read
from fleetwatch.collectors import COLLECTORS
from fleetwatch.collectors.families import reads_of

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


def area_modules() -> dict[str, ModuleType]:
    """The catalog's area modules (those with a `FAMILIES`), by file name."""
    modules = (
        importlib.import_module(f"{catalog.__name__}.{info.name}")
        for info in pkgutil.iter_modules(catalog.__path__)
    )
    return {
        f"{module.__name__.rsplit('.', 1)[1]}.py": module
        for module in modules
        if isinstance(getattr(module, "FAMILIES", None), Families)
    }


def catalog_spellings(path: str, source: str) -> dict[str, list[tuple[str, int, str]]]:
    """Each metric token `source` spells (strings, f-string parts included, docstrings not),
    by family name: (path, line of the top-level statement, what that statement assigns)."""
    tokens = metric_tokens()
    tree = ast.parse(source)
    prose = _documentation(tree)
    found: dict[str, list[tuple[str, int, str]]] = {}
    for statement in tree.body:
        targets = [t.id for t in getattr(statement, "targets", [getattr(statement, "target", None)])
                   if isinstance(t, ast.Name)]  # fmt: skip
        spelled = {
            token
            for node in ast.walk(statement)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in prose
            for token in TOKEN.findall(node.value)
        }  # fmt: skip
        for token in spelled - NOT_METRICS.keys():
            name = tokens[token].name if token in tokens else token
            found.setdefault(name, []).append((path, statement.lineno, ",".join(targets)))
    return found


def catalog_problems(sources: dict[str, str]) -> list[str]:
    """What the catalog modules spell more than once, elsewhere than in the declaration, or
    that no declaration holds."""
    spelled: dict[str, list[tuple[str, int, str]]] = {}
    for path, source in sources.items():
        for name, places in catalog_spellings(path, source).items():
            spelled.setdefault(name, []).extend(places)
    problems = []
    for name, places in sorted(spelled.items()):
        declared = name.removeprefix(PREFIX).upper()
        others = [f"{path}:{line}" for path, line, target in places if target != declared]
        if name not in metric_tokens():
            problems.append(f"{name} is spelled ({', '.join(others)}) but declared nowhere")
        elif others:
            problems.append(f"{name} is spelled outside its declaration: {', '.join(others)}")
    return problems


def test_the_catalog_spells_each_name_once() -> None:
    sources = {path.name: path.read_text() for path in sorted((ROOT / CATALOG_DIR).glob("*.py"))}
    assert catalog_problems(sources) == []
    spelled = {name for path, source in sources.items() for name in catalog_spellings(path, source)}
    assert spelled == {spec.name for spec in catalog.ALL}


PLANTED_CATALOG: Final = '''
FAMILIES = Families()
GPU_POWER_WATTS = FAMILIES.declare("fleetwatch_gpu_power_watts", "gauge", "Power draw.")
GPU_INFO = FAMILIES.declare(
    "fleetwatch_gpu_info", "gauge", "Identity; see fleetwatch_gpu_power_watts."
)
PROSE = f"""`{GPU_POWER_WATTS}` is fine, `fleetwatch_gpu_info` is not, fleetwatch_gpu_powr_watts."""
'''


def test_catalog_checker_catches_a_second_spelling() -> None:
    assert catalog_problems({"planted.py": PLANTED_CATALOG}) == [
        "fleetwatch_gpu_info is spelled outside its declaration: planted.py:7",
        "fleetwatch_gpu_power_watts is spelled outside its declaration: planted.py:4",
        "fleetwatch_gpu_powr_watts is spelled (planted.py:7) but declared nowhere",
    ]


def test_every_family_is_declared_through_its_area() -> None:
    areas = area_modules()
    assert len(areas) >= 10
    declared = [spec for module in areas.values() for spec in module.FAMILIES]
    assert sorted(spec.name for spec in declared) == sorted(spec.name for spec in catalog.ALL)
    specs = {
        id(v): v for m in areas.values() for v in vars(m).values() if isinstance(v, MetricSpec)
    }
    assert [spec.name for spec in specs.values() if spec not in declared] == []


def test_families_refuse_a_name_declared_twice() -> None:
    families = Families(collectors=("gpu",))
    first = families.declare("fleetwatch_example_watts", "gauge", "Example.")
    assert list(families) == [first]
    assert first.collectors == ("gpu",)
    with pytest.raises(ValueError, match="declared twice"):
        families.declare("fleetwatch_example_watts", "gauge", "Again.")


def test_each_collector_emits_what_the_catalog_names_it_for() -> None:
    names = {spec.name for spec in COLLECTORS}
    named = {collector for spec in catalog.ALL for collector in spec.collectors}
    assert named == names, "a family names a collector that does not exist, or one emits none"
    for spec in COLLECTORS:
        assert spec.metrics == collected_by(spec.name), spec.name
    with pytest.raises(LookupError, match="gpus"):
        collected_by("gpus")


def spec_lists(source: str, specs: dict[str, MetricSpec]) -> list[int]:
    """Lines of the tuple, list and set displays in `source` that hold two or more of the
    names in `specs` (a module's names bound to catalog specs)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Tuple | ast.List | ast.Set)
        and sum(isinstance(e, ast.Name) and e.id in specs for e in node.elts) >= 2
    ]


def test_no_collector_lists_its_families() -> None:
    """A collector iterates `collected_by(name)`; a second list of its specs would drift."""
    modules = sorted((ROOT / "collectors").glob("*.py"))
    assert len(modules) > 10
    found = {}
    for path in modules:
        module = importlib.import_module(f"fleetwatch.collectors.{path.stem}")
        specs = {k: v for k, v in vars(module).items() if isinstance(v, MetricSpec)}
        lines = spec_lists(path.read_text(), specs)
        if lines:
            found[path.name] = lines
    assert found == {}
    planted = "SPECS = (GPU_INFO, GPU_POWER_WATTS)\nONE = (GPU_INFO, 'x')\n"
    by_name = {"GPU_INFO": catalog.gpu.GPU_INFO, "GPU_POWER_WATTS": catalog.gpu.GPU_POWER_WATTS}
    assert spec_lists(planted, by_name) == [1]


def test_a_read_of_a_field_the_source_lacks_fails_at_load() -> None:
    families = Families(collectors=("gpu",))
    spec = families.declare(
        "fleetwatch_example_watts",
        "gauge",
        "Example.",
        ("gpu", "uuid"),
        reads=(Read("power_milliwats"),),
    )
    with pytest.raises(LookupError, match="power_milliwats"):
        reads_of([spec], available={"power_milliwatts"}, identity=2)
    with pytest.raises(ValueError, match="3 identity labels"):
        reads_of([spec], available={"power_milliwats"}, identity=3)
    assert reads_of([spec], available={"power_milliwats"}, identity=2) == (
        ("fleetwatch_example_watts", spec.reads[0]),
    )
