"""The exporter's HTTP surface: /metrics, /healthz, /readyz and a landing page.

Handlers only hand out what the engine already rendered; nothing here touches hardware
or blocks, so a hung collector never slows a scrape.

The app is served behind `fleetwatch.listener` (header and keep-alive timeouts, a
connection cap), with a short shutdown grace: handlers answer from memory, so a
connection still busy after it is a client not reading its response.
"""

from __future__ import annotations

import html
import logging
import time

from aiohttp import web

from fleetwatch import __version__
from fleetwatch.exporter.engine import Engine

log = logging.getLogger(__name__)

ENGINE = web.AppKey("engine", Engine)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SHUTDOWN_GRACE_SECONDS = 2.0


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
