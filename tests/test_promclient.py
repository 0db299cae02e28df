"""The `--prometheus.*` client group: its checks at start, and a real TLS handshake with
bearer token, basic auth, mutual TLS and a server name, from urllib (`instant_query`, the
Slurm health check) and from aiohttp (tainter, report)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import aiohttp
import pytest

from fleetwatch.flags import ArgParser, Subcommand, build_parser, parse_args
from fleetwatch.promclient import (
    FLAGS,
    PrometheusAccess,
    PrometheusClientError,
    PrometheusClientSettings,
    PrometheusCredentialsError,
    instant_query,
)
from tests.promtls import NAMED_HOST, Pki, basic, guarded_api, server_context, write_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return write_pki(tmp_path_factory.mktemp("pki"))


def _secret_file(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def _parser() -> ArgParser:
    command = Subcommand(name="client", run=lambda _: 0, flags=(FLAGS,))
    return build_parser(prog="fleetwatch", description="", version="0", subcommands=[command])


def _parsed(*words: str) -> PrometheusClientSettings:
    settings: PrometheusClientSettings = FLAGS.read(parse_args(_parser(), ["client", *words]))
    return settings


def test_the_flags_are_named_as_prometheus_names_its_http_config() -> None:
    assert [d.option for d in FLAGS.declared()] == [
        "--prometheus.url",
        "--prometheus.bearer-token-file",
        "--prometheus.basic-auth.username",
        "--prometheus.basic-auth.password-file",
        "--prometheus.tls.ca-file",
        "--prometheus.tls.cert-file",
        "--prometheus.tls.key-file",
        "--prometheus.tls.server-name",
    ]
    assert [d.env for d in FLAGS.declared()][3] == "FLEETWATCH_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE"


def test_a_variable_sets_a_client_flag(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETWATCH_PROMETHEUS_TLS_CA_FILE", str(pki.ca))
    settings = _parsed("--prometheus.url=https://127.0.0.1:1")
    assert settings.tls_ca_file == pki.ca
    assert settings.problem() is None


def test_an_unreadable_file_is_refused_when_parsed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _parsed("--prometheus.url=http://p:9090", f"--prometheus.bearer-token-file={tmp_path}/x")
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "argument --prometheus.bearer-token-file: cannot read" in err


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"url": None}, "--prometheus.url is needed"),
        ({"basic_auth_username": "u"}, "--prometheus.bearer-token-file and --prometheus.basic"),
        ({"bearer_token_file": None, "basic_auth_username": "u"}, "password-file go together"),
        ({"tls_key_file": None}, "--prometheus.tls.cert-file and --prometheus.tls.key-file"),
        ({"url": "http://127.0.0.1:9090"}, "--prometheus.tls.* needs an https://"),
        ({"tls_ca_file": "TOKEN"}, "--prometheus.tls.ca-file: no CA certificate in"),
        ({"tls_key_file": "CA"}, "--prometheus.tls.cert-file/--prometheus.tls.key-file"),
        ({"bearer_token_file": "EMPTY"}, "--prometheus.bearer-token-file: "),
    ],
)
def test_an_option_that_cannot_be_honoured_is_refused_by_name(
    pki: Pki, tmp_path: Path, change: dict[str, object], named: str
) -> None:
    files = {
        "TOKEN": _secret_file(tmp_path, "token", "s3cret\n"),
        "EMPTY": _secret_file(tmp_path, "empty", " \n"),
        "CA": pki.ca,
    }
    good = PrometheusClientSettings(
        url="https://127.0.0.1:9090",
        bearer_token_file=files["TOKEN"],
        tls_ca_file=pki.ca,
        tls_cert_file=pki.client_cert,
        tls_key_file=pki.client_key,
    )
    assert good.problem() is None
    resolved = {k: files.get(v, v) if isinstance(v, str) else v for k, v in change.items()}
    problem = dataclasses.replace(good, **resolved).problem()  # type: ignore[arg-type]
    assert problem is not None
    assert named in problem
    assert "\n" not in problem


def test_no_url_and_no_options_is_no_client() -> None:
    assert PrometheusClientSettings().problem() is None
    with pytest.raises(ValueError, match=r"--prometheus\.url"):
        PrometheusAccess(PrometheusClientSettings())


@pytest.fixture
def token(tmp_path: Path) -> Path:
    return _secret_file(tmp_path, "token", "first-token\n")


def test_bearer_token_over_tls_and_a_rotated_token_is_used_at_once(pki: Pki, token: Path) -> None:
    wanted = ["Bearer first-token"]
    with guarded_api(server_context(pki.server_cert, pki.server_key), lambda: wanted[0]) as api:
        settings = PrometheusClientSettings(
            url=api.url, bearer_token_file=token, tls_ca_file=pki.ca
        )
        assert settings.problem() is None
        samples = instant_query(settings, 'up{job="x"}', timeout=5)
        assert samples == [({"query": 'up{job="x"}', "node": "gpu-1"}, 1.0)]
        token.write_text("second-token")
        with pytest.raises(PrometheusClientError, match="refused the credentials"):
            instant_query(settings, "up", timeout=5)
        wanted[0] = "Bearer second-token"
        assert instant_query(settings, "up", timeout=5)[0][1] == 1.0
        assert api.queries == ['up{job="x"}', "up"]


def test_the_system_roots_do_not_trust_a_private_ca(pki: Pki) -> None:
    with guarded_api(server_context(pki.server_cert, pki.server_key), lambda: None) as api:
        with pytest.raises(PrometheusClientError, match="CERTIFICATE_VERIFY_FAILED"):
            instant_query(PrometheusClientSettings(url=api.url), "up", timeout=5)
        trusted = PrometheusClientSettings(url=api.url, tls_ca_file=pki.ca)
        assert len(instant_query(trusted, "up", timeout=5)) == 1


def test_basic_auth_and_a_client_certificate(pki: Pki, tmp_path: Path) -> None:
    password = _secret_file(tmp_path, "password", "hunter2\n")
    context = server_context(pki.server_cert, pki.server_key, client_ca=pki.ca)
    with guarded_api(context, lambda: basic("fleetwatch", "hunter2")) as api:
        without_cert = PrometheusClientSettings(
            url=api.url,
            basic_auth_username="fleetwatch",
            basic_auth_password_file=password,
            tls_ca_file=pki.ca,
        )
        with pytest.raises(PrometheusClientError, match="cannot reach"):
            instant_query(without_cert, "up", timeout=5)
        settings = dataclasses.replace(
            without_cert, tls_cert_file=pki.client_cert, tls_key_file=pki.client_key
        )
        assert settings.problem() is None
        assert len(instant_query(settings, "up", timeout=5)) == 1


def test_the_server_name_replaces_the_urls_host(pki: Pki) -> None:
    with guarded_api(server_context(pki.named_cert, pki.named_key), lambda: None) as api:
        settings = PrometheusClientSettings(url=api.url, tls_ca_file=pki.ca)
        with pytest.raises(PrometheusClientError, match="CERTIFICATE_VERIFY_FAILED"):
            instant_query(settings, "up", timeout=5)
        named = dataclasses.replace(settings, tls_server_name=NAMED_HOST)
        assert len(instant_query(named, "up", timeout=5)) == 1


async def test_aiohttp_uses_the_same_context_and_header(pki: Pki, tmp_path: Path) -> None:
    password = _secret_file(tmp_path, "password", "hunter2")
    context = server_context(pki.named_cert, pki.named_key, client_ca=pki.ca)
    with guarded_api(context, lambda: basic("fleetwatch", "hunter2")) as api:
        access = PrometheusAccess(
            PrometheusClientSettings(
                url=api.url,
                basic_auth_username="fleetwatch",
                basic_auth_password_file=password,
                tls_ca_file=pki.ca,
                tls_cert_file=pki.client_cert,
                tls_key_file=pki.client_key,
                tls_server_name=NAMED_HOST,
            )
        )
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                f"{access.url}/api/v1/query",
                params={"query": "up"},
                headers=access.headers(),
                ssl=access.ssl_context(),
            ) as response,
        ):
            assert response.status == 200
            body = await response.json()
        assert body["data"]["result"][0]["metric"]["query"] == "up"


def test_a_rotated_certificate_is_loaded_and_a_vanished_token_named(
    pki: Pki, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(pki.ca.read_bytes())
    token = _secret_file(tmp_path, "token", "t")
    access = PrometheusAccess(
        PrometheusClientSettings(url="https://127.0.0.1:1", tls_ca_file=ca, bearer_token_file=token)
    )
    first = access.ssl_context()
    assert access.ssl_context() is first
    ca.write_text("not yet a certificate")
    assert access.ssl_context() is first  # caught mid-rotation: the previous one stays
    ca.write_bytes(pki.ca.read_bytes() + b"\n")
    assert access.ssl_context() is not first
    token.unlink()
    with pytest.raises(PrometheusCredentialsError, match=r"--prometheus\.bearer-token-file"):
        access.headers()


def test_an_answer_that_is_not_a_vector_is_an_error(pki: Pki) -> None:
    from fleetwatch.promclient import _samples

    matrix = b'{"status":"success","data":{"resultType":"matrix","result":[]}}'
    with pytest.raises(PrometheusClientError, match="not an instant vector"):
        _samples(matrix, "u")
    failed = b'{"status":"error","errorType":"bad_data","error":"parse error"}'
    with pytest.raises(PrometheusClientError, match="bad_data: parse error"):
        _samples(failed, "u")
    with pytest.raises(PrometheusClientError, match="not a Prometheus API answer"):
        _samples(b"<html>", "u")
