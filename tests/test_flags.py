"""One flag system: only `fleetwatch.flags` talks to argparse, and every flag of every
subcommand, declared as a settings field, reads its FLEETWATCH_<FLAG> variable."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from fleetwatch import cli
from fleetwatch.flags import (
    DeclaredFlag,
    Flags,
    Subcommand,
    declared_flags,
    deprecated_flags_used,
    env_name,
)

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
REQUIRED = {"--out": "report-out", "--out.kubeconfig": "kubeconfig", "node": "gpu-1"}


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


# -- one convention ---------------------------------------------------------------------------
# Prometheus' own: `--GROUP.NAME`, dotted groups, each part lowercase words joined by dashes.
_PART = r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*"
FLAG_SYNTAX = re.compile(rf"--{_PART}(?:\.{_PART})*")

# Flags outside any group that are more than one word: each names one thing, as the
# ecosystem spells it, not a setting of a subject (which would be `--SUBJECT.SETTING`).
UNGROUPED_TERMS = {
    "dry-run": "kubectl's --dry-run",
    "leader-elect": "Kubernetes components' switch; heads its own --leader-elect.* group",
}

# Flags spelled as the ecosystem spells them, whose dotted words make no group of ours.
ECOSYSTEM_SPELLINGS = {
    "--web.config.file": "exporter-toolkit's flag, the one fleets pass to node_exporter",
}


def _every_option() -> dict[str, str]:
    """Every spelling a command line accepts, deprecated ones included, to where it is
    declared (`settings class: field`)."""
    found: dict[str, str] = {}
    for command in cli.subcommands():
        for flags in (*command.flags, *cli.COMMON_FLAGS):
            for declared in flags.declared():
                if declared.spec.positional:
                    continue
                where = f"{flags.settings.__name__}.{declared.field.name}"
                found[declared.option] = where
                found.update(
                    (f"--{old}", f"{where} (deprecated)") for old in declared.spec.deprecated
                )
    return found


def _settings_classes() -> list[type[Any]]:
    """Every dataclass of the package with a field declared by `setting()`."""
    classes: dict[str, type[Any]] = {}
    root = Path(str(resources.files("fleetwatch")))
    for path in _package_modules():
        if path.name == "__main__.py":
            continue  # runs the command
        name = ".".join(("fleetwatch", *path.relative_to(root).with_suffix("").parts))
        module = importlib.import_module(name.removesuffix(".__init__"))
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and dataclasses.is_dataclass(value)
                and value.__module__ == module.__name__
                and declared_flags(value)
            ):
                classes[f"{value.__module__}.{value.__qualname__}"] = value
    return list(classes.values())


def convention_breaks(options: dict[str, str]) -> list[str]:
    """Why each of `options` breaks the one convention (empty: none does)."""
    groups = {
        part
        for option in options
        if option not in ECOSYSTEM_SPELLINGS
        for part in option[2:].split(".")[:-1]
    }
    words = set(options)
    found = []
    for option, where in sorted(options.items()):
        parts = option[2:].split(".")
        if not FLAG_SYNTAX.fullmatch(option):
            found.append(f"{option} ({where}): not lowercase dash-joined words in dotted groups")
        elif len(parts) == 1 and "-" in option[2:] and option[2:] not in UNGROUPED_TERMS:
            found.append(f"{option} ({where}): a setting of a subject is --SUBJECT.SETTING")
        elif clash := [g for g in sorted(groups) for p in parts if p.startswith(g + "-")]:
            found.append(f"{option} ({where}): {clash[0]!r} is a group: write {clash[0]}.")
        elif clash := [
            w for w in sorted(words) if option.startswith(w + "-") and "." not in option[len(w) :]
        ]:
            found.append(f"{option} ({where}): extends the flag {clash[0]}: write {clash[0]}.")
    return found


def test_the_convention_catches_what_the_issue_named() -> None:
    assert convention_breaks(
        {
            "--prometheus-url": "a",
            "--prometheus.bearer-token-file": "b",
            "--reconcile-interval": "c",
            "--untaint.hold": "d",
            "--web.tls-cert-file": "e",
            "--client.tls.ca-file": "f",
            "--collector.x.hw-stats": "g",
            "--collector.x.hw-stats-interval": "h",
            "--Web.Listen_Address": "i",
            "--dry-run": "j",
        }
    ) == [
        "--Web.Listen_Address (i): not lowercase dash-joined words in dotted groups",
        "--collector.x.hw-stats-interval (h): extends the flag --collector.x.hw-stats: "
        "write --collector.x.hw-stats.",
        "--prometheus-url (a): a setting of a subject is --SUBJECT.SETTING",
        "--reconcile-interval (c): a setting of a subject is --SUBJECT.SETTING",
        "--web.tls-cert-file (e): 'tls' is a group: write tls.",
    ]


def test_every_flag_of_every_subcommand_follows_the_convention() -> None:
    options = _every_option()
    assert {"--prometheus.url", "--alertmanager.url", "--reconcile.interval"} <= set(options)
    current = {o: w for o, w in options.items() if not w.endswith("(deprecated)")}
    assert convention_breaks(current) == []


def test_every_settings_dataclass_follows_the_convention() -> None:
    """Also the settings no subcommand lists (a generator's), each under no prefix, and the
    prefixes the subcommands give them."""
    classes = _settings_classes()
    assert len(classes) > 20
    used = {flags.settings: flags.prefix for c in cli.subcommands() for flags in c.flags}
    options = {
        declared.option: f"{cls.__qualname__}.{declared.field.name}"
        for cls in classes
        for declared in declared_flags(cls, used.get(cls, ""))
        if not declared.spec.positional
    }
    assert convention_breaks(options) == []


DEPRECATED = [
    (command, declared, old)
    for command, _, declared, old in DECLARED
    if old != declared.option and not declared.spec.positional
]


@pytest.mark.parametrize(
    ("command", "declared", "old"), DEPRECATED, ids=[f"{c.name} {o}" for c, _, o in DEPRECATED]
)
def test_an_old_spelling_works_and_is_reported_with_its_new_name(
    command: Subcommand, declared: DeclaredFlag, old: str
) -> None:
    value = "zz-old"
    parse = declared.spec.parse or str
    try:
        parse(value)
    except (argparse.ArgumentTypeError, ValueError):
        value = _a_valid_value(declared)
    argv = [command.name, *_required_words(command, skip=declared.option)]
    new = cli.parse_args([*argv, f"{declared.option}={value}"])
    args = cli.parse_args([*argv, f"{old}={value}"])
    assert getattr(args, declared.dest) == getattr(new, declared.dest)
    assert deprecated_flags_used(args) == {old: declared.option}
    assert deprecated_flags_used(new) == {}


VALID = {
    "DURATION": "7s",
    "N": "3",
    "NUMBER": "0.5",
    "URL": "http://127.0.0.1:1",
    "HOST:PORT": "127.0.0.1:1",
    "SELECTOR": 'node="a"',
    "NODE=SCENARIO": "gpu-1=demo",
    "FILE": __file__,
    "DIR": str(Path(__file__).parent),
    "KUBELET_DIR": str(Path(__file__).parent),
}
"""A value each kind of flag accepts, by its metavar."""


def _a_valid_value(declared: DeclaredFlag) -> str:
    return VALID[declared.spec.metavar or ""]


def test_a_required_flag_may_be_given_by_its_old_spelling(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = cli.parse_args(["simulate-cluster", "--kubeconfig-out=k"])
    assert args.out_kubeconfig == Path("k")
    assert deprecated_flags_used(args) == {"--kubeconfig-out": "--out.kubeconfig"}
    with pytest.raises(SystemExit):
        cli.parse_args(["simulate-cluster"])
    err = capsys.readouterr().err.strip()
    assert err.endswith("error: the following arguments are required: --out.kubeconfig")
