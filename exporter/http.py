"""The exporter's HTTP surface: /metrics, /healthz, /readyz and a landing page.

Handlers only hand out what the engine already rendered; nothing here touches hardware
or blocks, so a hung collector never slows a scrape.

The listener defends the node it runs on: a client must send a complete request head
within the header timeout (counted from the connection or from the first byte of the next
request), an idle keep-alive connection is closed after the keep-alive timeout, and past
the connection cap a new connection gets `503` and is closed at once, so slow or idle
clients cannot pile up file descriptors and memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from fleetwatch.exporter.engine import Engine
from fleetwatch.exporter.settings import HttpLimits

from fleetwatch import __version__

log = logging.getLogger(__name__)

ENGINE = web.AppKey("engine", Engine)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_HEAD_END = b"\r\n\r\n"
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 32\r\n\r\n"
    b"too many connections, try again\n"
)
# Handlers answer from memory; a connection still busy this long after shutdown began is
# a client not reading its response.
_SHUTDOWN_GRACE_SECONDS = 2.0


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an `Accept-Encoding` header admits gzip (RFC 9110 section 12.5.3).

    `gzip;q=0` refuses it; without a `gzip` entry, `*` with a non-zero q admits it.
    """
    qualities: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, _, params = item.partition(";")
        coding = coding.strip().lower()
        if not coding:
            continue
        quality = 1.0
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:  # a malformed weight: the entry is ignored, not trusted
                    quality = 0.0
        qualities[coding] = quality
    if "gzip" in qualities:
        return qualities["gzip"] > 0
    return qualities.get("*", 0.0) > 0


async def metrics(request: web.Request) -> web.Response:
    """The latest snapshot; gzip when the scraper accepts it (Prometheus does)."""
    engine = request.app[ENGINE]
    headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding"}
    if accepts_gzip(request.headers.get("Accept-Encoding", "")):
        headers["Content-Encoding"] = "gzip"
        return web.Response(body=engine.exposition_gzip(), headers=headers)
    return web.Response(body=engine.exposition(), headers=headers)


async def healthz(request: web.Request) -> web.Response:
    """Liveness: fails while a collector has been blocked past the hang timeout."""
    hung = request.app[ENGINE].hung()
    if hung:
        detail = ", ".join(f"{name} blocked for {seconds:.0f}s" for name, seconds in hung)
        return web.Response(status=503, text=f"unhealthy: {detail}\n")
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    """Readiness: after every collector finished its first run."""
    if request.app[ENGINE].ready:
        return web.Response(text="ready\n")
    return web.Response(status=503, text="not ready: first collection cycle in progress\n")


async def landing(request: web.Request) -> web.Response:
    """A small page: version, each collector's state, last duration and error."""
    engine = request.app[ENGINE]
    now = time.time()
    rows = []
    for state in engine.states:
        age = f"{now - state.last_success_wall:.0f}s ago" if state.last_success_wall else "never"
        duration = f"{state.duration * 1000:.1f} ms" if state.duration is not None else "-"
        status = "up" if state.up else "down"
        rows.append(
            f"<tr><td>{html.escape(state.name)}</td><td class={status}>{status}</td>"
            f"<td>{duration}</td><td>{state.series}</td><td>{age}</td>"
            f"<td>{html.escape(state.last_error or '')}</td></tr>"
        )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>fleetwatch exporter</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em 1em;text-align:left}}
.up{{color:#1a7f37}}.down{{color:#cf222e;font-weight:bold}}</style></head>
<body><h1>fleetwatch exporter {html.escape(__version__)}</h1>
<p><a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> ·
<a href="/readyz">/readyz</a></p>
<table><tr><th>collector</th><th>state</th><th>last duration</th><th>series</th>
<th>last success</th><th>last error</th></tr>
{"".join(rows)}
</table></body></html>
"""
    return web.Response(text=page, content_type="text/html")


def make_app(engine: Engine) -> web.Application:
    """The aiohttp application serving `engine`."""
    app = web.Application()
    app[ENGINE] = engine
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", landing)
    return app


@dataclass
class Listener:
    """A listener's connection accounting, read by tests and the shutdown log."""

    limits: HttpLimits
    open: int = 0
    refused: int = 0
    timed_out: int = 0
    peak: int = 0


class _GuardedConnection(asyncio.Protocol):
    """Wraps aiohttp's per-connection handler with the header timeout and connection cap.

    aiohttp bounds an idle connection (its keep-alive timeout) but not a client that
    trickles a request head; this wrapper watches the bytes for the end of each head.
    """

    def __init__(self, handler: RequestHandler, listener: Listener) -> None:
        self._handler = handler
        self._listener = listener
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""  # the last bytes of an unfinished head, to find a split terminator

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        listener = self._listener
        if listener.open >= listener.limits.max_connections:
            listener.refused += 1
            transport.write(_BUSY)
            transport.close()
            return
        listener.open += 1
        listener.peak = max(listener.peak, listener.open)
        self._transport = transport
        self._handler.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return
        self._watch_heads(data)
        self._handler.data_received(data)

    def eof_received(self) -> None:
        if self._transport is not None:
            self._handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is None:
            return
        self._transport = None
        self._listener.open -= 1
        self._disarm()
        self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def _watch_heads(self, data: bytes) -> None:
        """Disarm when a head completes; arm again on the first byte of the next one."""
        while data:
            if self._timer is None:
                self._arm()
            buffer = self._tail + data
            end = buffer.find(_HEAD_END)
            if end < 0:
                self._tail = buffer[-(len(_HEAD_END) - 1) :]
                return
            self._disarm()
            data = buffer[end + len(_HEAD_END) :]

    def _arm(self) -> None:
        self._tail = b""
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._listener.limits.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self._transport is not None:
            self._listener.timed_out += 1
            self._transport.close()


@contextlib.asynccontextmanager
async def listen(
    app: web.Application, *, host: str, port: int, limits: HttpLimits
) -> AsyncIterator[Listener]:
    """Serve `app` on `host:port` under `limits` until the context exits."""
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=limits.keepalive_timeout,
        shutdown_timeout=_SHUTDOWN_GRACE_SECONDS,
    )
    await runner.setup()
    try:
        listener = Listener(limits=limits)
        handlers = runner.server  # builds one aiohttp RequestHandler per connection
        assert handlers is not None  # set by setup()
        server = await asyncio.get_running_loop().create_server(
            lambda: _GuardedConnection(handlers(), listener), host, port, reuse_address=True
        )
        try:
            yield listener
        finally:
            server.close()
    finally:
        await runner.cleanup()
