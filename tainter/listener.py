"""The tainter's HTTP listener, hardened: connection cap, header-read and keep-alive timeouts.

aiohttp serves the app, but it has no limit on open connections and no deadline for a
client to finish sending a request head, so a few slow clients (slowloris) could hold
the webhook that takes nodes out of the scheduler. Each connection is wrapped in a
small protocol that (1) refuses connections past `max_connections` with a 503, and (2)
closes a connection whose request head (request line and headers) has not fully arrived
`header_timeout` seconds after its first byte (or after the connection opened). The head
boundary is found by the blank line that ends it and the body skipped by its
Content-Length; a chunked body stops the tracking for that connection (aiohttp's body
size cap still applies). Idle keep-alive connections are closed by aiohttp after
`keepalive_timeout`. The tainter compresses nothing, so Accept-Encoding is not consulted.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from dataclasses import dataclass
from typing import Final

from aiohttp import web
from fleetwatch.tainter.metrics import TainterMetrics

_HEAD_END: Final = b"\r\n\r\n"
_CONTENT_LENGTH: Final = re.compile(rb"^content-length:[ \t]*(\d+)[ \t]*$", re.I | re.M)
_CHUNKED: Final = re.compile(rb"^transfer-encoding:.*chunked", re.I | re.M)
_BUSY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 26\r\nConnection: close\r\n\r\ntoo many open connections\n"
)


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """Flag values: seconds, and a count."""

    header_timeout: float = 10.0
    keepalive_timeout: float = 75.0
    max_connections: int = 256


class _Guarded(asyncio.Protocol):
    """Forwards everything to aiohttp's protocol; watches request heads on the way."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._head = bytearray()
        self._body_left = 0
        self._tracking = True
        self._admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if self._guard.active >= self._guard.limits.max_connections:
            self._guard.metrics.connections_refused.labels(why="too_many").inc()
            transport.write(_BUSY)
            transport.close()
            return
        self._admitted = True
        self._guard.active += 1
        self._arm()
        self._inner.connection_made(transport)

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._guard.limits.header_timeout, self._too_slow)

    def _too_slow(self) -> None:
        self._guard.metrics.connections_refused.labels(why="header_timeout").inc()
        if self._transport is not None:
            self._transport.close()

    def _track(self, data: bytes) -> None:
        """Follow request boundaries: arm the timer at a new head, stop it at its end."""
        view = memoryview(data)
        while self._tracking and view:
            if self._body_left:
                skipped = min(self._body_left, len(view))
                self._body_left -= skipped
                view = view[skipped:]
                continue
            if self._timer is None:
                self._arm()  # the first byte of the next request on a kept-alive connection
            self._head += view
            end = self._head.find(_HEAD_END)
            if end < 0:
                return
            head, rest = bytes(self._head[:end]), bytes(self._head[end + len(_HEAD_END) :])
            self._head.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if _CHUNKED.search(head):
                self._tracking = False
                return
            length = _CONTENT_LENGTH.search(head)
            self._body_left = int(length.group(1)) if length else 0
            view = memoryview(rest)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        self._track(data)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._admitted else None

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._admitted:
            self._admitted = False
            self._guard.active -= 1
            self._inner.connection_lost(exc)


class ConnectionGuard:
    """Wraps each protocol aiohttp's server makes; counts open connections."""

    def __init__(self, *, limits: ListenerLimits, metrics: TainterMetrics) -> None:
        self.limits = limits
        self.metrics = metrics
        self.active = 0

    def wrap(self, inner: asyncio.Protocol) -> asyncio.Protocol:
        """The guarded protocol for one new connection."""
        return _Guarded(inner, self)


async def start_listener(
    app: web.Application,
    *,
    host: str,
    port: int,
    limits: ListenerLimits,
    metrics: TainterMetrics,
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[web.AppRunner, asyncio.Server]:
    """Serve `app` on HOST:PORT behind the guard. Stop with `server.close()` and then
    `runner.cleanup()` (which also runs the app's cleanup)."""
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=limits.keepalive_timeout)
    await runner.setup()
    handler_factory = runner.server
    assert handler_factory is not None  # set by setup()
    guard = ConnectionGuard(limits=limits, metrics=metrics)
    try:
        server = await asyncio.get_running_loop().create_server(
            lambda: guard.wrap(handler_factory()),
            host,
            port,
            ssl=ssl_context,
            reuse_address=True,
        )
    except BaseException:
        await runner.cleanup()
        raise
    return runner, server
