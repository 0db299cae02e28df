"""`fleetwatch slurm prolog|epilog|healthcheck`.

The prolog and epilog run for every job (slurm.conf `Prolog=`/`Epilog=`, as root on each
node of the job): they import the flag system, `fleetwatch.slurm.mapping` and the flags of
the Prometheus client and of the rules override (`fleetwatch.promclient`,
`fleetwatch.rules.override`: standard library only at load), nothing else, and
never fail the job over a mapping. Slurm drains a node whose prolog or epilog exits
non-zero, so bad input (no job ID, a GPU list that is neither indices nor UUIDs) is reported
on standard error, which slurmd logs, and the prolog exits 0 having written nothing.
The health check (`HealthCheckProgram=`, NHC) is `fleetwatch.slurm.healthcheck`, imported
only when it runs; it asks Prometheus through the `--prometheus.*` client flags every reader
of Prometheus shares.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from fleetwatch import promclient
from fleetwatch.flags import (
    REQUIRED,
    Flags,
    Subcommand,
    duration_setting,
    http_url,
    readable_file,
    setting,
)
from fleetwatch.promclient import PrometheusClientSettings
from fleetwatch.rules.override import RULES_CONFIG, RulesConfigFile
from fleetwatch.slurm import mapping

ACTIONS: Final = ("prolog", "epilog", "healthcheck")
DEFAULT_EXPORTER_URL: Final = "http://127.0.0.1:9842"


@dataclass(frozen=True, kw_only=True)
class SlurmCommand:
    """`fleetwatch slurm ACTION` and its flags; `prometheus` is the health check's
    `--prometheus.*` client group (`fleetwatch.promclient`: URL and credentials), `rules`
    its `--rules.config-file` override (`fleetwatch.rules.override`, the tainter's and the
    report's flag)."""

    action: str = setting(
        REQUIRED,
        choices=ACTIONS,
        positional=True,
        help="prolog: record the job's GPUs; epilog: forget them; healthcheck: drain this "
        "node on a critical condition",
    )
    mapping_dir: Path = setting(
        mapping.DEFAULT_DIR,
        parse=Path,
        metavar="DIR",
        flag="slurm.mapping-dir",
        deprecated=("mapping-dir",),
        help="the job-to-GPU mapping directory (prolog, epilog)",
    )
    exporter_url: str = setting(
        DEFAULT_EXPORTER_URL,
        parse=http_url,
        metavar="URL",
        flag="exporter.url",
        deprecated=("exporter-url",),
        help="the local exporter the health check reads (URL/metrics) where no Prometheus answers",
    )
    node: str = setting(
        "",
        metavar="NAME",
        flag="healthcheck.node",
        help="the Slurm node the health check judges and drains (default $SLURMD_NODENAME)",
    )
    deadline: float = duration_setting(
        40.0,
        minimum=5.0,
        maximum=55.0,
        flag="healthcheck.deadline",
        help="the health check's whole budget, inside Slurm's 60 s limit",
    )
    contract: Path | None = setting(
        None,
        parse=readable_file,
        metavar="FILE",
        flag="healthcheck.contract",
        help="the remediation contract the health check judges by, as the rules generator "
        "writes it from your rules (default: the shipped fleetwatch.remediation.yaml)",
    )
    dry_run: bool = setting(
        False,
        flag="healthcheck.dry-run",
        help="health check: report what it would drain, drain nothing",
    )
    prometheus: PrometheusClientSettings = field(default_factory=PrometheusClientSettings)
    rules: RulesConfigFile = field(default_factory=RulesConfigFile)


COMMAND: Final = Flags(settings=SlurmCommand)
RULES: Final = dataclasses.replace(
    RULES_CONFIG, old_spellings={"config_file": ("healthcheck.rules-config",)}
)
"""`--rules.config-file` as every reader of the rules config declares it; the health check
spelled it `--healthcheck.rules-config` before 0.4.0."""


def subcommands() -> tuple[Subcommand, ...]:
    """`fleetwatch slurm prolog|epilog|healthcheck`."""
    return (
        Subcommand(
            name="slurm",
            help="Slurm prolog, epilog and health check",
            description="prolog/epilog: record which job holds which GPU in the mapping "
            "directory the exporter reads; healthcheck: drain this node when Prometheus "
            "fires a tainting alert for it, or the local exporter shows one's condition "
            "(slurm.conf HealthCheckProgram, NHC).",
            flags=(COMMAND, promclient.FLAGS, RULES),
            run=run,
        ),
    )


def read_command(args: argparse.Namespace) -> SlurmCommand:
    """The command and its option groups as parsed."""
    command: SlurmCommand = COMMAND.read(
        args, prometheus=promclient.FLAGS.read(args), rules=RULES.read(args)
    )
    return command


def run(args: argparse.Namespace) -> int:
    """Run the action named on the command line."""
    command = read_command(args)
    if command.action == "prolog":
        return prolog(command.mapping_dir, os.environ)
    if command.action == "epilog":
        return epilog(command.mapping_dir, os.environ)
    from fleetwatch.slurm import healthcheck

    problem = command.prometheus.problem()
    if problem is not None:
        print(f"fleetwatch slurm healthcheck: error: {problem}", file=sys.stderr)
        return 2
    return healthcheck.run(command, os.environ)


def prolog(directory: Path, environ: os._Environ[str] | dict[str, str]) -> int:
    """Record the job's GPUs on this node; 0 always (a mapping never fails a job)."""
    try:
        job = mapping.from_environment(environ)
        if not job.gpus:
            return 0  # a job without GPUs here holds none
        mapping.write(directory, job)
    except (mapping.MappingError, OSError) as exc:
        print(f"fleetwatch slurm prolog: error: {exc}; no mapping written", file=sys.stderr)
    return 0


def epilog(directory: Path, environ: os._Environ[str] | dict[str, str]) -> int:
    """Forget the job's mapping on this node; 0 always."""
    try:
        mapping.remove(directory, environ.get("SLURM_JOB_ID", ""))
    except (mapping.MappingError, OSError) as exc:
        print(f"fleetwatch slurm epilog: error: {exc}; nothing removed", file=sys.stderr)
    return 0
