"""The one generate step: every generated file of the checkout, from rules/config.yaml
and the metric catalog.

`./dev.sh generate` runs this in the editable install: the rules writer
(rules/*.yaml and docs/runbooks.md), the dashboards generator (helm/fleetwatch/dashboards/
*.json), the chart generator (the chart's PrometheusRule, values and schema), each reading
the checkout's rules/config.yaml, the metrics page (docs/metrics.md, from
`fleetwatch.catalog`), the simulator's fault table in docs/simulation.md (from the fault
kinds of sim/faults.py), and the release's version in the chart's Chart.yaml and the
Dockerfile (from pyproject.toml, its one home), in that order. `--check` writes nothing and
exits 1 when a committed file differs from what the step would write; the drift test runs
`main(["--check"])`, the same path.

The dashboards and the chart build on the rules package (the chart's alert groups, the
dashboards' PromQL), and the fault table on the simulator's; the editable install makes
those packages the checkout's rules/ and sim/, so every generator reads the tree as edited.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dashboards import write_dashboards as dashboards_generator
from fleetwatch.catalog import doc as metrics_page

# The rules writer: its entry points (load_config, rendered_files, sync_files) are called
# from here only.
from fleetwatch.flags import parse_tool_settings, setting
from fleetwatch.rules import write_rules as rules_writer
from fleetwatch.rules.config import CONFIG_FILE, Config, ConfigError, load_config
from fleetwatch.sim.fault_base import Fault
from fleetwatch.sim.faults import FAULT_KINDS
from helm import write_chart as chart_generator

ROOT: Final = Path(__file__).resolve().parent
COMMAND: Final = "./dev.sh generate"
SIMULATION_DOC: Final = Path("docs/simulation.md")
FAULT_TABLE_BEGIN: Final = (
    "<!-- BEGIN fault kinds: generated from sim/faults.py by ./dev.sh generate; do not edit -->"
)
FAULT_TABLE_END: Final = "<!-- END fault kinds -->"
CHART: Final = Path("helm/fleetwatch/Chart.yaml")
DOCKERFILE: Final = Path("Dockerfile")
PACKAGE_INIT: Final = Path("src/fleetwatch/__init__.py")
# The lines that carry the release's version outside pyproject.toml, which is its one home.
VERSION_LINES: Final = {
    CHART: (
        (re.compile(r"^version: .*$", re.M), "version: {v}"),
        (re.compile(r"^appVersion: .*$", re.M), 'appVersion: "{v}"'),
    ),
    DOCKERFILE: ((re.compile(r"^ARG VERSION=.*$", re.M), "ARG VERSION={v}"),),
    PACKAGE_INIT: ((re.compile(r"^__version__ = .*$", re.M), '__version__ = "{v}"'),),
}


class DocError(ValueError):
    """A hand-written doc lacks the markers a generated part goes between."""


def checkout_config(path: Path | None = None) -> Config:
    """The checkout's rules/config.yaml (or `path`), validated."""
    return load_config(path or ROOT / CONFIG_FILE)


def rendered_files(config: Config) -> dict[Path, str]:
    """Every generated file and its text: rules, dashboards, the chart, the metrics page,
    the simulator's fault table."""
    doc = ROOT / SIMULATION_DOC
    return {
        **rules_writer.rendered_files(config, ROOT),
        **dashboards_generator.rendered_files(config),
        **chart_generator.rendered_files(config),
        ROOT / metrics_page.PATH: metrics_page.render(),
        doc: with_fault_table(doc.read_text(), source=SIMULATION_DOC),
        **versioned_files(package_version()),
    }


def package_version() -> str:
    """The release's version, from its one home: pyproject.toml's `project.version`."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def versioned_files(version: str) -> dict[Path, str]:
    """The chart's `version` and `appVersion` and the image's `VERSION` label, set to
    `version`: the chart and the images are released with the package, never apart."""
    files = {}
    for path, lines in VERSION_LINES.items():
        text = (ROOT / path).read_text()
        for pattern, line in lines:
            text, found = pattern.subn(line.format(v=version), text, count=1)
            if not found:
                raise DocError(f"{path}: no line matching {pattern.pattern!r}")
        files[ROOT / path] = text
    return files


def fault_table(kinds: Mapping[str, type[Fault]] = FAULT_KINDS) -> str:
    """The scenario fault kinds as a Markdown table: keys with meaning and bounds, effect."""
    rows = ["| kind | keys (`?`: optional) | effect |", "|---|---|---|"]
    for kind, fault in kinds.items():
        keys = "; ".join(
            f"`{k.name}`{'' if k.required else '?'}: {k.param.meaning} ({k.param.bounds})"
            for k in fault.scenario_keys()
        )
        rows.append(f"| `{kind}` | {keys} | {fault.effect()} |")
    return "\n".join(rows) + "\n"


def with_fault_table(text: str, *, source: Path) -> str:
    """`text` with the fault table replaced by the one `FAULT_KINDS` gives."""
    begin, end = text.find(FAULT_TABLE_BEGIN), text.find(FAULT_TABLE_END)
    if begin < 0 or end < begin:
        raise DocError(f"{source}: needs {FAULT_TABLE_BEGIN!r} then {FAULT_TABLE_END!r}")
    head = text[: begin + len(FAULT_TABLE_BEGIN)]
    return f"{head}\n{fault_table()}{text[end:]}"


def orphans(files: Mapping[Path, str]) -> list[Path]:
    """Dashboard JSON in the chart that no dashboard of the generator writes any more."""
    return [
        path
        for path in sorted(dashboards_generator.DASHBOARDS_DIR.glob("*.json"))
        if path not in files
    ]


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
    try:
        files = rendered_files(checkout_config(args.config))
    except (ConfigError, chart_generator.GenerateError, DocError) as exc:
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
