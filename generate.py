"""The one generate step: every generated file of the checkout, from rules/config.yaml
and the metric catalog.

`./dev.sh generate` reinstalls fleetwatch from the tree, then runs this: the rules writer
(rules/*.yaml and docs/runbooks.md), the dashboards generator (helm/fleetwatch/dashboards/
*.json), the chart generator (the chart's PrometheusRule, values and schema), each reading
the checkout's rules/config.yaml, and the metrics page (docs/metrics.md, from
`fleetwatch.catalog`), in that order. `--check` writes nothing and exits 1
when a committed file differs from what the step would write; the drift test runs
`main(["--check"])`, the same path.

The dashboards and the chart build on the rules package as installed (the chart's alert
groups, the dashboards' PromQL), so this step refuses to run when the installed
fleetwatch.rules is not the checkout's rules/ (a reinstall was missed).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Final

from fleetwatch.rules import generate as rules_writer
from fleetwatch.rules.config import CONFIG_FILE, Config, ConfigError, load_config

from dashboards import generate as dashboards_generator
from fleetwatch.catalog import doc as metrics_page

# The rules writer: its entry points (load_config, rendered_files, sync_files) are called
# from here only.
from fleetwatch.flags import parse_tool_settings, setting
from helm import generate as chart_generator

ROOT: Final = Path(__file__).resolve().parent
COMMAND: Final = "./dev.sh generate"
RULES_PACKAGE: Final = "fleetwatch.rules"
RULES_SOURCE: Final = Path("rules")
"""Where the installed rules package comes from in a checkout (pyproject.toml package-dir)."""


def checkout_config(path: Path | None = None) -> Config:
    """The checkout's rules/config.yaml (or `path`), validated."""
    return load_config(path or ROOT / CONFIG_FILE)


def rendered_files(config: Config) -> dict[Path, str]:
    """Every generated file and its text: rules, dashboards, the chart, the metrics page."""
    return {
        **rules_writer.rendered_files(config, ROOT),
        **dashboards_generator.rendered_files(config),
        **chart_generator.rendered_files(config),
        ROOT / metrics_page.PATH: metrics_page.render(),
    }


def orphans(files: Mapping[Path, str]) -> list[Path]:
    """Dashboard JSON in the chart that no dashboard of the generator writes any more."""
    return [
        path
        for path in sorted(dashboards_generator.DASHBOARDS_DIR.glob("*.json"))
        if path not in files
    ]


def _python_files(folder: Traversable, prefix: Path = Path()) -> dict[Path, bytes]:
    found: dict[Path, bytes] = {}
    for entry in folder.iterdir():
        if entry.is_dir() and entry.name != "__pycache__":
            found.update(_python_files(entry, prefix / entry.name))
        elif entry.name.endswith(".py"):
            found[prefix / entry.name] = entry.read_bytes()
    return found


def stale_install(root: Path = ROOT) -> list[str]:
    """Modules of the installed rules package that differ from, or are missing from, the
    checkout's `root`/rules/ (empty when the install is the tree's)."""
    installed = _python_files(resources.files(RULES_PACKAGE))
    tree = {
        path.relative_to(root / RULES_SOURCE): path.read_bytes()
        for path in (root / RULES_SOURCE).rglob("*.py")
    }
    return sorted(
        str(RULES_SOURCE / name)
        for name in installed.keys() | tree.keys()
        if installed.get(name) != tree.get(name)
    )


@dataclass(frozen=True, kw_only=True)
class GenerateSettings:
    """The flags of the generate step."""

    check: bool = setting(
        False, negatable=False, help="write nothing; exit 1 when a file is out of date"
    )
    config: Path | None = setting(
        None, parse=Path, metavar="FILE", help="config.yaml to read (default: rules/config.yaml)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite every generated file, or with --check report which are out of date."""
    args = parse_tool_settings(
        GenerateSettings,
        argv,
        prog=COMMAND,
        description=__doc__.splitlines()[0] if __doc__ else "",
    )
    stale = stale_install()
    if stale:
        print(
            f"{COMMAND}: the installed {RULES_PACKAGE} is not this checkout's "
            f"({', '.join(stale)} differ): run {COMMAND}, which reinstalls first",
            file=sys.stderr,
        )
        return 2
    try:
        files = rendered_files(checkout_config(args.config))
    except (ConfigError, chart_generator.GenerateError) as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        return 2
    drifted = rules_writer.sync_files(files, check=args.check, command=COMMAND)
    unowned = orphans(files)
    for path in unowned:
        if args.check:
            print(f"{path} is no longer generated: run {COMMAND}", file=sys.stderr)
        else:
            path.unlink()
            print(f"removed {path}")
    return 1 if args.check and (drifted or unowned) else drifted


if __name__ == "__main__":
    sys.exit(main())
