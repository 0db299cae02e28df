"""The exporter's HTTP surface: /metrics, /healthz, /readyz and a landing page, served by a
small HTTP/1.1 server of its own on asyncio.

Handlers only hand out what the engine already rendered; nothing here touches hardware
or blocks, so a hung collector never slows a scrape. The server speaks what scrapers and
probes need and no more: GET and HEAD, keep-alive (HTTP/1.1's default; HTTP/1.0 on
request), pipelined requests answered in order, gzip when asked. Anything else gets a
plain answer: 404 for another path, 405 for another method, 400 for a malformed head or a
request body it does not read, 414 and 431 for a request line or head past its bounds,
505 for another HTTP version. aiohttp's server did this before and cost the process about
15 MiB of imports (docs/performance.md); the tainter keeps aiohttp (it is a client too).

It runs behind `fleetwatch.listener` like the tainter's app: the connection cap, the
header timeout and TLS with the web configuration's context of the moment come from there.
Each request passes the web configuration's rate limit (429) and basic auth (401) before
it is routed, and every response gets the file's headers, as the listener's aiohttp
middleware does for the tainter. An idle kept-alive connection is closed after
`--web.keepalive-timeout`; a client that stops reading stops being read
(`pause_writing`), so pipelined requests cannot pile answers up in memory.
"""

from __future__ import annotations

import asyncio
import html
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from fleetwatch import __version__
from fleetwatch.exporter.engine import Engine
from fleetwatch.listener import Listener
from fleetwatch.webguard import TOO_MANY_REQUESTS, UNAUTHORIZED, WebGuard

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_REQUEST_LINE: Final = 8190
"""Longest request line (aiohttp's and Go's net/http's order of size)."""
MAX_HEAD: Final = 16384
"""Longest request head, request line and headers together."""
_TEXT: Final = "text/plain; charset=utf-8"
WRITE_BYTES: Final = 65536
"""About how many bytes of a response each transport write takes."""
_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    414: "URI Too Long",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


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


@dataclass(frozen=True)
class Request:
    """One parsed request head: method, path (without the query), lower-cased headers."""

    method: str
    path: str
    headers: dict[str, str]
    keep_alive: bool


@dataclass(frozen=True)
class Response:
    """What a handler answers; `Server` adds the framing and the web config's headers."""

    status: int
    body: bytes | tuple[bytes, ...]  # parts, written in order (the exposition's)
    content_type: str = _TEXT
    headers: tuple[tuple[str, str], ...] = ()


def _text(status: int, text: str) -> Response:
    return Response(status, text.encode())


class BadRequest(Exception):
    """A request head the server will not answer normally; the connection closes after."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def parse_head(head: bytes) -> Request:
    """A request head (without its blank line) as a `Request`, or `BadRequest`."""
    line, _, rest = head.partition(b"\r\n")
    if len(line) > MAX_REQUEST_LINE:
        raise BadRequest(414, "request line too long")
    try:
        method, target, version = line.decode("ascii").split(" ")
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(400, "malformed request line") from exc
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        status = 505 if version.startswith("HTTP/") else 400
        raise BadRequest(status, f"unsupported version {version[:20]!r}")
    if not method.isalpha() or not target.startswith("/"):
        raise BadRequest(400, "malformed request line")
    headers: dict[str, str] = {}
    for field in rest.split(b"\r\n") if rest else ():
        name, colon, value = field.partition(b":")
        if not colon or not name or name != name.strip() or field[:1] in b" \t":
            raise BadRequest(400, "malformed header field")
        key = name.decode("latin-1").lower()
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
    return Request(method, target.partition("?")[0], headers, keep_alive)


def _body_length(request: Request) -> int:
    """Bytes of body to skip after the head: a GET body is read and dropped, never used."""
    if "transfer-encoding" in request.headers:
        raise BadRequest(400, "request bodies must have a Content-Length")
    length = request.headers.get("content-length", "0")
    if not length.isdigit():
        raise BadRequest(400, "malformed Content-Length")
    return int(length)


Handler = Callable[[Engine, Request], Response]


def metrics(engine: Engine, request: Request) -> Response:
    """The latest snapshot; gzip when the scraper accepts it (Prometheus does)."""
    if accepts_gzip(request.headers.get("accept-encoding", "")):
        return Response(
            200,
            engine.exposition_gzip(),
            CONTENT_TYPE,
            (("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")),
        )
    return Response(200, engine.exposition_parts(), CONTENT_TYPE, (("Vary", "Accept-Encoding"),))


def healthz(engine: Engine, _: Request) -> Response:
    """Liveness: fails while a collector has been blocked past the hang timeout."""
    hung = engine.hung()
    if hung:
        detail = ", ".join(f"{name} blocked for {seconds:.0f}s" for name, seconds in hung)
        return _text(503, f"unhealthy: {detail}\n")
    return _text(200, "ok\n")


def readyz(engine: Engine, _: Request) -> Response:
    """Readiness: after every collector finished its first run."""
    if engine.ready:
        return _text(200, "ready\n")
    return _text(503, "not ready: first collection cycle in progress\n")


def landing(engine: Engine, _: Request) -> Response:
    """A small page: version, each collector's state, last duration and error."""
    now = time.monotonic()  # the engine's clock: a step of the wall clock changes no age
    rows = []
    for state in engine.states:
        age = f"{now - state.body_time:.0f}s ago" if state.body_time is not None else "never"
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
    return Response(200, page.encode(), "text/html; charset=utf-8")


ROUTES: Final[dict[str, Handler]] = {
    "/metrics": metrics,
    "/healthz": healthz,
    "/readyz": readyz,
    "/": landing,
}


class Server:
    """The exporter's HTTP server for `fleetwatch.listener.listen`: one `_Connection`
    protocol per connection, all closed at shutdown."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._connections: set[_Connection] = set()

    def protocol(self, listener: Listener) -> asyncio.Protocol:
        """The protocol of one new connection (the listener wraps it in its guard)."""
        return _Connection(self, listener)

    async def close(self) -> None:
        """Close every open connection; an answer already written is sent first."""
        for connection in list(self._connections):
            connection.close()

    def answer(self, request: Request) -> Response:
        """The routed answer to an admitted request."""
        handler = ROUTES.get(request.path)
        if handler is None:
            return _text(404, "404: Not Found\n")
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"405: Method Not Allowed\n", headers=(("Allow", "GET, HEAD"),))
        return handler(self.engine, request)

    def frame(
        self, request: Request | None, response: Response, guard: WebGuard | None
    ) -> Iterator[bytes]:
        """The response's bytes in writes: status line, headers (the web config's last),
        body."""
        keep_alive = request is not None and request.keep_alive
        parts = (response.body,) if isinstance(response.body, bytes) else response.body
        lines = [
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, '')}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {sum(map(len, parts))}",
            f"Connection: {'keep-alive' if keep_alive else 'close'}",
        ]
        lines += [f"{name}: {value}" for name, value in response.headers]
        if guard is not None:
            lines += [f"{name}: {value}" for name, value in guard.config().headers.items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if request is not None and request.method == "HEAD":
            return iter((head,))
        return _writes(head, parts)


def _writes(head: bytes, parts: tuple[bytes, ...]) -> Iterator[bytes]:
    """`head` and `parts` as writes of about `WRITE_BYTES`: small parts (a family's header,
    a small body) joined so a scrape costs a few socket writes, a large part written as it
    is, so no copy of the whole text is made."""
    pending, size = [head], len(head)
    for part in parts:
        if size + len(part) > WRITE_BYTES and size:
            yield b"".join(pending)
            pending, size = [], 0
        if len(part) >= WRITE_BYTES:
            yield part
            continue
        pending.append(part)
        size += len(part)
    if pending:
        yield b"".join(pending)


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed from a buffer and answered in order."""

    def __init__(self, server: Server, listener: Listener) -> None:
        self._server = server
        self._listener = listener
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._skip = 0  # body bytes of the last request still to drop
        self._idle: asyncio.TimerHandle | None = None
        self._pending: asyncio.Task[None] | None = None  # a basic-auth check in progress
        self._paused = False
        self._closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._server._connections.add(self)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._disarm_idle()
        if self._pending is not None:
            self._pending.cancel()
        self._server._connections.discard(self)

    def close(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def pause_writing(self) -> None:
        self._paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self._transport is not None and not self._closing:
            self._transport.resume_reading()
            self._serve()

    def data_received(self, data: bytes) -> None:
        self._disarm_idle()
        self._buffer += data
        self._serve()

    def eof_received(self) -> bool | None:
        return False  # the client will send nothing more: close once answered

    def _arm_idle(self) -> None:
        self._disarm_idle()  # one timer at a time: a second would close a busy connection
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(self._listener.limits.keepalive_timeout, self.close)

    def _disarm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _serve(self) -> None:
        """Answer every complete request in the buffer, in order, until one must wait."""
        while not (self._closing or self._paused or self._pending is not None):
            if self._skip:
                dropped = min(self._skip, len(self._buffer))
                del self._buffer[:dropped]
                self._skip -= dropped
                if self._skip:
                    return
            end = self._buffer.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
            if end < 0:
                if len(self._buffer) > MAX_HEAD:
                    self._refuse(BadRequest(431, "request head too large"))
                elif not self._buffer:
                    self._arm_idle()
                return
            head = bytes(self._buffer[:end])
            del self._buffer[: end + 4]
            try:
                request = parse_head(head)
                self._skip = _body_length(request)
            except BadRequest as exc:
                self._refuse(exc)
                return
            self._admit(request)

    def _admit(self, request: Request) -> None:
        """Rate limit and basic auth, then the answer; a bcrypt check waits off the loop."""
        guard = self._listener.web
        if guard is None:
            self._send(request, self._server.answer(request))
            return
        guard.config()  # re-read the file first when it changed
        if not guard.allow():
            self._send(request, _text(429, TOO_MANY_REQUESTS))
            return
        if not guard.config().users:
            self._send(request, self._server.answer(request))
            return
        self._pending = asyncio.get_running_loop().create_task(self._authorize(guard, request))

    async def _authorize(self, guard: WebGuard, request: Request) -> None:
        allowed = await guard.authorized(request.headers.get("authorization", ""))
        self._pending = None
        if self._closing:
            return
        if allowed:
            self._send(request, self._server.answer(request))
        else:
            unauthorized = Response(
                401, UNAUTHORIZED.encode(), headers=(("WWW-Authenticate", "Basic"),)
            )
            self._send(request, unauthorized)
        self._serve()

    def _send(self, request: Request, response: Response) -> None:
        assert self._transport is not None
        for data in self._server.frame(request, response, self._listener.web):
            self._transport.write(data)
        if not request.keep_alive:
            self.close()

    def _refuse(self, error: BadRequest) -> None:
        """Answer a request the server cannot read and close: the stream is out of step."""
        log.debug("bad request", extra={"status": error.status, "reason": str(error)})
        assert self._transport is not None
        response = _text(error.status, f"{error}\n")
        for data in self._server.frame(None, response, self._listener.web):
            self._transport.write(data)
        self.close()


def make_app(engine: Engine) -> Server:
    """The exporter's HTTP server for `engine`."""
    return Server(engine)
