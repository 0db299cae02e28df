"""A Prometheus API behind TLS and authentication, for the tests of its clients
(`fleetwatch.promclient`, the tainter's evidence, the report).

`write_pki` makes a temporary PKI (`testbed.pki`): a CA, a serving certificate for
127.0.0.1/localhost, one for a name only (`--prometheus.tls.server-name`), and a client
certificate. `guarded_api` serves `/api/v1/query` and `/api/v1/query_range` from a thread
over TLS, answering only requests with the expected Authorization header (and, with
`client_ca`, a client certificate), and records each query it answered.
"""

from __future__ import annotations

import base64
import contextlib
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from cryptography import x509

from testbed.pki import CLIENT_AUTH, CertificateAuthority
from testbed.tool_servers import served_in_thread

NAMED_HOST = "prometheus.fleet.internal"
"""The only name on the named serving certificate (no IP address)."""


@dataclass(frozen=True)
class Pki:
    """The files of the temporary PKI."""

    ca: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    named_cert: Path
    named_key: Path
    client_cert: Path
    client_key: Path


def reissue_server_certificate(pki: Pki) -> tuple[bytes, bytes]:
    """A new serving certificate for 127.0.0.1/localhost from the same CA, and its key (PEM):
    what cert-manager writes when it renews one."""
    return CertificateAuthority.load(pki.ca, pki.ca_key).issue("prometheus")


def write_pki(folder: Path) -> Pki:
    """A CA and the certificates it signs, written under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca=folder / "ca.crt",
        ca_key=folder / "ca.key",
        server_cert=folder / "server.crt",
        server_key=folder / "server.key",
        named_cert=folder / "named.crt",
        named_key=folder / "named.key",
        client_cert=folder / "client.crt",
        client_key=folder / "client.key",
    )
    ca = CertificateAuthority.create()
    ca.write(pki.ca, pki.ca_key)
    ca.issue_to(pki.server_cert, pki.server_key, "prometheus")
    ca.issue_to(pki.named_cert, pki.named_key, NAMED_HOST, names=[x509.DNSName(NAMED_HOST)])
    ca.issue_to(pki.client_cert, pki.client_key, "fleetwatch", usage=CLIENT_AUTH)
    return pki


def basic(username: str, password: str) -> str:
    """The Authorization header value of HTTP basic auth."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode("ascii")


def server_context(cert: Path, key: Path, *, client_ca: Path | None = None) -> ssl.SSLContext:
    """A serving context; with `client_ca`, client certificates signed by it are required."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@dataclass
class GuardedApi:
    """What the guarded API expects and what it answered."""

    url: str
    expected: Callable[[], str | None]
    queries: list[str] = field(default_factory=list)


def _vector(query: str) -> dict[str, object]:
    """An instant vector of one series that names the query it answers."""
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"query": query, "node": "gpu-1"}, "value": [1.0, "1"]}],
        },
    }


@contextlib.contextmanager
def guarded_api(
    context: ssl.SSLContext, expected: Callable[[], str | None]
) -> Iterator[GuardedApi]:
    """A Prometheus API over TLS that answers 401 unless Authorization is `expected()`
    (asked on each request, so a test can rotate the secret); a range query gets a matrix."""
    holder: list[GuardedApi] = []

    async def query(request: web.Request) -> web.Response:
        api = holder[0]
        if request.headers.get("Authorization") != api.expected():
            return web.json_response({"status": "error", "error": "unauthorized"}, status=401)
        expr = request.query.get("query", "")
        api.queries.append(expr)
        if request.path.endswith("query_range"):
            return web.json_response(
                {
                    "status": "success",
                    "data": {
                        "resultType": "matrix",
                        "result": [{"metric": {"node": "gpu-1"}, "values": [[1.0, "1"]]}],
                    },
                }
            )
        return web.json_response(_vector(expr))

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    app.router.add_get("/api/v1/query_range", query)
    with served_in_thread(app, ssl_context=context) as url:
        holder.append(GuardedApi(url=url, expected=expected))
        yield holder[0]
