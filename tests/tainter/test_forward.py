"""Handing a notification to the leader over TLS: the follower trusts exactly the
certificate the replicas serve (host name unchecked: the leader is reached by pod IP),
and a server with any other certificate gets nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from fleetwatch.sim.loopback_servers import free_port
from fleetwatch.tainter.forward import (
    FORWARDED_HEADER,
    Forwarder,
    ForwardFailed,
    PinnedServingCertificate,
    first_certificate,
)
from fleetwatch.tainter.settings import TlsFiles
from testbed.kube_apiserver import write_pki


def tls_files(folder: Path) -> TlsFiles:
    """A serving certificate for 127.0.0.1 signed by a CA of its own."""
    pki = write_pki(folder)
    return TlsFiles(cert=pki.serving_cert, key=pki.serving_key)


@asynccontextmanager
async def leader(tls: TlsFiles, seen: list[dict[str, str]]) -> AsyncIterator[str]:
    """A stand-in leader over TLS that answers 202 and records the headers it got."""

    async def alerts(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(status=202, body=await request.read(), content_type="application/json")

    app = web.Application()
    app.router.add_post("/alerts", alerts)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls.context()).start()
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_forwards_over_tls_to_the_shared_certificate_only(tmp_path: Path) -> None:
    ours = tls_files(tmp_path / "ours")
    seen: list[dict[str, str]] = []
    async with aiohttp.ClientSession() as session:
        forwarder = Forwarder(
            session=session, identity="b", timeout=5.0, tls=PinnedServingCertificate(ours)
        )
        async with leader(ours, seen) as url:
            answer = await forwarder.forward(url, body=b'{"x": 1}', authorization="Bearer t")
        assert (answer.status, answer.content_type) == (202, "application/json")
        assert answer.body == b'{"x": 1}'
        assert (seen[0]["Authorization"], seen[0][FORWARDED_HEADER]) == ("Bearer t", "b")

        other = tls_files(tmp_path / "other")  # a different key: not one of the replicas
        async with leader(other, seen) as url:
            with pytest.raises(ForwardFailed, match="certificate"):
                await forwarder.forward(url, body=b"{}", authorization="Bearer t")
        assert len(seen) == 1


def test_a_file_without_a_certificate_is_named(tmp_path: Path) -> None:
    path = tmp_path / "tls.crt"
    path.write_text("not a certificate\n")
    with pytest.raises(ValueError, match=f"{path}: no PEM certificate"):
        first_certificate(path.read_bytes(), where=str(path))
