"""The exporter's HTTP surface: /metrics, /healthz, /readyz and a landing page.

Handlers only hand out what the engine already rendered; nothing here touches hardware
or blocks, so a hung collector never slows a scrape.
"""

from __future__ import annotations

import html
import time

from aiohttp import web
from fleetwatch.exporter.engine import Engine

from fleetwatch import __version__

ENGINE = web.AppKey("engine", Engine)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def metrics(request: web.Request) -> web.Response:
    """The latest snapshot; gzip when the scraper accepts it (Prometheus does)."""
    engine = request.app[ENGINE]
    headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("Accept-Encoding", ""):
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
