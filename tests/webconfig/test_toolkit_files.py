"""exporter-toolkit's own web config test files, accepted or refused as exporter-toolkit does.

The verdicts are those of exporter-toolkit's `web/tls_config_test.go` (its `Validate` and its
server's start); each refusal must name the key that caused it. Three files exporter-toolkit
accepts are refused here, by name, because Python's ssl cannot honour them (docs/operations.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwatch.webconfig import WebConfigError, check_web_config

TOOLKIT = Path(__file__).parent / "toolkit"

ACCEPTED = (
    "web_config_empty.yml",
    "web_config_headers.good.yml",
    "web_config_noAuth.good.yml",
    "web_config_noAuth.good.blocking.yml",
    # Named .bad but accepted by exporter-toolkit (it is the same file as good.blocking:
    # RequireAndVerifyClientCert with the system's CAs); no test of theirs refuses it.
    "web_config_auth_clientCAs_missing.bad.yml",
    "tls_config_noAuth.requireandverifyclientcert.good.yml",
    # The SAN files load alike: the .bad one refuses its client at the handshake.
    "web_config_auth_client_san.good.yaml",
    "web_config_auth_client_san.bad.yaml",
    "web_config_noAuth_allCiphers.good.yml",
    "web_config_noAuth_someCiphers.good.yml",
    "web_config_noAuth_someCiphers_noOrder.good.yml",
    "web_config_noAuth_noHTTP2.good.yml",
    "web_config_noAuth_tlsInline.good.yml",
    "web_config_users.good.yml",
    "web_config_users_noTLS.good.yml",
    "web_config_rate_limiter_nonblocking.yaml",
    "web_config_rate_limiter_one_second.yaml",
)

REFUSED = {
    # file: the words the refusal must hold (the key first)
    "web_config_junk.yml": "mapping",
    "web_config_junk_key.yml": "tls_server_config.cert_filse",
    "web_config_noAuth_certPath_empty.bad.yml": "cert or cert_file",
    "web_config_noAuth_cert_empty.bad.yml": "cert or cert_file",
    "web_config_noAuth_keyPath_empty.bad.yml": "key or key_file",
    "web_config_noAuth_key_empty.bad.yml": "key or key_file",
    "web_config_noAuth_certPath_keyPath_empty.bad.yml": "cert or cert_file",
    "web_config_noAuth_certPath_invalid.bad.yml": "cert_file: No such file",
    "web_config_noAuth_keyPath_invalid.bad.yml": "cert_file: No such file",
    "web_config_noAuth_certPath_keyPath_invalid.bad.yml": "cert_file: No such file",
    "web_config_noAuth.bad.yml": "without a Client Auth Policy",
    "web_config_auth_clientCAs_invalid.bad.yml": "client_ca_file: No such file",
    "web_config_auth_user_list_invalid.bad.yml": "basic_auth_users.john",
    "web_config_noAuth_inventedCiphers.bad.yml": "cipher_suites: unknown cipher",
    "web_config_noAuth_inventedCurves.bad.yml": "curve_preferences",
    "web_config_noAuth_wrongTLSVersion.bad.yml": "min_version: unknown TLS version",
    "web_config_noAuth_noHTTP2Cipher.bad.yml": "cipher_suites: with http_server_config.http2",
    "web_config_headers_content_type_options.bad.yml": "invalid value for X-Content-Type-Options",
    "web_config_headers_frame_options.bad.yml": "invalid value for X-Frame-Options",
    "web_config_headers_extra_header.bad.yml": 'HTTP header "Content-Type" can not be configured',
}

UNSUPPORTED = {
    # exporter-toolkit accepts these; Python's ssl cannot honour them (docs/operations.md)
    "tls_config_noAuth.requireanyclientcert.good.yml": "client_auth_type: RequireAnyClientCert",
    "tls_config_noAuth.requireanyclientcertkeyinline.good.yml": (
        "client_auth_type: RequireAnyClientCert"
    ),
    "web_config_noAuth_allCurves.good.yml": "curve_preferences: not supported",
    "web_config_noAuth_someCurves.good.yml": "curve_preferences: not supported",
}


def test_every_toolkit_file_has_a_verdict() -> None:
    files = {path.name for path in TOOLKIT.iterdir() if path.suffix in (".yml", ".yaml")}
    assert files == set(ACCEPTED) | set(REFUSED) | set(UNSUPPORTED)


@pytest.mark.parametrize("name", ACCEPTED)
def test_accepted_as_exporter_toolkit_does(name: str) -> None:
    config = check_web_config(TOOLKIT / name)
    assert config.path == TOOLKIT / name


@pytest.mark.parametrize(("name", "why"), sorted({**REFUSED, **UNSUPPORTED}.items()))
def test_refused_naming_the_key(name: str, why: str) -> None:
    with pytest.raises(WebConfigError) as refused:
        check_web_config(TOOLKIT / name)
    assert why in str(refused.value)


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match="No such file"):
        check_web_config(tmp_path / "somefile")


def test_what_the_files_set_is_read() -> None:
    users = check_web_config(TOOLKIT / "web_config_users.good.yml")
    assert sorted(users.users) == ["alice", "bob", "carol", "dave"]
    assert users.tls is not None
    assert users.tls.cert_file == TOOLKIT / "server.crt"
    headers = check_web_config(TOOLKIT / "web_config_headers.good.yml")
    assert headers.headers["X-Frame-Options"] == "deny"
    assert headers.tls is None
    limited = check_web_config(TOOLKIT / "web_config_rate_limiter_one_second.yaml")
    assert limited.rate_limit is not None
    assert limited.rate_limit.interval == 1.0
    assert check_web_config(TOOLKIT / "web_config_rate_limiter_nonblocking.yaml").rate_limit is None
