"""Logging set-up: third-party loggers are held at WARNING unless the level is debug."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from fleetwatch.logs import THIRD_PARTY_LOGGERS, configure_logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put the root handlers and every touched logger's level back after the test."""
    root = logging.getLogger()
    handlers, root_level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in THIRD_PARTY_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(root_level)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def _lines(stream: io.StringIO) -> list[dict[str, str]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def _configure(level: str) -> io.StringIO:
    configure_logging(fmt="json", level=level)
    stream = io.StringIO()
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    return stream


@pytest.mark.usefixtures("restore_logging")
def test_third_party_info_is_hidden_at_info() -> None:
    stream = _configure("info")
    logging.getLogger("sh.command").info("process started")
    logging.getLogger("aiohttp.access").info("GET /metrics")
    logging.getLogger("asyncio").warning("slow callback")
    logging.getLogger("fleetwatch.exporter.engine").info("collector recovered")
    assert [(line["logger"], line["msg"]) for line in _lines(stream)] == [
        ("asyncio", "slow callback"),
        ("fleetwatch.exporter.engine", "collector recovered"),
    ]


@pytest.mark.usefixtures("restore_logging")
def test_debug_shows_third_party_lines() -> None:
    stream = _configure("debug")
    logging.getLogger("sh.command").debug("process started")
    logging.getLogger("grpc._channel").info("channel ready")
    assert [line["logger"] for line in _lines(stream)] == ["sh.command", "grpc._channel"]
