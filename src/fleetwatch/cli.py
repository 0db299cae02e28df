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
from collections.abc import Sequence

from fleetwatch import __version__, flags
from fleetwatch.flags import ArgParser, Flags, Subcommand, deprecated_flags_used, env_name
from fleetwatch.logs import LogSettings, configure_logging

log = logging.getLogger(__name__)

COMMON_FLAGS = (Flags(settings=LogSettings, prefix="log"),)
"""The flags every subcommand has."""


def subcommands() -> list[Subcommand]:
    """Every subcommand. Subcommand modules are listed here, explicitly."""
    from fleetwatch import demo
    from fleetwatch.exporter import export
    from fleetwatch.report import cli as report_cli
    from fleetwatch.rules import cli as rules_cli
    from fleetwatch.slurm import cli as slurm_cli
    from fleetwatch.tainter import cli as tainter_cli

    return [
        *export.subcommands(),
        *demo.subcommands(),
        *tainter_cli.subcommands(),
        *report_cli.subcommands(),
        *rules_cli.subcommands(),
        *slurm_cli.subcommands(),
    ]


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

    `fleetwatch slurm ...` builds only its own parser: the prolog and epilog run for every
    Slurm job, and importing every other subcommand (the exporter, the tainter, the report)
    would add most of a second to each job's start and end."""
    if argv[:1] == ["slurm"]:
        from fleetwatch.slurm import cli as slurm_cli

        return flags.parse_args(build_parser(slurm_cli.subcommands()), argv)
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
