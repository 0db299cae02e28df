"""The `fleetwatch` command: one console script, one subcommand per component.

Every subcommand module exposes `add_subcommands(subparsers)`, registering its parsers
with `set_defaults(run=callable)`; the callable takes the parsed namespace and returns
the exit status. This module adds the flags every subcommand shares (logging), and
reads `FLEETWATCH_<FLAG>` environment variables for every long flag (dots and dashes
become underscores). A flag given on the command line wins over the environment: its
variable is then ignored, so a repeatable flag's values from the environment are
replaced by the command line's, not added to them (in a variable, a repeatable flag's values
are separated by commas). A renamed flag's old spelling (and its variable) still works for
one release and is logged once, after logging is configured; the new spelling wins.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Protocol

from fleetwatch import __version__
from fleetwatch.flags import DeprecatedSpelling, deprecated_flags_used
from fleetwatch.logs import configure_logging

log = logging.getLogger(__name__)

ENV_PREFIX = "FLEETWATCH_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class SubcommandModule(Protocol):
    """What a component contributes to the CLI."""

    def add_subcommands(self, subparsers: argparse._SubParsersAction[ArgParser]) -> None: ...


class ArgParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: `fleetwatch export: error: ...`."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def env_name(option: str) -> str:
    """`--web.listen-address` → `FLEETWATCH_WEB_LISTEN_ADDRESS`."""
    return ENV_PREFIX + option.lstrip("-").replace(".", "_").replace("-", "_").upper()


def _given(action: argparse.Action, words: Sequence[str]) -> bool:
    """Does the command line (`words`) use this flag, as `--flag`, `--flag=V` or `--no-flag`?"""
    options = action.option_strings
    return any(word.split("=", 1)[0] in options for word in words if word.startswith("--"))


def _env_arguments(parser: argparse.ArgumentParser, given: Sequence[str] = ()) -> list[str]:
    """Command-line words equivalent to the FLEETWATCH_* variables that match `parser`,
    leaving out every flag that the command line words `given` already set."""
    words: list[str] = []
    for action in parser._actions:
        longs = [
            o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")
        ]
        if not longs or isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        if _given(action, given):
            continue
        if isinstance(action, DeprecatedSpelling) and (
            _given(action.canonical, given)
            or env_name(action.canonical.option_strings[0]) in os.environ
        ):
            continue  # the new spelling, given on the command line or in its variable, wins
        value = os.environ.get(env_name(longs[0]))
        if value is None:
            continue
        if action.nargs == 0:  # a switch: store_true / store_false / BooleanOptionalAction
            lowered = value.strip().lower()
            if lowered not in _TRUE | _FALSE:
                parser.error(f"{env_name(longs[0])}={value!r}: expected true or false")
            if isinstance(action, argparse.BooleanOptionalAction):
                words.append(longs[0] if lowered in _TRUE else "--no-" + longs[0][2:])
            elif (lowered in _TRUE) == (action.const is True):
                words.append(longs[0])
        elif isinstance(action, argparse._AppendAction):  # repeatable: comma-separated
            words.extend(f"{longs[0]}={item.strip()}" for item in value.split(","))
        elif action.nargs in (None, 1, "?"):
            words.append(f"{longs[0]}={value}")
        else:
            words.extend([longs[0], *value.split(",")])
    return words


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """Flags every subcommand has."""
    parser.add_argument(
        "--log.format",
        dest="log_format",
        choices=("json", "text"),
        default="json",
        help="log line format: one JSON object per line, or text for people (default json)",
    )
    parser.add_argument(
        "--log.level",
        dest="log_level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="minimum level logged (default info)",
    )


def build_parser() -> ArgParser:
    """The whole CLI. Subcommand modules are listed here, explicitly."""
    from fleetwatch import demo
    from fleetwatch.exporter import export
    from fleetwatch.report import cli as report_cli
    from fleetwatch.tainter import cli as tainter_cli

    modules: list[SubcommandModule] = [export, demo, tainter_cli, report_cli]

    parser = ArgParser(prog="fleetwatch", description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--version", action="version", version=f"fleetwatch {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgParser)
    subparsers.required = True
    for module in modules:
        module.add_subcommands(subparsers)
    for sub in subparsers.choices.values():
        add_common_flags(sub)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed command line, with FLEETWATCH_* variables for the flags it does not give."""
    parser = build_parser()
    args_list = list(argv)
    subparsers = _subparsers(parser)
    for position, word in enumerate(args_list):
        if word in subparsers:
            given = args_list[position + 1 :]
            args_list[position + 1 : position + 1] = _env_arguments(subparsers[word], given)
            break
    return parser.parse_args(args_list)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags (command line over environment), configure logging, run the subcommand."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(fmt=args.log_format, level=args.log_level)
    for old, new in sorted(deprecated_flags_used(args).items()):
        log.warning(
            "flag %s (%s) is deprecated and goes in the next release: use %s (%s)",
            old,
            env_name(old),
            new,
            env_name(new),
            extra={"flag": old, "replacement": new},
        )
    status: int = args.run(args)
    return status


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}
