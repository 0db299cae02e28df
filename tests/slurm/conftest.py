"""Fixtures of the Slurm tests: a real cluster (`fleetwatch.sim.slurm`) per test module,
whose prolog and epilog are fleetwatch's, each node keeping its own mapping directory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetwatch.sim.slurm import MissingSlurm, SlurmCluster, find_binaries, slurm_cluster
from tests.slurm.cluster import MAPS, fleetwatch_script


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd for gpu01 and gpu02 (two GPUs each) for this module,
    with fleetwatch's prolog and epilog; skipped, saying why, without the Slurm packages or
    root."""
    try:
        find_binaries()
    except MissingSlurm as exc:
        pytest.skip(f"no real Slurm: {exc}")
    workdir = tmp_path_factory.mktemp("slurm")
    maps = str(workdir / MAPS)
    with slurm_cluster(
        workdir,
        prolog=fleetwatch_script("prolog", maps),
        epilog=fleetwatch_script("epilog", maps),
    ) as cluster:
        yield cluster
