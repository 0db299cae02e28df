"""No import circle anywhere in the package.

The graph has one node per module of the installed `fleetwatch` package (every subpackage,
found with `pkgutil`, read from where it is installed) and an edge for every import statement
of the module's source, wherever it stands: at module level, under a module-level `if` or
`try`, and inside functions too. A function-level (lazy) import only moves the circle to the
first call (the demo and the Slurm demo once imported each other that way), so it counts;
only imports under `if TYPE_CHECKING:` (never run) do not. `from A import B` is an edge to
`A.B` when that is a module, else to `A`. Importing `A.B` also imports the package `A` first;
that implicit edge to a parent package is not counted (a package's `__init__` listing its
own modules would otherwise always be a circle). Any strongly connected part of more than
one module, or a module importing itself, fails the test, named module by module.
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import fleetwatch


def package_modules() -> dict[str, Path]:
    """Every module of the installed package and its source file."""
    modules = {"fleetwatch": Path(fleetwatch.__file__)}
    for info in pkgutil.walk_packages(fleetwatch.__path__, prefix="fleetwatch."):
        spec = importlib.util.find_spec(info.name)
        assert spec is not None, info.name
        assert spec.origin is not None, info.name
        modules[info.name] = Path(spec.origin)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def run_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under `node` except those under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for statement in child.orelse:
                yield from run_imports(ast.Module(body=[statement], type_ignores=[]))
        else:
            yield from run_imports(child)


def imported_modules(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The package's modules that module `name` imports (see the module docstring)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for statement in run_imports(tree):
        if isinstance(statement, ast.Import):
            found.update(alias.name for alias in statement.names)
            continue
        base = statement.module or ""
        if statement.level:
            parts = package.split(".")
            anchor = ".".join(parts[: len(parts) - statement.level + 1])
            base = f"{anchor}.{base}" if base else anchor
        for alias in statement.names:
            child = f"{base}.{alias.name}"
            found.add(child if child in modules else base)
    return {module for module in found if module in modules}


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports."""
    modules = package_modules()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of `graph` that are circles (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                part.append(member)
                if member == node:
                    break
            if len(part) > 1 or node in graph[node]:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_circles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert circles(graph) == [["a", "b", "c"], ["d"]]


def test_no_import_circle_in_the_package() -> None:
    graph = import_graph()  # read once: it parses every module of the package
    # The graph sees every layer and its imports, so no circle is no empty graph's verdict.
    assert {"fleetwatch.cli", "fleetwatch.exporter.export", "fleetwatch.sim.demo"} <= set(graph)
    assert "fleetwatch.collectors.sources.nvml" in graph["fleetwatch.collectors.gpu"]
    # A lazy (function-level) import is an edge: the CLI loads each subcommand on demand.
    assert "fleetwatch.exporter.export" in graph["fleetwatch.cli"]
    assert "fleetwatch.sim.exporter_hardware" in graph["fleetwatch.exporter.hardware"]
    assert circles(graph) == []
