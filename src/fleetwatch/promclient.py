"""The one option group of a client of Prometheus' HTTP API: its URL and credentials.

The tainter (`fleetwatch taint`), the report (`fleetwatch report`) and the Slurm health check
(`fleetwatch slurm healthcheck`) read Prometheus, or a store that answers its API (Thanos,
Mimir, VictoriaMetrics), and a production one sits behind TLS and authentication. They share
these flags, named as Prometheus names the same fields of its own `http_config`:
`--prometheus.url`, `--prometheus.bearer-token-file`, `--prometheus.basic-auth.username` and
`.password-file`, `--prometheus.tls.ca-file`, `.cert-file`, `.key-file` and `.server-name`.

An option that cannot be honoured is refused at start, naming the flag (`problem`): a bearer
token beside basic auth, a certificate without its key, TLS options for an `http://` URL,
credentials without a URL, a file that is not a certificate. As Prometheus does, the token
and password files are read again for every request (a rotated token is used at once) and
the TLS files are loaded again when one of them changes (`PrometheusAccess`). The async
clients (tainter, report) pass `PrometheusAccess.ssl_context()` and `.headers()` to aiohttp;
the health check, which must not pay for aiohttp's import, calls `instant_query`, the
standard library's urllib underneath.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from fleetwatch.flags import Flags, http_url, readable_file, setting

# ssl and urllib are imported where a client is built: `fleetwatch slurm` declares these
# flags, and its prolog, which runs for every job, must not pay for them.
if TYPE_CHECKING:
    import ssl

PREFIX: Final = "prometheus"


@dataclass(frozen=True, kw_only=True)
class PrometheusClientSettings:
    """Where Prometheus' HTTP API is and how a client proves who it is (`--prometheus.*`).

    At most one of bearer token and basic auth; a client certificate needs its key. Every
    file is checked readable when the flags are parsed."""

    url: str | None = setting(
        None,
        parse=http_url,
        metavar="URL",
        deprecated=("prometheus-url",),
        help="base URL of Prometheus' HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics)",
    )
    bearer_token_file: Path | None = setting(
        None,
        parse=readable_file,
        metavar="FILE",
        help="file holding a bearer token sent with every request (read again each request)",
    )
    basic_auth_username: str | None = setting(
        None,
        metavar="NAME",
        flag="{prefix}.basic-auth.username",
        help="basic auth user name (with --prometheus.basic-auth.password-file)",
    )
    basic_auth_password_file: Path | None = setting(
        None,
        parse=readable_file,
        metavar="FILE",
        flag="{prefix}.basic-auth.password-file",
        help="file holding the basic auth password (read again each request)",
    )
    tls_ca_file: Path | None = setting(
        None,
        parse=readable_file,
        metavar="FILE",
        flag="{prefix}.tls.ca-file",
        help="CA certificates (PEM) that verify the server (default: the system's)",
    )
    tls_cert_file: Path | None = setting(
        None,
        parse=readable_file,
        metavar="FILE",
        flag="{prefix}.tls.cert-file",
        help="client certificate (PEM) for mutual TLS, with --prometheus.tls.key-file",
    )
    tls_key_file: Path | None = setting(
        None,
        parse=readable_file,
        metavar="FILE",
        flag="{prefix}.tls.key-file",
        help="the client certificate's key (PEM)",
    )
    tls_server_name: str | None = setting(
        None,
        metavar="NAME",
        flag="{prefix}.tls.server-name",
        help="name the server's certificate must carry, sent as SNI (default: the URL's host)",
    )

    @property
    def uses_tls_options(self) -> bool:
        """Whether any `--prometheus.tls.*` flag is given."""
        return any(
            value is not None for value in (self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        ) or bool(self.tls_server_name)

    @property
    def uses_credentials(self) -> bool:
        """Whether a bearer token or basic auth is given."""
        return (
            self.bearer_token_file is not None
            or self.basic_auth_username is not None
            or self.basic_auth_password_file is not None
        )

    def problem(self) -> str | None:
        """Why these options cannot be honoured, one line naming the flag, or None.

        The TLS files are loaded here, so a file that is not a certificate or a key that
        does not match is refused at start rather than at the first query."""
        import ssl

        given = f"--{PREFIX}"
        if self.url is None:
            if self.uses_credentials or self.uses_tls_options:
                return f"{given}.url is needed by the other {given}.* flags given"
            return None
        if self.bearer_token_file is not None and (
            self.basic_auth_username is not None or self.basic_auth_password_file is not None
        ):
            return (
                f"{given}.bearer-token-file and {given}.basic-auth.* exclude each other: "
                "give one way to authenticate"
            )
        if (self.basic_auth_username is None) != (self.basic_auth_password_file is None):
            return f"{given}.basic-auth.username and {given}.basic-auth.password-file go together"
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            return f"{given}.tls.cert-file and {given}.tls.key-file go together"
        if self.uses_tls_options and not self.url.startswith("https://"):
            return f"{given}.tls.* needs an https:// {given}.url (got {self.url})"
        for name, path in (
            ("bearer-token-file", self.bearer_token_file),
            ("basic-auth.password-file", self.basic_auth_password_file),
        ):
            if path is not None:
                try:
                    _secret(path, f"{given}.{name}")
                except PrometheusCredentialsError as exc:
                    return str(exc)
        try:
            _load_context(self)
        except (OSError, ssl.SSLError) as exc:
            return str(exc)
        return None


FLAGS: Final = Flags(
    settings=PrometheusClientSettings,
    prefix=PREFIX,
    title="Prometheus client",
    description="where Prometheus' HTTP API is, and how this client authenticates to it",
)
"""The `--prometheus.*` flags, for a subcommand's `flags`."""


class PrometheusClientError(Exception):
    """Prometheus could not be asked, or its answer is not a usable instant vector."""


class PrometheusCredentialsError(PrometheusClientError):
    """A token or password file cannot be read (or is empty); the message names the flag."""


def _secret(path: Path, flag: str) -> str:
    """The secret in `path`, without surrounding whitespace (as Prometheus trims it)."""
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise PrometheusCredentialsError(f"{flag}: cannot read {path}: {exc}") from exc
    if not secret:
        raise PrometheusCredentialsError(f"{flag}: {path} is empty")
    return secret


def _load_context(settings: PrometheusClientSettings) -> ssl.SSLContext:
    """A verifying client context from the TLS flags; OSError/SSLError naming the flag."""
    import ssl

    context: ssl.SSLContext = (
        _named_context_type()(ssl.PROTOCOL_TLS_CLIENT, settings.tls_server_name)
        if settings.tls_server_name
        else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    )
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    if settings.tls_ca_file is None:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        try:
            context.load_verify_locations(cafile=settings.tls_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ssl.SSLError(
                f"--{PREFIX}.tls.ca-file: no CA certificate in {settings.tls_ca_file}: {exc}"
            ) from exc
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        try:
            context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ssl.SSLError(
                f"--{PREFIX}.tls.cert-file/--{PREFIX}.tls.key-file: cannot load the client "
                f"certificate {settings.tls_cert_file} with key {settings.tls_key_file}: {exc}"
            ) from exc
    return context


@functools.cache
def _named_context_type() -> type[ssl.SSLContext]:
    """The type of a client context that verifies, and sends as SNI, one fixed server name
    whatever host the URL names (`--prometheus.tls.server-name`): urllib wraps sockets,
    asyncio (aiohttp) wraps memory BIOs, and both pass the URL's host, which it replaces.
    Declared on first use, so that importing this module does not import ssl."""
    import ssl

    class NamedContext(ssl.SSLContext):
        server_name: str

        def __new__(cls, protocol: int, server_name: str) -> NamedContext:
            context = super().__new__(cls, protocol)
            context.server_name = server_name
            return context

        def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
            kwargs["server_hostname"] = self.server_name
            return super().wrap_socket(*args, **kwargs)

        def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
            kwargs["server_hostname"] = self.server_name
            return super().wrap_bio(*args, **kwargs)

    return NamedContext


def _signature(paths: tuple[Path | None, ...]) -> tuple[tuple[int, int, int], ...]:
    """What changes when a file is replaced or rewritten: inode, size, modification time."""
    found = []
    for path in paths:
        if path is None:
            continue
        try:
            stat = os.stat(path)
        except OSError:
            found.append((-1, -1, -1))
            continue
        found.append((stat.st_ino, stat.st_size, stat.st_mtime_ns))
    return tuple(found)


class PrometheusAccess:
    """How one process reaches Prometheus: the URL, an SSL context kept current with the TLS
    files, and the Authorization header from the token or password file as it is now.

    Built once at start from validated settings (`problem()` is None, `url` given)."""

    def __init__(self, settings: PrometheusClientSettings) -> None:
        if settings.url is None:
            raise ValueError(f"--{PREFIX}.url is not given")
        self.settings = settings
        self.url: str = settings.url
        self._files = (settings.tls_ca_file, settings.tls_cert_file, settings.tls_key_file)
        self._lock = threading.Lock()
        self._loaded = _signature(self._files)
        self._context = _load_context(settings)

    def ssl_context(self) -> ssl.SSLContext:
        """The client SSL context; loaded again when a TLS file changed since the last one
        (a rotated certificate). A file caught half-written keeps the previous context."""
        import ssl

        now = _signature(self._files)
        with self._lock:
            if now != self._loaded:
                try:
                    self._context = _load_context(self.settings)
                except (OSError, ssl.SSLError):
                    return self._context  # mid-rotation: the next request loads it again
                self._loaded = now
            return self._context

    def authorization(self) -> str | None:
        """The Authorization header's value, from the files as they are now, or None.

        Raises PrometheusCredentialsError naming the flag when a file cannot be read."""
        settings = self.settings
        if settings.bearer_token_file is not None:
            token = _secret(settings.bearer_token_file, f"--{PREFIX}.bearer-token-file")
            return f"Bearer {token}"
        if settings.basic_auth_username is not None and settings.basic_auth_password_file:
            password = _secret(
                settings.basic_auth_password_file, f"--{PREFIX}.basic-auth.password-file"
            )
            import base64

            pair = f"{settings.basic_auth_username}:{password}".encode()
            return "Basic " + base64.b64encode(pair).decode("ascii")
        return None

    def headers(self) -> dict[str, str]:
        """The request headers carrying the credentials (empty without any)."""
        value = self.authorization()
        return {} if value is None else {"Authorization": value}


Sample = tuple[dict[str, str], float]
"""One series of an instant vector: its labels and its value."""


def instant_query(settings: PrometheusClientSettings, expr: str, *, timeout: float) -> list[Sample]:
    """Evaluate `expr` now (`GET /api/v1/query`) and return the vector's (labels, value).

    Standard library only, for a short-lived command (the Slurm health check). Raises
    PrometheusClientError saying why when Prometheus cannot be reached, refuses the
    credentials or the query, or answers anything but an instant vector."""
    import urllib.error
    import urllib.parse
    import urllib.request

    access = PrometheusAccess(settings)
    query = urllib.parse.urlencode({"query": expr})
    request = urllib.request.Request(  # noqa: S310 - an http(s) URL, checked by http_url
        f"{access.url}/api/v1/query?{query}", headers=access.headers()
    )
    try:
        with urllib.request.urlopen(  # noqa: S310 - an http(s) URL, checked by http_url
            request, timeout=timeout, context=access.ssl_context()
        ) as response:
            raw: bytes = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise PrometheusClientError(
                f"{access.url}: HTTP {exc.code}: Prometheus refused the credentials "
                f"(check --{PREFIX}.bearer-token-file or --{PREFIX}.basic-auth.*)"
            ) from exc
        raw = exc.read()  # a 400/422 carries the API's error message
        if not raw:
            raise PrometheusClientError(f"{access.url}: HTTP {exc.code}") from exc
    except (OSError, ValueError) as exc:
        raise PrometheusClientError(f"cannot reach Prometheus at {access.url}: {exc}") from exc
    return _samples(raw, access.url)


def api_error(body: dict[str, Any]) -> str:
    """The `errorType: error` of an API answer that failed, cut short: a proxy or another
    engine may put anything there, and the text is logged and printed."""
    return f"{str(body.get('errorType'))[:80]}: {str(body.get('error'))[:400]}"


def _samples(raw: bytes, url: str) -> list[Sample]:
    """The (labels, value) pairs of an API answer holding an instant vector."""
    import json

    try:
        body: Any = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep
        raise PrometheusClientError(f"{url}: not a Prometheus API answer") from exc
    if not isinstance(body, dict):
        raise PrometheusClientError(f"{url}: not a Prometheus API answer")
    if body.get("status") != "success":
        raise PrometheusClientError(f"{url}: query failed: {api_error(body)}")
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise PrometheusClientError(f"{url}: the answer is not an instant vector")
    result = data.get("result") or []
    if not isinstance(result, list):
        raise PrometheusClientError(f"{url}: the answer's result is not a list")
    samples: list[Sample] = []
    for item in result:
        try:
            labels = {str(k): str(v) for k, v in item["metric"].items()}
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise PrometheusClientError(f"{url}: malformed sample {str(item)[:80]!r}") from exc
        samples.append((labels, value))
    return samples
