"""Fixtures of the Slurm tests: a real cluster (testbed/slurm.py) per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.slurm import MissingSlurm, SlurmCluster, find_binaries, slurm_cluster


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd for gpu01 and gpu02 (two GPUs each) for this module;
    skipped, saying why, without the Slurm packages or root."""
    try:
        find_binaries()
    except MissingSlurm as exc:
        pytest.skip(f"no real Slurm: {exc}")
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
