"""One home for the test harness: which part of the checkout may import which.

What tests share lives in a helper module (`testbed/`, or a non-`test_` module beside the
tests such as tests/rules/live.py), never in a test module another one imports: a test
module's helpers change with its tests, and importing one runs its module-level setup.
tests/ and bench/ share testbed/ and do not import each other, so a benchmark never depends on
a test's fixture and a test never on a benchmark. Each violation names its file and line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted module name) of every absolute import in `path`, nested ones too.

    `from a.b import c` yields both `a.b` and `a.b.c`: `c` may be a module.
    """
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def violations(root: Path) -> list[str]:
    """`file:line: what` for each import across the harness's boundaries under `root`."""
    found = []
    for folder, forbidden in (("tests", "bench"), ("bench", "tests")):
        for path in sorted((root / folder).rglob("*.py")):
            where = path.relative_to(root)
            crossed = set()  # lines already reported: `from a import b` yields a and a.b
            for line, module in imported_modules(path):
                parts = module.split(".")
                if parts[0] == forbidden and line not in crossed:
                    crossed.add(line)
                    found.append(f"{where}:{line}: imports {module} ({folder}/ → {forbidden}/)")
                if (
                    path.name.startswith("test_")
                    and parts[0] == "tests"
                    and parts[-1].startswith("test_")
                ):
                    found.append(f"{where}:{line}: test module imports test module {module}")
    return found


def test_no_test_module_imports_another_and_tests_and_bench_stay_apart() -> None:
    assert violations(ROOT) == []


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        (
            "tests/a/test_one.py",
            "from tests.a.test_two import helper\n",
            "tests/a/test_one.py:1: test module imports test module tests.a.test_two",
        ),
        (
            "tests/a/test_one.py",
            "import os\n\ndef f():\n    from tests.a import test_two\n",
            "tests/a/test_one.py:4: test module imports test module tests.a.test_two",
        ),
        (
            "tests/hardware/check.py",
            "from bench.timing import timed\n",
            "tests/hardware/check.py:1: imports bench.timing (tests/ → bench/)",
        ),
        (
            "bench/bench_x.py",
            "import tests.rules.live\n",
            "bench/bench_x.py:1: imports tests.rules.live (bench/ → tests/)",
        ),
    ],
)
def test_each_crossing_is_named_with_file_and_line(
    tmp_path: Path, path: str, source: str, expected: str
) -> None:
    for folder in ("tests", "bench"):
        (tmp_path / folder).mkdir()
    target = tmp_path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(source)
    assert expected in violations(tmp_path)


def test_helpers_may_import_helpers_and_testbed(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "test_one.py").write_text(
        "from tests.a.helpers import x\nfrom testbed.tool_servers import promtool\n"
    )
    (tmp_path / "tests" / "a" / "helpers.py").write_text("from tests.golden import GOLDEN_DIR\n")
    (tmp_path / "bench" / "bench_x.py").write_text("from testbed.clock import FixedClock\n")
    assert violations(tmp_path) == []
