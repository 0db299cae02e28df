"""What the exporter does to hold less: the version as a constant of the package (not
`importlib.metadata`), a UUID's text without `uuid`, label dicts shared between families."""

from __future__ import annotations

import tomllib
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fleetwatch
from fleetwatch.catalog.spec import MetricSpec
from fleetwatch.collectors.families import LabelCache
from fleetwatch.collectors.sources.nvml import uuid_text

ROOT = Path(__file__).parents[2]


def test_the_version_constant_is_pyprojects() -> None:
    """`./dev.sh generate` writes it; a release that bumps pyproject.toml alone fails here
    (and in `generate.py --check`)."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        assert fleetwatch.__version__ == tomllib.load(f)["project"]["version"]


@given(st.binary(min_size=16, max_size=16))
def test_uuid_text_is_uuids(raw: bytes) -> None:
    assert uuid_text(raw) == str(uuid.UUID(bytes=raw))


@pytest.mark.parametrize("size", [0, 15, 17])
def test_uuid_text_refuses_other_sizes(size: int) -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        uuid_text(bytes(size))


def test_families_with_the_same_label_names_share_label_dicts() -> None:
    """One dict per label set across families (a mount's per-operation families), none
    shared between different label names, and a wrong label count still refused."""
    specs = [
        MetricSpec(name="fleetwatch_test_ops_total", kind="counter", help="O.", labels=("m", "op")),
        MetricSpec(name="fleetwatch_test_rtt_total", kind="counter", help="R.", labels=("m", "op")),
        MetricSpec(name="fleetwatch_test_bytes_total", kind="counter", help="B.", labels=("m",)),
    ]
    cache = LabelCache(specs)
    ops = cache.labels("fleetwatch_test_ops_total", ("/ckpt", "READ"))
    assert cache.labels("fleetwatch_test_rtt_total", ("/ckpt", "READ")) is ops
    assert ops == {"m": "/ckpt", "op": "READ"}
    assert cache.labels("fleetwatch_test_bytes_total", ("/ckpt",)) == {"m": "/ckpt"}
    with pytest.raises(ValueError, match="expected labels"):
        cache.labels("fleetwatch_test_rtt_total", ("/ckpt",))
