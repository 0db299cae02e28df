"""The flags of repair after the drain (`--repair.*`, `tainter.repair`): off by default,
dry-run first, opt-in per repair kind, the escalation limits, and the GPU reset Job's image
and namespace on Kubernetes (`tainter.kube_repair`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Final

from fleetwatch.flags import duration_setting, number_setting, setting

REPAIR_MODES: Final = ("off", "dry-run", "on")
REPAIR_KINDS: Final = ("gpu-reset", "reboot")
"""The repairs an orchestrator can carry out (`fleetwatch.rules.contract.REPAIRS` less none
and hardware inspection, which are a person's)."""


def repair_kinds(text: str) -> frozenset[str]:
    """`--repair.kinds`: a comma-separated list of REPAIR_KINDS (empty allowed)."""
    kinds = frozenset(k.strip() for k in text.split(",") if k.strip())
    unknown = sorted(kinds - set(REPAIR_KINDS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown repair {unknown[0]!r}: expected some of {', '.join(REPAIR_KINDS)}"
        )
    return kinds


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairSettings:
    """Repair after the drain (`--repair.*`): off by default, dry-run first, opt-in per kind;
    a repair that does not hold `max_attempts` times within `window` quarantines the node
    for hardware inspection (`tainter.repair`)."""

    mode: str = setting(
        "off",
        choices=REPAIR_MODES,
        help="repair taken-out nodes as their reason's declared repair asks: off, dry-run "
        "(log, count and record Events only) or on",
    )
    kinds: frozenset[str] = setting(
        frozenset(),
        parse=repair_kinds,
        metavar="KIND,...",
        shown=lambda kinds: ",".join(sorted(kinds)) or "none",
        help="the repairs fleetwatch may ask for (gpu-reset, reboot); others wait for a person",
    )
    window: float = duration_setting(
        86400.0,
        minimum=60.0,
        maximum=30 * 86400.0,
        help="a reason back within this long after its repair returned means the repair did "
        "not hold",
    )
    max_attempts: int = number_setting(
        2,
        minimum=1,
        maximum=10,
        integer=True,
        help="repairs of one reason within --repair.window before the node is quarantined for "
        "hardware inspection instead",
    )
    timeout: float = duration_setting(
        3600.0,
        minimum=60.0,
        maximum=7 * 86400.0,
        help="a repair not back within this long did not work: the node is quarantined",
    )
    reset_by_reboot: bool = setting(
        True,
        help="carry out a GPU reset as a node reboot (the only reset Slurm's RebootProgram "
        "and the node-repair controllers offer); off with --repair.reset-image, Kubernetes "
        "resets the GPUs with a Job on the node instead",
    )
    reset_image: str = setting(
        "",
        metavar="IMAGE",
        help="Kubernetes: the image of the GPU reset Job (the exporter's: it carries "
        "nvidia-smi through the NVIDIA runtime); empty: no reset Job",
    )
    reset_namespace: str = setting(
        "default",
        metavar="NAMESPACE",
        help="Kubernetes: the namespace the GPU reset Jobs run in (the chart: its own)",
    )
