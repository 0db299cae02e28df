"""A follower hands the notifications it receives to the leader.

Alertmanager sends a notification to whichever replica the Service picks. The leader
applies it; a follower posts the same body, with the same bearer token, to the URL the
leader publishes on the Lease (`tainter.election`) and answers Alertmanager with the
leader's status and body. The forwarded request carries `X-Fleetwatch-Forwarded-By`, and
a replica that is not the leader answers such a request 503 instead of forwarding it
again, so a notification is handed over at most once and never loops between replicas
whose views of the Lease disagree for a moment.

Over TLS the follower trusts exactly the certificate the replicas serve (the first
certificate of `--web.tls.cert-file`, which every replica mounts from the same Secret): the
leader is reached by its pod IP, which a certificate issued for the Service's name does not
carry, so the host name is not checked; what proves the leader is holding that
certificate's key. Both the certificate this process loaded at start and the one in the
file now are trusted, so a rotated Secret works while replicas restarted before and after
it serve different ones. With `--web.tls.client-ca-file` (mTLS) the follower presents its
own serving certificate as its client certificate.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from typing import Final

import aiohttp

from fleetwatch.tainter.settings import TlsFiles

FORWARDED_HEADER: Final = "X-Fleetwatch-Forwarded-By"
_PEM_CERTIFICATE: Final = re.compile(
    rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.S
)


class ForwardFailed(Exception):
    """No answer from the leader in time (refused, reset, TLS failure or timeout)."""


@dataclass(frozen=True, slots=True)
class LeaderAnswer:
    """What the leader answered: relayed to Alertmanager as it is."""

    status: int
    body: bytes
    content_type: str


def first_certificate(pem: bytes, *, where: str) -> str:
    """The first PEM certificate in `pem`; ValueError naming `where` when there is none."""
    found = _PEM_CERTIFICATE.search(pem)
    if found is None:
        raise ValueError(f"{where}: no PEM certificate in it")
    return found.group(0).decode("ascii")


class PinnedServingCertificate:
    """Client TLS for forwards: trusts only the replicas' serving certificate (see the
    module's docstring). The context is rebuilt when the certificate file changes."""

    def __init__(self, tls: TlsFiles) -> None:
        self._tls = tls
        self._served = first_certificate(tls.cert.read_bytes(), where=str(tls.cert))
        self._current = self._served
        self._context = self._build()

    def _build(self) -> ssl.SSLContext:
        pinned = {self._served, self._current}
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata="\n".join(pinned))
        context.check_hostname = False  # a pod IP is not in the certificate; the key proves it
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the leaf itself is the anchor
        if self._tls.client_ca is not None:
            context.load_cert_chain(self._tls.cert, self._tls.key)
        return context

    def context(self) -> ssl.SSLContext:
        """The context for the next forward."""
        try:
            current = first_certificate(self._tls.cert.read_bytes(), where=str(self._tls.cert))
        except (OSError, ValueError):
            return self._context  # mid-swap: keep what we trust
        if current != self._current:
            self._current = current
            self._context = self._build()
        return self._context


class Forwarder:
    """Posts a notification to the leader and returns its answer, within `timeout`."""

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        identity: str,
        timeout: float,
        tls: PinnedServingCertificate | None = None,
    ) -> None:
        self._session = session
        self._identity = identity
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._tls = tls

    async def forward(self, base_url: str, *, body: bytes, authorization: str) -> LeaderAnswer:
        """POST `body` to `base_url`/alerts as Alertmanager sent it to us; ForwardFailed
        when the leader cannot be reached or does not answer in time."""
        headers = {"Content-Type": "application/json", FORWARDED_HEADER: self._identity}
        if authorization:
            headers["Authorization"] = authorization
        ssl_context: ssl.SSLContext | bool = True
        if self._tls is not None and base_url.startswith("https:"):
            ssl_context = self._tls.context()
        try:
            async with self._session.post(
                f"{base_url}/alerts",
                data=body,
                headers=headers,
                timeout=self._timeout,
                ssl=ssl_context,
                allow_redirects=False,
            ) as response:
                return LeaderAnswer(
                    status=response.status,
                    body=await response.read(),
                    content_type=response.content_type,
                )
        except (aiohttp.ClientError, TimeoutError, ssl.SSLError) as exc:
            raise ForwardFailed(f"{type(exc).__name__}: {exc}") from exc
