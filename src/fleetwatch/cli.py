"""The `fleetwatch` command: one console script, one subcommand per component.

Every subcommand module exposes `subcommands()`, its subcommands as data
(`fleetwatch.flags.Subcommand`: flags declared as settings dataclasses, the function it
runs); `fleetwatch.flags` builds the parser from them and adds the flags every subcommand
shares (logging). Every long flag reads a `FLEETWATCH_<FLAG>` environment variable (dots
and dashes become underscores). A flag given on the command line wins over the environment:
its variable is then ignored, so a repeatable flag's values from the environment are
replaced by the command line's, not added to them (in a variable, a repeatable flag's values
are separated by commas). A renamed flag's old spelling (and its variable) still works for
one release and is logged once, after logging is configured; the new spelling wins.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Final

from fleetwatch import __version__, flags
from fleetwatch.flags import ArgParser, Flags, Subcommand, deprecated_flags_used, env_name
from fleetwatch.logs import LogSettings, configure_logging

log = logging.getLogger(__name__)

COMMON_FLAGS = (Flags(settings=LogSettings, prefix="log"),)
"""The flags every subcommand has."""


def _export() -> tuple[Subcommand, ...]:
    from fleetwatch.exporter import export

    return export.subcommands()


def _demo() -> tuple[Subcommand, ...]:
    from fleetwatch.sim import demo

    return demo.subcommands()


def _tainter() -> tuple[Subcommand, ...]:
    from fleetwatch.tainter import cli as tainter_cli

    return tainter_cli.subcommands()


def _report() -> tuple[Subcommand, ...]:
    from fleetwatch.report import cli as report_cli

    return report_cli.subcommands()


def _rules() -> tuple[Subcommand, ...]:
    from fleetwatch.rules import cli as rules_cli

    return rules_cli.subcommands()


def _slurm() -> tuple[Subcommand, ...]:
    from fleetwatch.slurm import cli as slurm_cli

    return slurm_cli.subcommands()


SUBCOMMAND_MODULES: Final[dict[str, Callable[[], tuple[Subcommand, ...]]]] = {
    "export": _export,
    "demo": _demo,
    "simulate-cluster": _demo,
    "taint": _tainter,
    "untaint": _tainter,
    "breaker": _tainter,
    "report": _report,
    "rules": _rules,
    "slurm": _slurm,
}
"""Each subcommand's name and the module that declares it, imported only when asked: the
exporter on a node loads neither the simulator nor the rules, and `fleetwatch slurm` (run for
every Slurm job's prolog and epilog) neither the exporter nor the tainter."""


def subcommands(name: str | None = None) -> list[Subcommand]:
    """Every subcommand, or only those of the module that declares `name`."""
    loaders = dict.fromkeys(SUBCOMMAND_MODULES.values())
    if name is not None:
        loaders = {SUBCOMMAND_MODULES[name]: None}
    return [subcommand for load in loaders for subcommand in load()]


def build_parser(only: Sequence[Subcommand] | None = None) -> ArgParser:
    """The whole CLI: every subcommand (or `only` these) with its flags and the common ones."""
    return flags.build_parser(
        prog="fleetwatch",
        description=__doc__.splitlines()[0] if __doc__ else "",
        version=f"fleetwatch {__version__}",
        subcommands=subcommands() if only is None else only,
        common=COMMON_FLAGS,
    )


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed command line, with FLEETWATCH_* variables for the flags it does not give.

    A command line that starts with a subcommand builds only the parser of the module that
    declares it (`SUBCOMMAND_MODULES`); anything else (`--help`, `--version`) builds them
    all."""
    first = argv[0] if argv else None
    if first in SUBCOMMAND_MODULES:
        return flags.parse_args(build_parser(subcommands(first)), argv)
    return flags.parse_args(build_parser(), argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags (command line over environment), configure logging, run the subcommand."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging_settings: LogSettings = COMMON_FLAGS[0].read(args)
    configure_logging(fmt=logging_settings.format, level=logging_settings.level)
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
