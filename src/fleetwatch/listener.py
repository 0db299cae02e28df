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

The app is either an aiohttp application (the tainter's; aiohttp is imported only then) or
a `ServesConnections`, a server that makes its own protocol per connection (the exporter's,
`fleetwatch.exporter.http`), so a process serving the latter never loads aiohttp.

With a web configuration file (`--web.config.file`, `fleetwatch.webguard`), each new
connection starts TLS (`loop.start_tls`, within `header_timeout`) with the context the file
asks for at that moment, so a rotated certificate is served to the next connection while
those open keep theirs; a client certificate without an allowed SAN is closed after the
handshake; every request passes the file's rate limit and basic auth, and every response
gets its headers.

`ListenerSettings` declares those limits and the file as the `--web.*` flags of both servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

from fleetwatch.flags import duration_setting, number_setting, readable_file, setting
from fleetwatch.webguard import WebGuard, add_web_headers, web_middleware

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

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
    config_file: Path | None = setting(
        None,
        parse=readable_file,
        metavar="FILE",
        flag="{prefix}.config.file",
        help="exporter-toolkit's web configuration file: TLS, mutual TLS, basic auth, "
        "response headers (docs/operations.md)",
    )


@dataclass
class Listener:
    """A listener's limits and connection accounting (read by tests, logs and metrics).

    `on_refused(why)` is called for each connection closed by the guard: `too_many` or
    `header_timeout`.
    """

    limits: ListenerSettings
    on_refused: Callable[[str], None] | None = None
    web: WebGuard | None = None
    handshakes: set[asyncio.Task[None]] = field(default_factory=set)
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
    """Forwards everything to the app's protocol; watches request heads on the way."""

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
        if not self._peer_allowed(transport):
            transport.close()
            return
        self._admitted = True
        listener.open += 1
        listener.peak = max(listener.peak, listener.open)
        self._arm()
        self._inner.connection_made(transport)

    def _peer_allowed(self, transport: asyncio.Transport) -> bool:
        """Whether the client certificate carries a SAN of `client_allowed_sans`."""
        web = self._listener.web
        tls = web.config().tls if web is not None else None
        if tls is None or tls.client_allowed_sans is None:
            return True
        if tls.client_san_allowed(transport.get_extra_info("peercert") or {}):
            return True
        log.info(
            "client certificate refused: no SAN of client_allowed_sans",
            extra={"peer": str(transport.get_extra_info("peername"))},
        )
        return False

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


class _AfterHandshake(asyncio.Protocol):
    """The app side of `loop.start_tls`, which hands over no `connection_made`: what the
    TLS layer decrypts before the handshake task resumes (a request sent in the same flight
    as the client's Finished) is kept until `begin` gives the guarded protocol its
    transport."""

    def __init__(self, inner: asyncio.Protocol) -> None:
        self._inner = inner
        self._early: list[bytes] = []
        self._eof = False
        self._begun = False
        self._lost = False

    def begin(self, transport: asyncio.Transport) -> None:
        if self._lost:
            return
        self._begun = True
        self._inner.connection_made(transport)
        for data in self._early:
            self._inner.data_received(data)
        self._early.clear()
        if self._eof:
            self._inner.eof_received()

    def data_received(self, data: bytes) -> None:
        if self._begun:
            self._inner.data_received(data)
        else:
            self._early.append(data)

    def eof_received(self) -> bool | None:
        if self._begun:
            return self._inner.eof_received()
        self._eof = True
        return None

    def pause_writing(self) -> None:
        if self._begun:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._begun:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._begun:
            self._inner.connection_lost(exc)


class _StartTls(asyncio.Protocol):
    """Takes a plain connection and starts TLS on it with the web config's context of the
    moment; the guarded aiohttp protocol gets the connection once the handshake is done."""

    def __init__(self, inner: Callable[[], asyncio.Protocol], listener: Listener) -> None:
        self._inner = inner
        self._listener = listener

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # the ClientHello waits for the TLS protocol
        task = asyncio.get_running_loop().create_task(self._handshake(transport))
        self._listener.handshakes.add(task)
        task.add_done_callback(self._listener.handshakes.discard)

    async def _handshake(self, transport: asyncio.Transport) -> None:
        web = self._listener.web
        assert web is not None
        app = _AfterHandshake(self._inner())
        try:
            tls = await asyncio.get_running_loop().start_tls(
                transport,
                app,
                web.ssl_context(),
                server_side=True,
                ssl_handshake_timeout=self._listener.limits.header_timeout,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            log.debug("TLS handshake failed", extra={"reason": f"{type(exc).__name__}: {exc}"})
            transport.close()
            return
        if tls is not None:
            app.begin(tls)


@runtime_checkable
class ServesConnections(Protocol):
    """A server that makes its own asyncio protocol for each connection (the exporter's):
    the listener wraps each in its guard and TLS, and calls `close` when it stops."""

    def protocol(self, listener: Listener) -> asyncio.Protocol:
        """The protocol of one new connection, served under `listener`'s limits."""
        ...

    async def close(self) -> None:
        """Close the connections still open."""
        ...


async def _create_server(
    inner: Callable[[], asyncio.Protocol],
    *,
    host: str,
    port: int,
    listener: Listener,
    ssl_context: ssl.SSLContext | None,
) -> asyncio.Server:
    """Listen on HOST:PORT; each connection gets `inner()` behind the guard (and TLS)."""
    guard = listener.web

    def guarded() -> asyncio.Protocol:
        return _Guarded(inner(), listener)

    def accept() -> asyncio.Protocol:
        return _StartTls(guarded, listener) if guard is not None and guard.tls else guarded()

    return await asyncio.get_running_loop().create_server(
        accept, host, port, ssl=ssl_context, reuse_address=True
    )


async def start_listener(
    app: web.Application,
    *,
    host: str,
    port: int,
    listener: Listener,
    ssl_context: ssl.SSLContext | None = None,
    shutdown_timeout: float = 60.0,
) -> tuple[web.AppRunner, asyncio.Server]:
    """Serve the aiohttp `app` on HOST:PORT behind the guard, and behind `listener.web` when
    set (TLS then comes from it, not from `ssl_context`). Stop with `server.close()` and then
    `runner.cleanup()` (which also runs the app's cleanup)."""
    from aiohttp import web

    guard = listener.web
    if guard is not None:
        assert ssl_context is None, "TLS comes from the web config file"
        app.middlewares.append(web_middleware(guard))
        app.on_response_prepare.append(add_web_headers(guard))
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
        server = await _create_server(
            handlers, host=host, port=port, listener=listener, ssl_context=ssl_context
        )
    except BaseException:
        await runner.cleanup()
        raise
    return runner, server


@contextlib.asynccontextmanager
async def listen(
    app: web.Application | ServesConnections,
    *,
    host: str,
    port: int,
    limits: ListenerSettings,
    web: WebGuard | None = None,
    shutdown_timeout: float = 60.0,
) -> AsyncIterator[Listener]:
    """Serve `app` on `host:port` under `limits` (and `web`'s file) until the context exits.

    At exit an aiohttp app's connections get `shutdown_timeout` to finish; a
    `ServesConnections` answers from memory, so its connections are closed at once (an
    answer already written is sent first)."""
    listener = Listener(limits=limits, web=web)
    if isinstance(app, ServesConnections):
        server = await _create_server(
            lambda: app.protocol(listener),
            host=host,
            port=port,
            listener=listener,
            ssl_context=None,
        )
        try:
            yield listener
        finally:
            server.close()
            await app.close()
        return
    runner, server = await start_listener(
        app, host=host, port=port, listener=listener, shutdown_timeout=shutdown_timeout
    )
    try:
        yield listener
    finally:
        server.close()
        await runner.cleanup()
