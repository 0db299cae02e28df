"""A real Prometheus scrapes the exporter over TLS, over mutual TLS (refused without its
client certificate) and with basic auth (refused with a wrong password); a certificate
renewed on disk is served to the next connection with no failed scrape; a real Alertmanager
delivers to the tainter's webhook over TLS with its bearer token.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import ssl
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetwatch.sim.kubeapi import FakeCluster, make_app, write_kubeconfig
from fleetwatch.sim.loopback_servers import (
    Server,
    alertmanager,
    free_port,
    post_alert,
    process,
    prometheus,
    wait_until,
)
from testbed.tool_servers import prom_query, served_in_thread
from tests.promtls import Pki, reissue_server_certificate, write_pki
from tests.webconfig.serving import bcrypt_hash, write_atomically

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PASSWORD = "scrape-s3cret"


@dataclass
class Https:
    """A fleetwatch process serving HTTPS on `address`."""

    address: str
    context: ssl.SSLContext

    def get(self, path: str, headers: dict[str, str] | None = None) -> bytes:
        request = urllib.request.Request(f"https://{self.address}{path}", headers=headers or {})
        with urllib.request.urlopen(request, timeout=5, context=self.context) as response:
            body: bytes = response.read()
            return body


@contextlib.contextmanager
def fleetwatch_https(
    workdir: Path,
    command: str,
    args: Sequence[str],
    context: ssl.SSLContext,
    headers: dict[str, str] | None = None,
) -> Iterator[Https]:
    """`fleetwatch COMMAND ARGS` serving HTTPS, ready when `/healthz` answers (sent with
    `headers`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "fleetwatch",
        command,
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.format=json",
        *args,
    ]
    log = workdir / f"fleetwatch-{command}.log"
    with process(argv, log, cwd=workdir) as started:
        served = Https(address=f"127.0.0.1:{port}", context=context)

        def up() -> bool:
            if started.poll() is not None:
                raise RuntimeError(f"{command} exited:\n{log.read_text()[-2000:]}")
            return served.get("/healthz", headers) is not None

        wait_until(up, timeout=60, what=f"fleetwatch {command} over HTTPS")
        yield served


def web_config(folder: Path, pki: Pki, **extra: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "web.yml"
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    document: dict[str, Any] = {"tls_server_config": tls}
    for key, value in extra.items():
        if key == "tls":
            tls.update(value)
        else:
            document[key] = value
    config.write_text(yaml.safe_dump(document))
    return config


def client(pki: Pki, *, certificate: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if certificate:
        context.load_cert_chain(pki.client_cert, pki.client_key)
    return context


def job(name: str, target: str, pki: Pki, **extra: Any) -> dict[str, Any]:
    tls = {"ca_file": str(pki.ca), **extra.pop("tls", {})}
    return {
        "job_name": name,
        "scheme": "https",
        "tls_config": tls,
        "static_configs": [{"targets": [target]}],
        **extra,
    }


def served_certificate(address: str, pki: Pki) -> bytes:
    """The certificate a new connection to `address` gets (DER)."""
    host, port = address.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        client(pki).wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def basic_auth(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def scalar(prom: Server, expr: str) -> float:
    return float(prom_query(prom, expr)[0]["value"][1])


def up(prom: Server, name: str) -> float | None:
    result = prom_query(prom, f'up{{job="{name}"}}')
    return float(result[0]["value"][1]) if result else None


def test_prometheus_scrapes_over_tls_mutual_tls_and_basic_auth(tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "pki")
    modes = {
        "tls": web_config(tmp_path / "tls", pki),
        "mtls": web_config(
            tmp_path / "mtls",
            pki,
            tls={"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca)},
        ),
        "basic": web_config(
            tmp_path / "basic", pki, basic_auth_users={"prometheus": bcrypt_hash(PASSWORD)}
        ),
    }
    with contextlib.ExitStack() as stack:
        exporters = {
            mode: stack.enter_context(
                fleetwatch_https(
                    tmp_path / mode,
                    "export",
                    # keep-alive shorter than the scrape interval: each scrape connects anew
                    [
                        "--simulate=dgx-h100",
                        f"--web.config.file={config}",
                        "--web.keepalive-timeout=1s",
                    ],
                    client(pki, certificate=mode == "mtls"),
                    basic_auth("prometheus", PASSWORD) if mode == "basic" else None,
                )
            )
            for mode, config in modes.items()
        }
        tls, mtls, basic = (exporters[m].address for m in ("tls", "mtls", "basic"))
        prom = stack.enter_context(
            prometheus(
                tmp_path / "prometheus",
                scrape_interval="2s",
                scrape_configs=[
                    job("tls", tls, pki),
                    job(
                        "mtls",
                        mtls,
                        pki,
                        tls={"cert_file": str(pki.client_cert), "key_file": str(pki.client_key)},
                    ),
                    job("mtls-without-cert", mtls, pki),
                    job(
                        "basic",
                        basic,
                        pki,
                        basic_auth={"username": "prometheus", "password": PASSWORD},
                    ),
                    job(
                        "basic-wrong-password",
                        basic,
                        pki,
                        basic_auth={"username": "prometheus", "password": "wrong"},
                    ),
                ],
            )
        )
        jobs = ("tls", "mtls", "mtls-without-cert", "basic", "basic-wrong-password")
        wait_until(
            lambda: all(up(prom, name) is not None for name in jobs),
            timeout=60,
            what="a scrape of every job",
        )
        assert {name: up(prom, name) for name in jobs} == {
            "tls": 1.0,
            "mtls": 1.0,
            "mtls-without-cert": 0.0,
            "basic": 1.0,
            "basic-wrong-password": 0.0,
        }
        # the samples are the exporter's, read over TLS
        assert prom_query(prom, 'fleetwatch_build_info{job="mtls"}')

        # cert-manager renews the serving certificate: the next connection gets it, and no
        # scrape fails on the way
        cert, key = reissue_server_certificate(pki)
        before = served_certificate(tls, pki)
        write_atomically(pki.server_key, key)
        write_atomically(pki.server_cert, cert)

        def renewal_served() -> bytes | None:
            der = served_certificate(tls, pki)
            return der if der != before else None

        renewed = wait_until(renewal_served, timeout=30, what="the renewed certificate served")
        assert ssl.DER_cert_to_PEM_cert(renewed).strip() == cert.decode().strip()
        scrapes = scalar(prom, 'count_over_time(up{job="tls"}[10m])')
        wait_until(
            lambda: scalar(prom, 'count_over_time(up{job="tls"}[10m])') >= scrapes + 3,
            timeout=30,
            what="three scrapes after the renewal",
        )
        assert scalar(prom, 'min_over_time(up{job="tls"}[10m])') == 1.0
        assert scalar(prom, 'min_over_time(up{job="mtls"}[10m])') == 1.0
        # the reload is counted as a success in the exporter's own metrics
        exposition = exporters["tls"].get("/metrics").decode()
        assert "fleetwatch_web_config_reload_errors_total 0.0" in exposition


def test_alertmanager_delivers_to_the_tainter_over_tls(tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "pki")
    config = web_config(tmp_path, pki)
    token = tmp_path / "token"
    token.write_text("webhook-t0ken\n")
    cluster = FakeCluster(token="tainter-token")
    cluster.add_node("gpu-0", labels={"nvidia.com/gpu.present": "true"})
    with served_in_thread(make_app(cluster)) as api, contextlib.ExitStack() as stack:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=api, token="tainter-token")
        tainter = stack.enter_context(
            fleetwatch_https(
                tmp_path / "tainter",
                "taint",
                [
                    f"--web.config.file={config}",
                    f"--web.token-file={token}",
                    f"--kubeconfig={kubeconfig}",
                    "--taint.declared-reasons=gpu-overheat",
                ],
                client(pki),
            )
        )
        hook = {
            "url": f"https://{tainter.address}/alerts",
            "http_config": {
                "authorization": {"type": "Bearer", "credentials_file": str(token)},
                "tls_config": {"ca_file": str(pki.ca)},
            },
        }
        am = stack.enter_context(
            alertmanager(
                tmp_path / "alertmanager",
                config={
                    "route": {"receiver": "tainter", "group_wait": "1s", "group_interval": "2s"},
                    "receivers": [{"name": "tainter", "webhook_configs": [hook]}],
                },
            )
        )
        post_alert(
            am.url,
            {"alertname": "GPUOverheating", "node": "gpu-0", "fleetwatch_taint": "gpu-overheat"},
        )

        def delivered() -> bool:
            metrics = tainter.get("/metrics").decode()
            return 'fleetwatch_tainter_webhook_requests_total{result="ok"} 1.0' in metrics

        wait_until(delivered, timeout=60, what="Alertmanager's notification over TLS")
