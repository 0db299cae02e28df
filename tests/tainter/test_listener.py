"""The hardened listener: slow request heads are cut off (first request and kept-alive
ones), bodies are skipped by Content-Length, and connections past the cap get a 503."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from fleetwatch.listener import Listener, ListenerSettings, start_listener
from fleetwatch.tainter.metrics import TainterMetrics

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _echo(request: web.Request) -> web.Response:
    return web.Response(text=f"{len(await request.read())}")


@pytest.fixture
async def listener() -> AsyncIterator[tuple[int, TainterMetrics]]:
    app = web.Application()
    app.router.add_post("/echo", _echo)
    metrics = TainterMetrics()
    runner, server = await start_listener(
        app,
        host="127.0.0.1",
        port=0,
        listener=Listener(
            limits=ListenerSettings(header_timeout=0.3, keepalive_timeout=30.0, max_connections=3),
            on_refused=metrics.refused_connection,
        ),
    )
    yield server.sockets[0].getsockname()[1], metrics
    server.close()
    await runner.cleanup()


def request(body: bytes = b"hello") -> bytes:
    return (
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


async def response(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head + await asyncio.wait_for(reader.readexactly(length), 5)


async def closed(reader: asyncio.StreamReader) -> bool:
    """True when the server closed the connection (EOF) within the deadline."""
    return await asyncio.wait_for(reader.read(), 5) == b""


def refused(metrics: TainterMetrics, why: str) -> float:
    value = metrics.registry.get_sample_value(
        "fleetwatch_tainter_http_connections_refused_total", {"why": why}
    )
    return value or 0.0


async def test_kept_alive_requests_with_bodies_are_served(
    listener: tuple[int, TainterMetrics],
) -> None:
    port, metrics = listener
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request(b"\r\n\r\nbody with a blank line") + request(b"x" * 5000))
    await writer.drain()
    assert (await response(reader)).endswith(b"\r\n\r\n26")
    assert (await response(reader)).endswith(b"\r\n\r\n5000")
    await asyncio.sleep(0.5)  # idle between requests is the keep-alive timeout's business
    writer.write(request())
    assert (await response(reader)).endswith(b"\r\n\r\n5")
    writer.close()
    assert refused(metrics, "header_timeout") == 0


async def test_a_slow_request_head_is_cut_off(listener: tuple[int, TainterMetrics]) -> None:
    port, metrics = listener
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\n")  # and never the rest
    assert await closed(reader)
    # the same on a kept-alive connection, after a complete first request
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request())
    await response(reader)
    writer.write(b"POST /echo HTTP/1.1\r\n")
    assert await closed(reader)
    assert refused(metrics, "header_timeout") == 2
    writer.close()


async def test_connections_past_the_cap_get_503(listener: tuple[int, TainterMetrics]) -> None:
    port, metrics = listener
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    reader, _ = await asyncio.open_connection("127.0.0.1", port)
    answer = await asyncio.wait_for(reader.read(), 5)
    assert answer.startswith(b"HTTP/1.1 503")
    assert b"too many open connections" in answer
    assert refused(metrics, "too_many") == 1
    for _, writer in held:
        writer.close()
