"""The one generate step: every generated file of the checkout, from rules/config.yaml.

`./dev.sh generate` runs this in the editable install: the rules writer
(rules/*.yaml and docs/runbooks.md), the dashboards generator (helm/fleetwatch/dashboards/
*.json) and the chart generator (the chart's PrometheusRule, values and schema), in that
order, each reading the checkout's rules/config.yaml. `--check` writes nothing and exits 1
when a committed file differs from what the step would write; the drift test runs
`main(["--check"])`, the same path.

The dashboards and the chart build on the rules package (the chart's alert groups, the
dashboards' PromQL); the editable install makes that package the checkout's rules/, so
every generator reads the tree as edited.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

# The rules writer: its entry points (load_config, rendered_files, sync_files) are called
# from here only.
from fleetwatch.rules import generate as rules_writer
from fleetwatch.rules.config import CONFIG_FILE, Config, ConfigError, load_config

from dashboards import generate as dashboards_generator
from helm import generate as chart_generator

ROOT: Final = Path(__file__).resolve().parent
COMMAND: Final = "./dev.sh generate"


def checkout_config(path: Path | None = None) -> Config:
    """The checkout's rules/config.yaml (or `path`), validated."""
    return load_config(path or ROOT / CONFIG_FILE)


def rendered_files(config: Config) -> dict[Path, str]:
    """Every generated file and its text: rules, then dashboards, then the chart."""
    return {
        **rules_writer.rendered_files(config, ROOT),
        **dashboards_generator.rendered_files(config),
        **chart_generator.rendered_files(config),
    }


def orphans(files: Mapping[Path, str]) -> list[Path]:
    """Dashboard JSON in the chart that no dashboard of the generator writes any more."""
    return [
        path
        for path in sorted(dashboards_generator.DASHBOARDS_DIR.glob("*.json"))
        if path not in files
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite every generated file, or with --check report which are out of date."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a file is out of date"
    )
    parser.add_argument(
        "--config", type=Path, help="config.yaml to read (default: rules/config.yaml)"
    )
    args = parser.parse_args(argv)
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
