"""The remediation contract, as the tainter reads it: how each taint reason is lifted.

Each alert that may taint declares its remediation beside its expression in rules/alerts/
(`fleetwatch.rules.promql.Remediation`); the rules generator writes the contract of the
reasons config.yaml's alerts ask for to rules/fleetwatch.remediation.yaml, which ships in
this package. Per reason, either `clear`: a PromQL query for one node (`$node` in place of
its name) that returns a non-empty result only when positive evidence says the condition
is gone; or `manual`: why only a person may lift the taint. The tainter loads it at start
(`load_contract`) and writes no PromQL of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

from fleetwatch.rules.config import PACKAGE, ConfigError, shipped_text

NODE_PLACEHOLDER: Final = "$node"
"""Where a clear condition names its node: the tainter puts the node's name in its place."""
CONTRACT_FILE: Final = "fleetwatch.remediation.yaml"
"""The contract's file name in this package (rules/ in a source checkout)."""
CLEAR: Final = "clear"
MANUAL: Final = "manual"
ALERTS: Final = "alerts"


@dataclass(frozen=True, kw_only=True)
class Contract:
    """Each reason's clear condition, or why a person must lift it; every reason has one."""

    clear: Mapping[str, str]
    manual: Mapping[str, str]

    @property
    def reasons(self) -> frozenset[str]:
        """Every reason the contract covers."""
        return frozenset(self.clear) | frozenset(self.manual)


def parse_contract(text: str, *, source: str) -> Contract:
    """The contract in `text`; ConfigError naming `source`, the reason and what is wrong."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of taint reasons")
    clear: dict[str, str] = {}
    manual: dict[str, str] = {}
    for reason, entry in data.items():
        if not isinstance(entry, dict) or set(entry) - {ALERTS, CLEAR, MANUAL}:
            raise ConfigError(f"{source}: {reason}: expected alerts and clear or manual")
        kinds = [kind for kind in (CLEAR, MANUAL) if kind in entry]
        if len(kinds) != 1 or not isinstance(entry[kinds[0]], str) or not entry[kinds[0]]:
            raise ConfigError(f"{source}: {reason}: expected exactly one of clear, manual")
        (clear if kinds[0] == CLEAR else manual)[str(reason)] = entry[kinds[0]]
    return Contract(clear=clear, manual=manual)


def load_contract() -> Contract:
    """The contract this package ships (rules/fleetwatch.remediation.yaml)."""
    return parse_contract(shipped_text(CONTRACT_FILE), source=f"{PACKAGE}/{CONTRACT_FILE}")
