"""What the exporter does to hold less: the version as a constant of the package (not
`importlib.metadata`), a UUID's text without `uuid`, label dicts shared between families,
/metrics written in parts."""

from __future__ import annotations

import tomllib
import uuid
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fleetwatch
from fleetwatch.catalog.spec import MetricSpec
from fleetwatch.collectors.families import LabelCache
from fleetwatch.collectors.sources.nvml import uuid_text
from fleetwatch.exporter.engine import Engine
from fleetwatch.exporter.http import WRITE_BYTES, Request, Response, make_app

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


@given(st.lists(st.integers(min_value=0, max_value=3 * WRITE_BYTES), max_size=12))
def test_metrics_are_written_in_parts_never_joined_whole(sizes: list[int]) -> None:
    """A response of many parts goes out as its exact bytes, in writes no larger than
    `WRITE_BYTES` except a single part that large (written as it is, not copied)."""
    parts = tuple(bytes([65 + n % 26]) * size for n, size in enumerate(sizes))
    server = make_app(cast("Engine", None))
    request = Request(method="GET", path="/metrics", headers={}, keep_alive=True)
    writes = list(server.frame(request, Response(200, parts), None))
    head, _, body = b"".join(writes).partition(b"\r\n\r\n")
    assert body == b"".join(parts)
    assert f"Content-Length: {len(body)}".encode() in head
    assert all(len(w) <= WRITE_BYTES or w in parts for w in writes)
    head_request = Request(method="HEAD", path="/metrics", headers={}, keep_alive=True)
    assert b"".join(server.frame(head_request, Response(200, parts), None)).endswith(b"\r\n\r\n")
