"""Alertmanager's list of active alerts (`AlertmanagerAlerts`, API v2), as the periodic
reconcile reads it: an alert that cannot be a taint request is skipped with its reason in the
log, and the others are still read; an answer that is not a list is refused whole."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from fleetwatch.tainter.sources import AlertmanagerAlerts, SourceError


def active(node: str, **fields: Any) -> dict[str, Any]:
    """An active alert as Alertmanager's API v2 lists it."""
    return {
        "labels": {"alertname": "GPUOverheating", "node": node, "fleetwatch_taint": "gpu-overheat"},
        "annotations": {"summary": "hot"},
        "startsAt": "2026-12-01T10:00:00.000Z",
        "endsAt": "2026-12-01T10:05:00.000Z",
        "updatedAt": "2026-12-01T10:01:00.000Z",
        "fingerprint": f"fp-{node}",
        "receivers": [{"name": "fleetwatch"}],
        "status": {"state": "active", "silencedBy": [], "inhibitedBy": [], "mutedBy": []},
        **fields,
    }


@pytest.fixture
async def answering() -> AsyncIterator[tuple[dict[str, Any], str]]:
    """A stand-in Alertmanager answering `GET /api/v2/alerts` with the JSON the test puts
    in `answer["body"]`; its URL."""
    answer: dict[str, Any] = {"body": []}

    async def alerts(request: web.Request) -> web.Response:
        return web.json_response(answer["body"])

    app = web.Application()
    app.router.add_get("/api/v2/alerts", alerts)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield answer, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def firing(url: str) -> list[Any]:
    async with aiohttp.ClientSession() as session:
        return await AlertmanagerAlerts(session=session, url=url).firing_alerts()


async def test_an_alert_that_cannot_be_read_is_skipped_and_named(
    answering: tuple[dict[str, Any], str], caplog: pytest.LogCaptureFixture
) -> None:
    answer, url = answering
    answer["body"] = [
        active("gpu-1"),
        active("gpu-2", startsAt="2026-12-01T10:00:00:00"),  # no zone: read as local time
        active("gpu-3", startsAt="0001-01-01T00:00:00Z"),  # Go's zero time: never started
        active("gpu-4", labels={"node": "gpu-4", "fleetwatch_taint": 7}),
        active("gpu-5", fingerprint=["fp"]),
        "not an alert",
    ]
    with caplog.at_level(logging.WARNING, logger="fleetwatch.tainter.sources"):
        states = await firing(url)
    assert [(s.node, s.starts_at) for s in states] == [
        ("gpu-1", datetime(2026, 12, 1, 10, tzinfo=UTC))
    ]
    errors = [getattr(r, "error", "") for r in caplog.records if hasattr(r, "error")]
    assert any("fp-gpu-2.startsAt" in e and "time zone" in e for e in errors), errors
    assert any("fp-gpu-3.startsAt: missing" in e for e in errors), errors
    assert any("fp-gpu-4.labels" in e for e in errors), errors
    assert any("fingerprint: expected a non-empty string" in e for e in errors), errors
    assert len(caplog.records) == 5


async def test_an_answer_that_is_not_a_list_is_refused(
    answering: tuple[dict[str, Any], str],
) -> None:
    answer, url = answering
    answer["body"] = {"alerts": [active("gpu-1")]}
    with pytest.raises(SourceError, match="did not return a list"):
        await firing(url)
