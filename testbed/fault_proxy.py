"""A fault-injecting HTTP proxy in front of a real server (the kube-apiserver, Prometheus).

etcd and Kubernetes test their clients against servers that fail on purpose; a real server
cannot be made to answer 429 or to cut a watch on demand, so this proxy sits between the
code under test and the real server and, per request, applies the first rule that matches:

- `Fault.delay`: wait, then forward (a slow server; past the client's deadline, a timeout);
- `Fault.reset`: reset the connection without forwarding (nothing reached the server);
- `Fault.reset_after`: forward, then reset instead of answering (the server applied the
  request, the client never hears so: the case that doubles writes in careless clients);
- `Fault.answer`: answer a status itself (429 with `Retry-After`, 500, 503) as a Kubernetes
  `Status` object, without forwarding;
- `Fault.cut_watch`: forward a watch and cut the stream after some events;
- `Fault.watch_gone`: answer a watch with the `ERROR` event of code 410 (Expired) a real
  server sends when the resourceVersion is too old, which forces the client to list again;
- `Fault.warn`: forward, then add `warnings` to the JSON answer, as Prometheus (and Thanos'
  partial responses) mark an answer built from incomplete data.

A rule matches by method and a regular expression searched in the path and query, for its
first `times` matching requests (0: every one). Every request is recorded (`seen`) with when
it arrived and what was done to it, so a test can check retries, their spacing and that a
fault happened at all. It serves from a thread of its own, over TLS when given a context (the
real server's own serving certificate keeps the clients' CA valid).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import re
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

import aiohttp
from aiohttp import web

HOP_HEADERS: Final = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "accept-encoding"}
)
"""Headers that belong to one connection, never copied across the proxy."""


@dataclass
class Fault:
    """One rule: which requests it takes and what it does to them (see the module)."""

    action: str
    method: str | None = None
    path: str = ""
    times: int = 1
    seconds: float = 0.0
    status: int = 0
    retry_after: str | None = None
    after_events: int = 0
    warning: str = ""
    taken: int = 0

    @classmethod
    def delay(cls, seconds: float, **match: object) -> Fault:
        return cls("delay", seconds=seconds, **match)  # type: ignore[arg-type]

    @classmethod
    def reset(cls, **match: object) -> Fault:
        return cls("reset", **match)  # type: ignore[arg-type]

    @classmethod
    def reset_after(cls, **match: object) -> Fault:
        return cls("reset_after", **match)  # type: ignore[arg-type]

    @classmethod
    def answer(cls, status: int, *, retry_after: str | None = None, **match: object) -> Fault:
        return cls("answer", status=status, retry_after=retry_after, **match)  # type: ignore[arg-type]

    @classmethod
    def cut_watch(cls, *, after_events: int, **match: object) -> Fault:
        return cls("cut_watch", after_events=after_events, **match)  # type: ignore[arg-type]

    @classmethod
    def warn(cls, warning: str, **match: object) -> Fault:
        return cls("warn", warning=warning, **match)  # type: ignore[arg-type]

    @classmethod
    def watch_gone(cls, **match: object) -> Fault:
        return cls("watch_gone", **match)  # type: ignore[arg-type]

    def takes(self, method: str, target: str) -> bool:
        """Whether this rule applies to the request (and has requests left to take)."""
        if self.times and self.taken >= self.times:
            return False
        if self.method is not None and self.method != method:
            return False
        return re.search(self.path, target) is not None


@dataclass(frozen=True)
class Seen:
    """One request the proxy received: when (monotonic seconds), what, and what it did."""

    at: float
    method: str
    target: str
    fault: str | None
    status: int | None = None


@dataclass
class FaultProxy:
    """The proxy's rules and record; `serve()` runs it in front of `upstream`."""

    upstream: str
    upstream_ssl: ssl.SSLContext | None = None
    _faults: list[Fault] = field(default_factory=list)
    _seen: list[Seen] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sessions: list[aiohttp.ClientSession] = field(default_factory=list)

    def add(self, *faults: Fault) -> None:
        """Add rules (the first that matches a request applies)."""
        with self._lock:
            self._faults.extend(faults)

    def clear(self) -> None:
        """Forget every rule and every request seen."""
        with self._lock:
            self._faults.clear()
            self._seen.clear()

    def seen(self, method: str | None = None, path: str = "") -> list[Seen]:
        """The requests received, in the order they arrived, optionally only those
        matching."""
        with self._lock:
            return sorted(
                (
                    s
                    for s in self._seen
                    if (method is None or s.method == method) and re.search(path, s.target)
                ),
                key=lambda s: s.at,
            )

    def _take(self, method: str, target: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.takes(method, target):
                    fault.taken += 1
                    return fault
            return None

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self._seen.append(seen)

    @contextlib.contextmanager
    def serve(self, *, ssl_context: ssl.SSLContext | None = None) -> Iterator[str]:
        """Serve on a loopback port from a thread of its own; yields the proxy's base URL.
        A handler whose client went away is cancelled (a watch being relayed to a client
        that hung up), and on exit the relays still open are given a second to end."""
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(
            self._app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        started = threading.Event()
        ports: list[int] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
            loop.run_until_complete(site.start())
            ports.append(runner.addresses[0][1])
            started.set()
            loop.run_forever()

        thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        thread.start()
        if not started.wait(10):
            raise AssertionError("the fault proxy did not start within 10s")
        try:
            yield f"{'http' if ssl_context is None else 'https'}://127.0.0.1:{ports[0]}"
        finally:
            for session in self._sessions:
                asyncio.run_coroutine_threadsafe(session.close(), loop).result(10)
            self._sessions.clear()
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()

    def _app(self) -> web.Application:
        async def handle(request: web.Request) -> web.StreamResponse:
            if not self._sessions:
                session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=self.upstream_ssl or False),
                    timeout=aiohttp.ClientTimeout(total=None),
                    auto_decompress=False,
                )
                self._sessions.append(session)
            return await self._handle(request, self._sessions[0])

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        return app

    async def _handle(
        self, request: web.Request, session: aiohttp.ClientSession
    ) -> web.StreamResponse:
        target = request.path_qs
        fault = self._take(request.method, target)
        action = None if fault is None else fault.action
        arrived = time.monotonic()
        if fault is not None and fault.action == "delay":
            # Recorded now: a client that gives up first cancels this handler.
            self._record(Seen(arrived, request.method, target, action))
            await asyncio.sleep(fault.seconds)
        if fault is not None and fault.action == "reset":
            self._record(Seen(arrived, request.method, target, action))
            return _reset(request)
        if fault is not None and fault.action == "answer":
            self._record(Seen(arrived, request.method, target, action, fault.status))
            return _status(fault.status, fault.retry_after)
        if fault is not None and fault.action == "watch_gone":
            self._record(Seen(arrived, request.method, target, action, 200))
            return await _gone(request)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        body = await request.read()
        async with session.request(
            request.method, self.upstream + target, headers=headers, data=body or None
        ) as upstream:
            if action != "delay":
                self._record(Seen(arrived, request.method, target, action, upstream.status))
            if fault is not None and fault.action == "reset_after":
                await upstream.read()
                return _reset(request)
            if fault is not None and fault.action == "warn":
                raw = await upstream.read()
                if upstream.headers.get("Content-Encoding") == "gzip":
                    raw = gzip.decompress(raw)
                answer_body = json.loads(raw)
                answer_body["warnings"] = [*answer_body.get("warnings", ()), fault.warning]
                return web.json_response(answer_body, status=upstream.status)
            answer = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS},
            )
            await answer.prepare(request)
            events = 0
            try:
                async for line in upstream.content:
                    await answer.write(line)
                    events += 1
                    cut = fault is not None and fault.action == "cut_watch"
                    if cut and fault is not None and events >= fault.after_events:
                        return _reset(request)
            except (aiohttp.ClientError, ConnectionError):
                return _reset(request)  # the upstream stream broke: so does ours
            await answer.write_eof()
            return answer


def _reset(request: web.Request) -> web.StreamResponse:
    """Reset the connection (RST, not a clean close); aiohttp then writes nothing more."""
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    return web.Response(status=499)


def _status(status: int, retry_after: str | None) -> web.Response:
    """The server's own refusal, as the kube-apiserver writes it: a `Status` object."""
    reasons = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": f"injected by the fault proxy: {status}",
        "reason": reasons.get(status, "Unknown"),
        "code": status,
    }
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return web.json_response(body, status=status, headers=headers)


async def _gone(request: web.Request) -> web.StreamResponse:
    """A watch answered as a real server answers one from a compacted resourceVersion."""
    answer = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    await answer.prepare(request)
    event = {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": "too old resource version: injected by the fault proxy",
            "reason": "Expired",
            "code": 410,
        },
    }
    await answer.write(json.dumps(event).encode() + b"\n")
    await answer.write_eof()
    return answer
