"""A listener serving a small app under a web config file, and clients for it: what the
web config tests share. The app is an aiohttp one (as the tainter serves) or the exporter's
own HTTP server, so every web config test holds for both servers."""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import bcrypt
from aiohttp import web

from fleetwatch.exporter.engine import Engine
from fleetwatch.exporter.http import make_app
from fleetwatch.listener import Listener, ListenerSettings, ServesConnections, listen
from fleetwatch.sim.loopback_servers import free_port
from fleetwatch.webguard import WebGuard

LIMITS = ListenerSettings(header_timeout=2.0, keepalive_timeout=30.0, max_connections=16)


def bcrypt_hash(password: str, *, rounds: int = 4) -> str:
    """A bcrypt hash as `htpasswd -B` writes it (cheap rounds: tests only)."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode()


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` as a Secret volume does: a new file renamed over the old one."""
    scratch = path.with_name(path.name + ".new")
    scratch.write_bytes(data)
    os.replace(scratch, path)


def client_context(
    ca: Path | None, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    """A client context trusting `ca` (anything when None), presenting `cert` when given."""
    context = ssl.create_default_context(cafile=str(ca) if ca else None)
    if ca is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


async def _hello(_: web.Request) -> web.Response:
    return web.Response(text="hello\n")


@contextlib.asynccontextmanager
async def serving(
    config: Path, *, server: str = "aiohttp", check_interval: float = 0.0
) -> AsyncIterator[tuple[str, Listener]]:
    """Serve `GET /` under `config` on a loopback port, from an aiohttp app (`server`
    "aiohttp") or the exporter's server ("exporter": its landing page); yields (base URL,
    listener)."""
    guard = WebGuard(config, check_interval=check_interval)
    app: web.Application | ServesConnections
    if server == "exporter":
        app = make_app(Engine(collectors=[], max_staleness=1, hang_timeout=5, version="test"))
    else:
        app = web.Application()
        app.router.add_get("/", _hello)
    port = free_port()
    async with listen(app, host="127.0.0.1", port=port, limits=LIMITS, web=guard) as listener:
        scheme = "https" if guard.tls else "http"
        yield f"{scheme}://127.0.0.1:{port}", listener
