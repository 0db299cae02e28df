"""The hardened HTTP listener every fleetwatch server uses (the exporter, the tainter).

aiohttp bounds an idle keep-alive connection but neither a client that trickles a request
head nor the number of open connections. Each connection's protocol is wrapped so that:

- past `max_connections` open ones, a new connection gets `503` and is closed at once, so
  slow or idle clients cannot pile up file descriptors and memory;
- a request head (request line and headers) must arrive in full within `header_timeout`
  of the connection opening or of the first byte of the next request on a kept-alive
  connection. The head's end is found by following request boundaries (a body of
  Content-Length bytes is skipped, so a body is never mistaken for a head; a chunked body
  ends the watch, aiohttp's own limits apply to it);
- an idle kept-alive connection is closed after `keepalive_timeout` (aiohttp's own).

`ListenerSettings` declares those limits as the `--web.*` flags of both servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from fleetwatch.flags import duration_setting, number_setting

_HEAD_END: Final = b"\r\n\r\n"
_CONTENT_LENGTH: Final = re.compile(rb"^content-length:[ \t]*(\d+)[ \t]*$", re.I | re.M)
_CHUNKED: Final = re.compile(rb"^transfer-encoding:.*chunked", re.I | re.M)
_BUSY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 26\r\nConnection: close\r\n\r\ntoo many open connections\n"
)


@dataclass(frozen=True, kw_only=True)
class ListenerSettings:
    """What a listener tolerates from its clients: the `--web.*` limits every fleetwatch
    server (exporter and tainter) has, with one flag name and one default each.

    A keep-alive of 2m lets a Prometheus scraping, or an Alertmanager notifying, every
    minute reuse its connection; 256 connections leave room for an alert storm's
    notifications while still bounding what idle or slow clients can hold open.
    """

    header_timeout: float = duration_setting(
        10.0,
        minimum=0.1,
        maximum=300.0,
        help="close a connection whose request head is not complete this long after it "
        "opened or after the first byte of its next request",
        deprecated=("web.read-header-timeout",),
    )
    keepalive_timeout: float = duration_setting(
        120.0, minimum=1.0, maximum=3600.0, help="close a keep-alive connection idle this long"
    )
    max_connections: int = number_setting(
        256,
        minimum=1,
        maximum=10_000,
        integer=True,
        help="answer 503 and close a connection beyond this many open ones",
    )


@dataclass
class Listener:
    """A listener's limits and connection accounting (read by tests, logs and metrics).

    `on_refused(why)` is called for each connection closed by the guard: `too_many` or
    `header_timeout`.
    """

    limits: ListenerSettings
    on_refused: Callable[[str], None] | None = None
    open: int = 0
    refused: int = 0
    timed_out: int = 0
    peak: int = 0

    def _refused(self, why: str) -> None:
        if why == "too_many":
            self.refused += 1
        else:
            self.timed_out += 1
        if self.on_refused is not None:
            self.on_refused(why)


class _Guarded(asyncio.Protocol):
    """Forwards everything to aiohttp's protocol; watches request heads on the way."""

    def __init__(self, inner: asyncio.Protocol, listener: Listener) -> None:
        self._inner = inner
        self._listener = listener
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._head = bytearray()
        self._body_left = 0
        self._tracking = True
        self._admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        listener = self._listener
        self._transport = transport
        if listener.open >= listener.limits.max_connections:
            listener._refused("too_many")
            transport.write(_BUSY)
            transport.close()
            return
        self._admitted = True
        listener.open += 1
        listener.peak = max(listener.peak, listener.open)
        self._arm()
        self._inner.connection_made(transport)

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._listener.limits.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_slow(self) -> None:
        self._timer = None
        if self._transport is not None and self._admitted:
            self._listener._refused("header_timeout")
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
            self._disarm()
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
        self._disarm()
        if self._admitted:
            self._admitted = False
            self._listener.open -= 1
            self._inner.connection_lost(exc)


async def start_listener(
    app: web.Application,
    *,
    host: str,
    port: int,
    listener: Listener,
    ssl_context: ssl.SSLContext | None = None,
    shutdown_timeout: float = 60.0,
) -> tuple[web.AppRunner, asyncio.Server]:
    """Serve `app` on HOST:PORT behind the guard. Stop with `server.close()` and then
    `runner.cleanup()` (which also runs the app's cleanup)."""
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=listener.limits.keepalive_timeout,
        shutdown_timeout=shutdown_timeout,
    )
    await runner.setup()
    handlers = runner.server  # builds one aiohttp RequestHandler per connection
    assert handlers is not None  # set by setup()
    try:
        server = await asyncio.get_running_loop().create_server(
            lambda: _Guarded(handlers(), listener),
            host,
            port,
            ssl=ssl_context,
            reuse_address=True,
        )
    except BaseException:
        await runner.cleanup()
        raise
    return runner, server


@contextlib.asynccontextmanager
async def listen(
    app: web.Application,
    *,
    host: str,
    port: int,
    limits: ListenerSettings,
    shutdown_timeout: float = 60.0,
) -> AsyncIterator[Listener]:
    """Serve `app` on `host:port` under `limits` until the context exits."""
    listener = Listener(limits=limits)
    runner, server = await start_listener(
        app, host=host, port=port, listener=listener, shutdown_timeout=shutdown_timeout
    )
    try:
        yield listener
    finally:
        server.close()
        await runner.cleanup()
