"""`--web.config.file` on `fleetwatch export` and `fleetwatch taint`: one flag, checked at
start (a refusal names the key), and how it meets the tainter's own webhook auth and TLS."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from fleetwatch.cli import build_parser
from fleetwatch.tainter import cli
from tests.webconfig.serving import bcrypt_hash

TOOLKIT = Path(__file__).parent / "toolkit"
MUTUAL = "tls_config_noAuth.requireandverifyclientcert.good.yml"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetwatch", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_export_refuses_a_bad_file_at_start_naming_the_key() -> None:
    bad = TOOLKIT / "web_config_junk_key.yml"
    result = run_cli("export", "--simulate=dgx-h100", f"--web.config.file={bad}")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "fleetwatch export: error: tls_server_config.cert_filse: unknown key (known: cert, key, "
        "client_ca, cert_file, key_file, client_auth_type, client_ca_file, client_allowed_sans, "
        "min_version, max_version, cipher_suites, prefer_server_cipher_suites, curve_preferences)"
    )


def test_taint_refuses_a_bad_file_at_start_naming_the_key() -> None:
    bad = TOOLKIT / "web_config_headers_extra_header.bad.yml"
    with pytest.raises(SystemExit) as refused:
        cli.settings_from_args(
            parse("taint", "--web.insecure-no-token", f"--web.config.file={bad}")
        )
    assert str(refused.value) == (
        "fleetwatch taint: error: --web.config.file: http_server_config.headers: "
        'HTTP header "Content-Type" can not be configured'
    )


def test_taint_takes_tls_from_the_file_and_pins_its_certificate_for_forwards() -> None:
    settings = cli.settings_from_args(
        parse(
            "taint",
            "--web.insecure-no-token",
            f"--web.config.file={TOOLKIT / MUTUAL}",
        )
    )
    assert settings.listener.config_file is not None
    assert settings.tls is not None
    assert settings.tls.cert == TOOLKIT / "server.crt"
    assert settings.tls.client_ca == TOOLKIT / "client_selfsigned.pem"


def test_taint_basic_auth_stands_for_the_token(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  alertmanager: {bcrypt_hash('x')}\n")
    settings = cli.settings_from_args(parse("taint", f"--web.config.file={config}"))
    assert settings.token_file is None
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    with pytest.raises(SystemExit, match="both want the Authorization header"):
        cli.settings_from_args(
            parse("taint", f"--web.config.file={config}", f"--web.token-file={token}")
        )


def test_taint_refuses_two_sources_of_tls() -> None:
    with pytest.raises(SystemExit, match=r"--web\.config\.file and --web\.tls"):
        cli.settings_from_args(
            parse(
                "taint",
                "--web.insecure-no-token",
                f"--web.config.file={TOOLKIT / 'web_config_noAuth.good.yml'}",
                f"--web.tls.cert-file={TOOLKIT / 'server.crt'}",
                f"--web.tls.key-file={TOOLKIT / 'server.key'}",
            )
        )
