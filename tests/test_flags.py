"""One flag system: only `fleetwatch.flags` talks to argparse, and every flag of every
subcommand, declared as a settings field, reads its FLEETWATCH_<FLAG> variable."""

from __future__ import annotations

import argparse
import ast
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from fleetwatch import cli
from fleetwatch.flags import DeclaredFlag, Flags, Subcommand, env_name

# argparse calls that build a parser: only fleetwatch.flags makes them.
PARSER_CALLS = frozenset(
    {
        "ArgumentParser",
        "add_argument",
        "add_argument_group",
        "add_mutually_exclusive_group",
        "add_parser",
        "add_subparsers",
    }
)


def _package_modules() -> list[Path]:
    root = Path(str(resources.files("fleetwatch")))
    return sorted(p for p in root.rglob("*.py") if "_pb2" not in p.name)


def test_only_the_flags_module_builds_parsers() -> None:
    modules = _package_modules()
    assert len(modules) > 50  # the whole installed package, not an empty folder
    found = []
    for path in modules:
        if path.name == "flags.py" and path.parent.name == "fleetwatch":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                if name in PARSER_CALLS:
                    found.append(f"{path.name}:{node.lineno} {name}")
    assert found == []


# What each command must be given for the parse to get as far as the flag under test.
REQUIRED = {"--out": "report-out", "--kubeconfig-out": "kubeconfig", "node": "gpu-1"}


def _declared() -> list[tuple[Subcommand, Flags, DeclaredFlag, str]]:
    """Every (command, settings, field, spelling) whose variable should work."""
    found = []
    for command in cli.subcommands():
        for flags in (*command.flags, *cli.COMMON_FLAGS):
            for declared in flags.declared():
                if declared.env is None:
                    continue
                found.append((command, flags, declared, declared.option))
                found.extend(
                    (command, flags, declared, f"--{old}") for old in declared.spec.deprecated
                )
    return found


DECLARED = _declared()


def _required_words(command: Subcommand, skip: str) -> list[str]:
    words = []
    for flags in command.flags:
        for declared in flags.declared():
            if declared.spec.positional:
                choices = declared.spec.choices
                words.append(choices[0] if choices else REQUIRED[declared.option])
            elif declared.spec.required and declared.option != skip:
                words.append(f"{declared.option}={REQUIRED[declared.option]}")
    return words


def test_every_subcommand_declares_flags() -> None:
    commands = {command.name for command, *_ in DECLARED}
    assert commands == {c.name for c in cli.subcommands()}
    assert {"export", "taint", "untaint", "breaker", "report", "demo"} <= commands
    assert len(DECLARED) > 100


@pytest.mark.parametrize(
    ("command", "flags", "declared", "spelling"),
    DECLARED,
    ids=[f"{c.name} {spelling}" for c, _, _, spelling in DECLARED],
)
def test_every_flag_reads_its_variable(
    command: Subcommand,
    flags: Flags,
    declared: DeclaredFlag,
    spelling: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A switch takes the opposite of its default from its variable; any other flag either
    takes the variable's value or refuses it with one line naming the flag."""
    argv = [command.name, *_required_words(command, skip=declared.option)]
    default: Any = flags.defaults.get(declared.field.name, declared.field.default)
    if isinstance(default, bool):
        monkeypatch.setenv(env_name(spelling), "false" if default else "true")
        assert getattr(cli.parse_args(argv), declared.dest) is (not default)
        return
    value = "zz-from-env"
    monkeypatch.setenv(env_name(spelling), value)
    parse = declared.spec.parse or str
    try:
        parsed = parse(value)
        accepted = declared.spec.choices is None or parsed in declared.spec.choices
    except (argparse.ArgumentTypeError, ValueError):
        accepted = False
    if not accepted:
        with pytest.raises(SystemExit) as exit_:
            cli.parse_args(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"argument {declared.option}" in err or f"argument {spelling}" in err, err
        return
    expected = [parsed] if declared.spec.repeatable else parsed
    assert getattr(cli.parse_args(argv), declared.dest) == expected


def test_a_bad_switch_variable_names_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETWATCH_WEB_INSECURE_NO_TOKEN", "maybe")
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["taint"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "fleetwatch taint: error: FLEETWATCH_WEB_INSECURE_NO_TOKEN='maybe': expected true or false"
    )


def test_required_flags_and_positionals_are_enforced(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["report"])
    assert "the following arguments are required: --out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse_args(["breaker", "open"])
    assert "invalid choice: 'open'" in capsys.readouterr().err
    assert isinstance(cli.parse_args(["breaker", "reset"]), argparse.Namespace)
