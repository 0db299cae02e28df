"""What the exporter does instead of loading a module for one small job: the version as a
constant of the package (not `importlib.metadata`) and a UUID's text without `uuid`."""

from __future__ import annotations

import tomllib
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fleetwatch
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
