"""The operator's rules override file: `--rules.config-file`, shared by every reader of the
rules config outside the chart.

An override file has the shape of rules/config.yaml and holds only the keys the operator
changes (kubernetes-mixin's `_config+::`); `fleetwatch.rules.config.load_config` merges it
over the shipped config (mappings key by key, lists such as `overheat_policy` whole) and
judges it by the same schema. The tainter (its declared reasons and its clear conditions),
the report (its findings' thresholds) and `fleetwatch rules generate` (the rule files) take
it with this one flag, so all three follow one policy. This module imports only the flag
system at load: the commands that declare the flag load the rules when they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from fleetwatch.flags import Flags, readable_file, setting

if TYPE_CHECKING:
    from fleetwatch.rules.config import Config
    from fleetwatch.rules.contract import Contract

CONFIG_FILE_HELP: Final = (
    "a rules config override: a YAML file shaped like the shipped rules/config.yaml "
    "holding only the keys it changes (thresholds, overheat_policy, alert timing), merged "
    "over the shipped config and validated by its schema (docs/configuration.md)"
)


@dataclass(frozen=True, kw_only=True)
class RulesConfigFile:
    """`--rules.config-file`: the override file, or None for the shipped config alone."""

    config_file: Path | None = setting(
        None, parse=readable_file, metavar="FILE", help=CONFIG_FILE_HELP
    )

    def load(self) -> Config:
        """The rules config in effect: the shipped one with the override merged over it.
        ConfigError naming the file, the key and the reason."""
        from fleetwatch.rules.config import load_config

        return load_config(override=self.config_file)

    def contract(self, config: Config) -> Contract:
        """The remediation contract of `config` (loaded by `load`): the shipped contract
        file when there is no override, else built from the overridden config the way the
        rules writer builds that file (clear conditions with their thresholds, the alerts
        each reason stands for, their local checks)."""
        from fleetwatch.rules.contract import load_contract, parse_contract
        from fleetwatch.rules.groups import dump_contract, remediation_contract

        if self.config_file is None:
            return load_contract()
        return parse_contract(
            dump_contract(remediation_contract(config)), source=f"{self.config_file} (override)"
        )


RULES_CONFIG: Final = Flags(settings=RulesConfigFile, prefix="rules")
"""The flag as every command that reads the rules config declares it."""
