"""What the Slurm tests share: where each node of the test cluster keeps its mappings, and
fleetwatch's prolog/epilog as slurm.conf runs them there."""

from __future__ import annotations

import sys

MAPS = "maps"
"""The folder (in the cluster's workdir) holding each node's mapping directory, by name."""


def fleetwatch_script(action: str, maps: str) -> list[str]:
    """`fleetwatch slurm ACTION` with this node's mapping directory: the two nodes share
    one host, so each keeps its mappings in `maps/$SLURMD_NODENAME`."""
    return [
        "sh",
        "-c",
        f"exec {sys.executable} -m fleetwatch slurm {action} "
        f'--slurm.mapping-dir="{maps}/$SLURMD_NODENAME"',
    ]
