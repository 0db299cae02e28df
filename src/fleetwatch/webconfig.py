"""Prometheus exporter-toolkit's web configuration file (`--web.config.file`), read and checked.

node_exporter, dcgm-exporter and every exporter built on exporter-toolkit take one YAML file
for TLS, mutual TLS, basic auth and response headers; fleets already write it. This module
reads that format (exporter-toolkit's "Web configuration" document) the way
exporter-toolkit does: a key it does not know is refused, relative paths are relative to the
file's folder, bcrypt hashes and header values are checked, the certificate and key must
load. Every refusal names the key. What Python's `ssl` cannot honour is refused by name too,
never silently weakened (docs/operations.md lists those options and why):

- `client_auth_type: RequestClientCert` and `RequireAnyClientCert` accept a client
  certificate without verifying it; OpenSSL through Python's `ssl` verifies every
  certificate it asks for against the client CAs and has no callback to skip that;
- `curve_preferences`: Python 3.11's `ssl` sets no list of key-exchange groups.

`http_server_config.http2` is read (fleetwatch serves HTTP/1.1, which every client of it
negotiates), and the check exporter-toolkit inherits from Go's HTTP/2 server is kept:
with HTTP/2 on, `cipher_suites` must hold an AES-128-GCM suite.

`load_web_config` checks everything but the files; `server_context` builds the
`ssl.SSLContext` from the files as they are now (the listener calls it again when they
change, see `fleetwatch.webguard`).
"""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from fleetwatch.durations import DurationError, parse_duration

CLIENT_AUTH_TYPES: Final = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
"""exporter-toolkit's `client_auth_type` values that Python's ssl honours, as verify modes."""

UNVERIFIED_CLIENT_AUTH: Final = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
"""Values that take a client certificate without verifying it: refused (see the docstring)."""

TLS_VERSIONS: Final = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

CIPHER_SUITES: Final = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    # TLS 1.3 suites: accepted and not configurable, as in Go (OpenSSL picks among them).
    "TLS_AES_128_GCM_SHA256": "",
    "TLS_AES_256_GCM_SHA384": "",
    "TLS_CHACHA20_POLY1305_SHA256": "",
}
"""Go's names of the suites `crypto/tls.CipherSuites()` offers, as OpenSSL names them."""

HTTP2_REQUIRED_SUITES: Final = (
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
)

HEADER_VALUES: Final[Mapping[str, tuple[str, ...]]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
"""The response headers exporter-toolkit lets a file set, with the values allowed (any when
empty); any other header is refused, for consistency across the Prometheus ecosystem."""

_BCRYPT: Final = re.compile(rb"\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}")
_TOP_KEYS: Final = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_TLS_KEYS: Final = (
    "cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type", "client_ca_file",
    "client_allowed_sans", "min_version", "max_version", "cipher_suites",
    "prefer_server_cipher_suites", "curve_preferences",
)  # fmt: skip
_HTTP_KEYS: Final = ("http2", "headers")
_RATE_KEYS: Final = ("interval", "burst")


class WebConfigError(ValueError):
    """A web configuration file fleetwatch refuses; the message names the key and why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsServerConfig:
    """`tls_server_config`: paths are absolute (joined to the file's folder)."""

    cert_file: Path | None = None
    cert: str = ""
    key_file: Path | None = None
    key: str = ""
    client_ca_file: Path | None = None
    client_ca: str = ""
    client_auth_type: str = ""
    client_allowed_sans: tuple[str, ...] | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True

    @property
    def files(self) -> tuple[Path, ...]:
        """The files the context is built from: re-read when one of them changes."""
        paths = (self.cert_file, self.key_file, self.client_ca_file)
        return tuple(path for path in paths if path is not None)

    def client_san_allowed(self, peercert: Mapping[str, Any]) -> bool:
        """Whether a verified client certificate (`SSLObject.getpeercert()`) carries a SAN
        of `client_allowed_sans` (DNS, IP, e-mail or URI, compared as exporter-toolkit does);
        True when the list is not set."""
        if self.client_allowed_sans is None:
            return True
        for kind, value in peercert.get("subjectAltName", ()):
            shown = str(ipaddress.ip_address(value.strip())) if kind == "IP Address" else value
            if kind in ("DNS", "IP Address", "email", "URI") and shown in self.client_allowed_sans:
                return True
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """`rate_limit`: a token bucket, one token every `interval` seconds, `burst` at most."""

    interval: float
    burst: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WebConfig:
    """One web configuration file, checked (`load_web_config`)."""

    path: Path
    tls: TlsServerConfig | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    http2: bool = True
    rate_limit: RateLimit | None = None


def _mapping(value: object, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where}: a mapping is expected, got {type(value).__name__}")
    for key in value:
        if key not in keys:
            inside = f"{where}." if where != "web config" else ""
            raise WebConfigError(f"{inside}{key}: unknown key (known: {', '.join(keys)})")
    return value


def _string(section: Mapping[str, Any], key: str, where: str) -> str:
    value = section.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise WebConfigError(f"{where}.{key}: a string is expected")
    return value


def _strings(section: Mapping[str, Any], key: str, where: str) -> tuple[str, ...] | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise WebConfigError(f"{where}.{key}: a list of strings is expected")
    return tuple(value)


def _boolean(section: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise WebConfigError(f"{where}.{key}: true or false is expected")
    return value


def _path(text: str, folder: Path) -> Path | None:
    return (folder / text) if text else None


def _version(section: Mapping[str, Any], key: str, default: ssl.TLSVersion) -> ssl.TLSVersion:
    text = _string(section, key, "tls_server_config")
    if not text:
        return default
    if text not in TLS_VERSIONS:
        known = ", ".join(TLS_VERSIONS)
        raise WebConfigError(f"tls_server_config.{key}: unknown TLS version {text!r} ({known})")
    return TLS_VERSIONS[text]


def _tls(raw: Mapping[str, Any], folder: Path) -> TlsServerConfig | None:
    where = "tls_server_config"
    section = _mapping(raw.get(where), where, _TLS_KEYS)
    text = {key: _string(section, key, where) for key in _TLS_KEYS[:7]}
    if not any(text.values()):
        return None  # as exporter-toolkit: no TLS field set means plain HTTP
    for key in ("cert", "key"):
        if not text[f"{key}_file"] and not text[key]:
            raise WebConfigError(f"{where}: missing one of {key} or {key}_file")
    for key in ("cert", "key", "client_ca"):
        if text[f"{key}_file"] and text[key]:
            raise WebConfigError(f"{where}: set {key} or {key}_file, not both")
    auth = text["client_auth_type"]
    if auth in UNVERIFIED_CLIENT_AUTH:
        raise WebConfigError(
            f"{where}.client_auth_type: {auth} is not supported: it accepts a client "
            "certificate without verifying it, which Python's ssl cannot do; use "
            "RequireAndVerifyClientCert with client_ca_file"
        )
    if auth not in CLIENT_AUTH_TYPES:
        raise WebConfigError(f"{where}.client_auth_type: invalid ClientAuth {auth!r}")
    if section.get("curve_preferences"):
        raise WebConfigError(
            f"{where}.curve_preferences: not supported: Python's ssl cannot set a list of "
            "key-exchange groups (OpenSSL's defaults apply); remove the key"
        )
    suites = _strings(section, "cipher_suites", where) or ()
    for suite in suites:
        if suite not in CIPHER_SUITES:
            raise WebConfigError(f"{where}.cipher_suites: unknown cipher {suite!r}")
    config = TlsServerConfig(
        cert_file=_path(text["cert_file"], folder),
        cert=text["cert"],
        key_file=_path(text["key_file"], folder),
        key=text["key"],
        client_ca_file=_path(text["client_ca_file"], folder),
        client_ca=text["client_ca"],
        client_auth_type=auth,
        client_allowed_sans=_strings(section, "client_allowed_sans", where),
        min_version=_version(section, "min_version", ssl.TLSVersion.TLSv1_2),
        max_version=_version(section, "max_version", ssl.TLSVersion.TLSv1_3),
        cipher_suites=suites,
        prefer_server_cipher_suites=_boolean(section, "prefer_server_cipher_suites", where, True),
    )
    if config.min_version > config.max_version:
        raise WebConfigError(f"{where}: min_version is above max_version")
    return config


def _headers(raw: Mapping[str, Any]) -> tuple[dict[str, str], bool]:
    where = "http_server_config"
    section = _mapping(raw.get(where), where, _HTTP_KEYS)
    http2 = _boolean(section, "http2", where, True)
    headers = section.get("headers") or {}
    if not isinstance(headers, dict):
        raise WebConfigError(f"{where}.headers: a mapping is expected")
    checked: dict[str, str] = {}
    for name, value in headers.items():
        if name not in HEADER_VALUES:
            raise WebConfigError(f'{where}.headers: HTTP header "{name}" can not be configured')
        text = "" if value is None else str(value)
        allowed = HEADER_VALUES[name]
        if allowed and text not in allowed:
            raise WebConfigError(
                f"{where}.headers: invalid value for {name}: {text!r} (one of {', '.join(allowed)})"
            )
        if text:  # blank: unset
            checked[name] = text
    return checked, http2


def _users(raw: Mapping[str, Any]) -> dict[str, bytes]:
    where = "basic_auth_users"
    users = raw.get(where) or {}
    if not isinstance(users, dict):
        raise WebConfigError(f"{where}: a mapping of user names to bcrypt hashes is expected")
    checked: dict[str, bytes] = {}
    for user, hashed in users.items():
        encoded = str(hashed).encode()
        match = _BCRYPT.fullmatch(encoded)
        if match is None or not 4 <= int(match.group(1)) <= 31:
            raise WebConfigError(
                f"{where}.{user}: not a bcrypt hash (as `htpasswd -nBC 10 \"\" | tr -d ':\\n'` "
                "writes one)"
            )
        checked[str(user)] = encoded
    return checked


def _rate_limit(raw: Mapping[str, Any]) -> RateLimit | None:
    where = "rate_limit"
    section = _mapping(raw.get(where), where, _RATE_KEYS)
    interval_text = str(section.get("interval", 0))
    try:
        interval = parse_duration(interval_text)
    except DurationError as exc:
        raise WebConfigError(f"{where}.interval: {exc}") from exc
    burst = section.get("burst", 0)
    if not isinstance(burst, int) or burst < 0:
        raise WebConfigError(f"{where}.burst: a whole number of requests is expected")
    return RateLimit(interval=interval, burst=burst) if interval > 0 else None


def load_web_config(path: Path) -> WebConfig:
    """Read and check `path`; `WebConfigError` naming the key, OSError when unreadable.

    The certificate files are not read here: `server_context` does that."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise WebConfigError(f"not YAML: {exc}") from exc
    top = _mapping(raw, "web config", _TOP_KEYS)
    headers, http2 = _headers(top)
    users = _users(top)
    tls = _tls(top, path.parent)
    if (
        tls is not None
        and http2
        and tls.cipher_suites
        and tls.min_version < ssl.TLSVersion.TLSv1_3
        and not any(suite in tls.cipher_suites for suite in HTTP2_REQUIRED_SUITES)
    ):
        raise WebConfigError(
            "tls_server_config.cipher_suites: with http_server_config.http2 on (the "
            f"default) one of {' or '.join(HTTP2_REQUIRED_SUITES)} is required"
        )
    return WebConfig(
        path=path,
        tls=tls,
        users=users,
        headers=headers,
        http2=http2,
        rate_limit=_rate_limit(top),
    )


def _read(path: Path, key: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise WebConfigError(f"tls_server_config.{key}: {exc.strerror}: {path}") from exc


def server_context(tls: TlsServerConfig) -> ssl.SSLContext:
    """The server context `tls` asks for, from its files as they are now; `WebConfigError`
    naming the key when one is missing, unreadable or not what it should be."""
    cert = _read(tls.cert_file, "cert_file") if tls.cert_file else tls.cert.encode()
    key = _read(tls.key_file, "key_file") if tls.key_file else tls.key.encode()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory(prefix="fleetwatch-tls-") as folder:
        # ssl loads a chain only from a file: what was read goes into a private one, so the
        # context holds exactly the bytes checked, even if a rotation rewrites the files now.
        chain = Path(folder) / "chain.pem"
        chain.touch(mode=0o600)
        chain.write_bytes(cert + b"\n" + key)
        try:
            context.load_cert_chain(chain)
        except ssl.SSLError as exc:
            raise WebConfigError(
                f"tls_server_config: cert and key do not load as a pair: {exc.reason or exc}"
            ) from exc
        finally:
            os.unlink(chain)
    verify = CLIENT_AUTH_TYPES[tls.client_auth_type]
    if tls.client_ca_file or tls.client_ca:
        cadata = (
            _read(tls.client_ca_file, "client_ca_file").decode("ascii", "replace")
            if tls.client_ca_file
            else tls.client_ca
        )
        if verify == ssl.CERT_NONE:
            raise WebConfigError(
                "tls_server_config: client CA's have been configured without a Client Auth "
                "Policy (set client_auth_type)"
            )
        try:
            context.load_verify_locations(cadata=cadata)
        except (ssl.SSLError, ValueError) as exc:
            key_name = "client_ca_file" if tls.client_ca_file else "client_ca"
            raise WebConfigError(f"tls_server_config.{key_name}: no CA certificate in it") from exc
    elif verify != ssl.CERT_NONE:
        context.load_default_certs(ssl.Purpose.CLIENT_AUTH)  # Go's system pool, as toolkit
    context.verify_mode = verify
    context.minimum_version = tls.min_version
    context.maximum_version = tls.max_version
    suites = [CIPHER_SUITES[suite] for suite in tls.cipher_suites if CIPHER_SUITES[suite]]
    if suites:
        context.set_ciphers(":".join(suites))
    if not tls.prefer_server_cipher_suites:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    context.set_alpn_protocols(["http/1.1"])
    return context


def check_web_config(path: Path) -> WebConfig:
    """What `--web.config.file` runs at start: the file and the files it names, all checked;
    `WebConfigError` naming the key (a missing file included)."""
    try:
        config = load_web_config(path)
    except OSError as exc:
        raise WebConfigError(f"{path}: {exc.strerror}") from exc
    if config.tls is not None:
        server_context(config.tls)
    return config
