"""What a web configuration file asks of a running listener, kept current: the TLS context
for the next connection, basic auth, response headers and the rate limit.

exporter-toolkit reads its file on every request and builds the TLS configuration on every
handshake, so a certificate cert-manager rotates is served to the next connection. Here the
file and the files it names are looked at (`os.stat`: a Secret's atomic swap changes the
inode) at most every `check_interval` seconds, on a new connection or request; when one
changed, all of it is read and checked again. A replacement that does not load (a missing
file, a key that does not match, a YAML error) leaves the last good configuration serving,
is logged once per change, and counts in `fleetwatch_web_config_reload_errors_total`.
Turning TLS on or off needs a restart (the listener's socket speaks one or the other) and
counts as a failed reload.

Basic auth follows exporter-toolkit's handler: bcrypt is checked once per distinct (user,
hash, password) and the answer cached (a bounded LRU; a bcrypt check costs tens of
milliseconds, so an uncached check per request would be a CPU attack), one bcrypt at a time
off the event loop; an unknown user is checked against a fixed hash so it costs what a known
one does, and both answers are the same `401` with `WWW-Authenticate: Basic`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import os
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from fleetwatch.webconfig import (
    RateLimit,
    WebConfig,
    WebConfigError,
    check_web_config,
    server_context,
)

if TYPE_CHECKING:
    from aiohttp import web
    from aiohttp.typedefs import Middleware

log = logging.getLogger(__name__)

CACHE_SIZE: Final = 100
"""Distinct credentials whose bcrypt answer is kept (exporter-toolkit keeps 100)."""

_UNKNOWN_USER_HASH: Final = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
"""A bcrypt hash checked for an unknown user, so it takes as long as a known one."""

UNAUTHORIZED: Final = "Unauthorized\n"
"""The body of a 401 (with `WWW-Authenticate: Basic`), on every server."""
TOO_MANY_REQUESTS: Final = "Too Many Requests\n"
"""The body of a 429: the rate limit refused the request."""

Signature = tuple[tuple[int, int, int] | None, ...]


def _signature(paths: tuple[Path, ...]) -> Signature:
    """What identifies the files' contents without reading them: inode, size, mtime."""
    found: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            found.append(None)
        else:
            found.append((stat.st_ino, stat.st_size, stat.st_mtime_ns))
    return tuple(found)


@dataclass
class _Bucket:
    """exporter-toolkit's token bucket: one request every `interval`, `burst` at most."""

    limit: RateLimit
    tokens: float
    at: float

    def allow(self, now: float) -> bool:
        self.tokens = min(
            float(self.limit.burst), self.tokens + (now - self.at) / self.limit.interval
        )
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class WebGuard:
    """One `--web.config.file`, checked at start (`WebConfigError` naming the key) and
    re-read when it or a file it names changes.

    `on_reload(ok)` is called after each reload attempt (the metrics count it); it may be
    set after construction, once what it reports to exists."""

    def __init__(
        self,
        path: Path,
        *,
        check_interval: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_reload: Callable[[bool], None] | None = None,
    ) -> None:
        self._path = path
        self._check_interval = check_interval
        self._clock = clock
        self.on_reload = on_reload
        self._config = check_web_config(path)
        self._context = server_context(self._config.tls) if self._config.tls else None
        self._signature = _signature(self._watched())
        self._checked_at = clock()
        self.reload_errors = 0
        self.bcrypt_checks = 0
        self.last_reload_success = time.time()
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        self._bcrypt_lock = asyncio.Lock()
        self._bucket = self._new_bucket()

    @property
    def tls(self) -> bool:
        """Whether the listener serves TLS (fixed at start)."""
        return self._context is not None

    def _watched(self) -> tuple[Path, ...]:
        files = self._config.tls.files if self._config.tls else ()
        return (self._path, *files)

    def _new_bucket(self) -> _Bucket | None:
        limit = self._config.rate_limit
        return None if limit is None else _Bucket(limit, float(limit.burst), self._clock())

    def config(self) -> WebConfig:
        """The configuration in force now (re-read first when a file changed)."""
        self._refresh()
        return self._config

    def ssl_context(self) -> ssl.SSLContext:
        """The context for the next connection (re-read first when a file changed)."""
        self._refresh()
        assert self._context is not None, "ssl_context() of a listener without TLS"
        return self._context

    def _refresh(self) -> None:
        now = self._clock()
        if now - self._checked_at < self._check_interval:
            return
        self._checked_at = now
        signature = _signature(self._watched())
        if signature == self._signature:
            return
        self._signature = signature  # a bad file is reported once, then again when it changes
        try:
            config = check_web_config(self._path)
            context = server_context(config.tls) if config.tls else None
            if (context is None) != (self._context is None):
                raise WebConfigError("turning TLS on or off needs a restart")
        except WebConfigError as exc:
            self.reload_errors += 1
            log.warning(
                "web config not reloaded, the last good one keeps serving",
                extra={"file": str(self._path), "reason": str(exc)},
            )
            self._report(ok=False)
            return
        self._config, self._context = config, context
        self._signature = _signature(self._watched())  # the files the new config names
        self._bucket = self._new_bucket()
        self._cache.clear()
        self.last_reload_success = time.time()
        log.info("web config reloaded", extra={"file": str(self._path)})
        self._report(ok=True)

    def _report(self, *, ok: bool) -> None:
        if self.on_reload is not None:
            self.on_reload(ok)

    def allow(self) -> bool:
        """Whether the rate limit lets one more request through now."""
        return self._bucket is None or self._bucket.allow(self._clock())

    async def authorized(self, authorization: str) -> bool:
        """Whether an `Authorization` header holds the password of a configured user."""
        users = self._config.users
        if not users:
            return True
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, colon, password = base64.b64decode(encoded, validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        if not colon:
            return False
        known = _find_user(users, user)
        hashed = users[known] if known is not None else _UNKNOWN_USER_HASH
        key = hashlib.sha256(b"\0".join((user, hashed, password))).digest()
        cached = self._cache.get(key)
        if cached is None:
            async with self._bcrypt_lock:  # one bcrypt at a time: bounded CPU
                self.bcrypt_checks += 1
                cached = await asyncio.to_thread(_checkpw, password, hashed)
            cached = cached and known is not None
            self._cache[key] = cached
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return cached


def _find_user(users: Mapping[str, bytes], user: bytes) -> str | None:
    """The configured user named `user`, compared in constant time with every name."""
    found = None
    for name in users:
        if hmac.compare_digest(name.encode(), user):
            found = name
    return found


def _checkpw(password: bytes, hashed: bytes) -> bool:
    import bcrypt  # loaded by the first check: a server without basic auth never needs it

    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # bcrypt refuses a password over 72 bytes: no user has one
        return False


def web_middleware(guard: WebGuard) -> Middleware:
    """The aiohttp middleware that applies `guard` to every request: rate limit (429),
    basic auth (401), then the handler (aiohttp is imported here: the exporter's own server
    applies the guard without it)."""
    from aiohttp import web

    @web.middleware
    async def guarded(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        guard.config()
        if not guard.allow():
            return web.Response(status=429, text=TOO_MANY_REQUESTS)
        if not await guard.authorized(request.headers.get("Authorization", "")):
            return web.Response(
                status=401, text=UNAUTHORIZED, headers={"WWW-Authenticate": "Basic"}
            )
        return await handler(request)

    return guarded


def add_web_headers(
    guard: WebGuard,
) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """The aiohttp `on_response_prepare` hook that sets the file's headers on every
    response."""

    async def headers(_: web.Request, response: web.StreamResponse) -> None:
        response.headers.update(guard.config().headers)

    return headers
