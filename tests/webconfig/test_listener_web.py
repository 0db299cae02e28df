"""The listener under a web config file: TLS, mutual TLS, client SANs, basic auth, headers,
the rate limit, and certificates rotated on disk. A real listener on a loopback socket,
serving an aiohttp app (the tainter's kind) and the exporter's own server, aiohttp clients."""

from __future__ import annotations

import asyncio
import base64
import shutil
import ssl
from pathlib import Path

import aiohttp
import pytest

from tests.promtls import write_pki
from tests.webconfig.serving import bcrypt_hash, client_context, serving, write_atomically

pytestmark = pytest.mark.timeout(60)

TOOLKIT = Path(__file__).parent / "toolkit"


@pytest.fixture(params=["aiohttp", "exporter"])
def server(request: pytest.FixtureRequest) -> str:
    """Which server the listener serves: the tainter's kind (aiohttp) or the exporter's."""
    return str(request.param)


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


async def get(
    url: str, context: ssl.SSLContext | bool = False, headers: dict[str, str] | None = None
) -> aiohttp.ClientResponse:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, ssl=context, headers=headers) as response,
    ):
        await response.read()
        return response


def tls_config(tmp: Path) -> Path:
    pki = write_pki(tmp / "pki")
    config = tmp / "web.yml"
    config.write_text(
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
    )
    return config


async def test_tls_serves_https_and_refuses_plain_http(tmp_path: Path, server: str) -> None:
    config = tls_config(tmp_path)
    async with serving(config, server=server) as (url, _):
        response = await get(url + "/", client_context(tmp_path / "pki" / "ca.crt"))
        assert response.status == 200
        with pytest.raises(aiohttp.ClientError):
            await get(url.replace("https:", "http:") + "/")


async def test_mutual_tls_refuses_a_client_without_certificate(tmp_path: Path, server: str) -> None:
    pki = write_pki(tmp_path / "pki")
    config = tmp_path / "web.yml"
    config.write_text(
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki.ca}\n"
    )
    async with serving(config, server=server) as (url, _):
        with pytest.raises(aiohttp.ClientError):
            await get(url + "/", client_context(pki.ca))
        presented = client_context(pki.ca, pki.client_cert, pki.client_key)
        assert (await get(url + "/", presented)).status == 200


@pytest.mark.parametrize(
    ("name", "admitted"),
    [
        ("web_config_auth_client_san.good.yaml", True),
        ("web_config_auth_client_san.bad.yaml", False),
    ],
)
async def test_client_allowed_sans_as_exporter_toolkit(
    tmp_path: Path, name: str, admitted: bool, server: str
) -> None:
    # exporter-toolkit's own files and certificates: client2 carries the SAN DNS:test3.
    client = client_context(
        None, TOOLKIT / "client2_selfsigned.pem", TOOLKIT / "client2_selfsigned.key"
    )
    async with serving(TOOLKIT / name, server=server) as (url, _):
        if admitted:
            assert (await get(url + "/", client)).status == 200
        else:
            with pytest.raises(aiohttp.ClientError):
                await get(url + "/", client)


async def test_basic_auth_same_answer_for_unknown_user_and_wrong_password(
    tmp_path: Path, server: str
) -> None:
    config = tmp_path / "web.yml"
    config.write_text(
        f"basic_auth_users:\n  prometheus: {bcrypt_hash('s3cret')}\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    )
    async with serving(config, server=server) as (url, listener):
        answers = []
        for headers in ({}, basic("prometheus", "wrong"), basic("nobody", "s3cret")):
            response = await get(url + "/", headers=headers)
            answers.append((response.status, response.headers.get("WWW-Authenticate")))
            assert response.headers["X-Frame-Options"] == "deny"
        assert answers == [(401, "Basic")] * 3
        for _ in range(5):
            response = await get(url + "/", headers=basic("prometheus", "s3cret"))
            assert response.status == 200
            assert response.headers["X-Frame-Options"] == "deny"
        assert listener.web is not None
        # wrong, unknown, then the right password once: the repeats came from the cache
        assert listener.web.bcrypt_checks == 3


async def test_rate_limit_as_exporter_toolkit(server: str) -> None:
    async with serving(TOOLKIT / "web_config_rate_limiter_one_second.yaml", server=server) as (
        url,
        _,
    ):
        assert (await get(url + "/")).status == 429


async def test_rotated_certificate_served_to_the_next_connection(
    tmp_path: Path, server: str
) -> None:
    config = tls_config(tmp_path)
    old, new = tmp_path / "pki", write_pki(tmp_path / "rotated")
    trusts_old = client_context(old / "ca.crt")  # one object: aiohttp pools by context
    async with serving(config, server=server) as (url, listener), aiohttp.ClientSession() as kept:
        async with kept.get(url + "/", ssl=trusts_old) as response:
            assert response.status == 200
        write_atomically(old / "server.crt", new.server_cert.read_bytes())
        write_atomically(old / "server.key", new.server_key.read_bytes())
        response = await get(url + "/", client_context(new.ca))
        assert response.status == 200
        with pytest.raises(aiohttp.ClientError):
            await get(url + "/", client_context(old / "ca.crt"))
        # the connection opened before the rotation keeps its certificate and is reused
        async with kept.get(url + "/", ssl=trusts_old) as response:
            assert response.status == 200
        assert listener.web is not None
        assert listener.web.reload_errors == 0


async def test_a_bad_replacement_keeps_the_last_good_certificate(
    tmp_path: Path, server: str
) -> None:
    config = tls_config(tmp_path)
    ca = tmp_path / "pki" / "ca.crt"
    async with serving(config, server=server) as (url, listener):
        assert listener.web is not None
        before = listener.web.last_reload_success
        write_atomically(tmp_path / "pki" / "server.key", b"not a key\n")
        assert (await get(url + "/", client_context(ca))).status == 200
        assert listener.web.reload_errors == 1
        (tmp_path / "pki" / "server.crt").unlink()
        assert (await get(url + "/", client_context(ca))).status == 200
        assert listener.web.reload_errors == 2
        assert listener.web.last_reload_success == before


async def test_the_config_file_itself_reloads(tmp_path: Path, server: str) -> None:
    config = tmp_path / "web.yml"
    shutil.copy(TOOLKIT / "web_config_empty.yml", config)
    async with serving(config, server=server) as (url, listener):
        assert (await get(url + "/")).status == 200
        write_atomically(config, f"basic_auth_users:\n  p: {bcrypt_hash('x')}\n".encode())
        assert (await get(url + "/")).status == 401
        write_atomically(config, b"tls_server_config: {}\nnot_a_key: 1\n")
        assert (await get(url + "/", headers=basic("p", "x"))).status == 200
        assert listener.web is not None
        assert listener.web.reload_errors == 1


async def test_a_stalled_handshake_is_closed_within_the_header_timeout(
    tmp_path: Path, server: str
) -> None:
    config = tls_config(tmp_path)
    async with serving(config, server=server) as (url, listener):
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        async with asyncio.timeout(30):
            while not listener.handshakes:  # accepted, waiting for a ClientHello never sent
                await asyncio.sleep(0.01)
            assert await reader.read() == b""
        writer.close()
