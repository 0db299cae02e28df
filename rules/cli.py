"""`fleetwatch rules generate`: the rule files from the installed rules config and an
operator's override file, for Prometheus setups that do not use the chart.

The override file (`--rules.config-file`) holds only the keys the operator changes; the
rules writer (`fleetwatch.rules.write_rules`, the same that writes the shipped files) renders
the node and global rule files from the merged config into `--out`. The tainter, the report
and the Slurm health check take the same file with the same flag, so the rules, the clear
conditions and the findings follow one policy (docs/configuration.md).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fleetwatch.flags import REQUIRED, Flags, Subcommand, setting
from fleetwatch.rules.override import RULES_CONFIG, RulesConfigFile

ACTIONS: Final = ("generate",)


@dataclass(frozen=True, kw_only=True)
class RulesCommand:
    """`fleetwatch rules ACTION` and where it writes."""

    action: str = setting(
        REQUIRED,
        choices=ACTIONS,
        positional=True,
        help="generate: write the rule files of the rules config (with the override merged)",
    )
    out: Path = setting(
        REQUIRED, parse=Path, metavar="DIR", help="directory the rule files are written to"
    )


COMMAND: Final = Flags(settings=RulesCommand)


def subcommands() -> tuple[Subcommand, ...]:
    """`fleetwatch rules generate`."""
    return (
        Subcommand(
            name="rules",
            help="write the Prometheus rule files with your rules config override",
            description="Render fleetwatch's alert and recording rules (node and global "
            "scope) from the installed rules config with --rules.config-file merged over it.",
            flags=(COMMAND, RULES_CONFIG),
            run=run,
        ),
    )


def rule_files(rules: RulesConfigFile) -> dict[str, str]:
    """Each rule file's name and text, from the rules config with the override merged over
    it: what the rules writer puts in rules/ of a checkout, less the remediation contract
    (the tainter builds its own from the same override)."""
    from fleetwatch.rules.write_rules import REMEDIATION_FILE, rendered_files

    config = rules.load()
    header = (
        f"# Written by `fleetwatch rules generate` with --rules.config-file={rules.config_file}\n"
        if rules.config_file is not None
        else ""
    )
    return {
        path.name: header + text
        for path, text in rendered_files(config, Path()).items()
        if path.suffix == ".yaml" and path != REMEDIATION_FILE
    }


def run(args: argparse.Namespace) -> int:
    """Write the rule files into `--out`; 1 with one line naming the problem of a bad
    override or an unwritable directory."""
    from fleetwatch.rules.config import ConfigError

    command: RulesCommand = COMMAND.read(args)
    try:
        files = rule_files(RULES_CONFIG.read(args))
        command.out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (command.out / name).write_text(text)
            print(f"wrote {command.out / name}")
    except ConfigError as exc:
        print(f"fleetwatch rules: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"fleetwatch rules: error: {command.out}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0
