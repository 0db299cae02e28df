"""The chart's web TLS and basic auth (`exporter.web`, `tainter.web.tls`): `--web.config.file`
from a Secret with the certificate from its own Secret (or a cert-manager Certificate), the
probes over HTTPS (a TCP connect with mutual TLS or basic auth), the ServiceMonitors and the
AlertmanagerConfig speaking TLS and basic auth to match, the NetworkPolicies unchanged."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.cli import build_parser
from fleetwatch.webconfig import check_web_config
from tests.deploy import fakekube
from tests.deploy.chart import Release, install, lint
from tests.promtls import write_pki

ISSUER = {"kind": "ClusterIssuer", "name": "fleet-ca"}
TLS = {"enabled": True, "certManager": {"enabled": True, "issuerRef": ISSUER}}
MUTUAL = {"enabled": True, "clientAuth": True, "secretName": "fleet-serving"}
WEB_OVERRIDES: dict[str, dict[str, Any]] = {
    "web-tls": {"exporter": {"web": {"tls": TLS}}, "tainter": {"web": {"tls": TLS}}},
    "web-mtls": {
        "exporter": {"web": {"tls": MUTUAL}},
        "tainter": {"web": {"tls": MUTUAL}},
        "serviceMonitor": {"tlsClientSecret": "prometheus-client"},
    },
}
HASH = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
BASIC = {
    "exporter": {
        "web": {"tls": {"enabled": True}, "basicAuth": {"users": {"prometheus": HASH}}},
    },
    "serviceMonitor": {"basicAuthSecret": "prometheus-basic-auth"},
}


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Release]]:
    path = tmp_path_factory.mktemp("kube") / "kubeconfig.json"
    certificates = fakekube.Kind("cert-manager.io/v1", "Certificate", "certificates")
    api = fakekube.FakeKubeApi(kinds=(*fakekube.CORE_KINDS, *fakekube.OPERATOR_KINDS, certificates))
    with fakekube.serve(api, path) as served:
        overrides = {"defaults": {}, "web-basic": BASIC, **WEB_OVERRIDES}
        yield {name: install(served, values) for name, values in overrides.items()}


@pytest.mark.parametrize("values", [*WEB_OVERRIDES.values(), BASIC])
def test_helm_lint_is_clean(values: dict[str, Any], tmp_path: Path) -> None:
    assert lint(tmp_path, values) == []


def test_helm_lint_refuses_a_password_for_a_hash(tmp_path: Path) -> None:
    plain = {"exporter": {"web": {"basicAuth": {"users": {"prometheus": "s3cret"}}}}}
    assert lint(tmp_path, plain)


def _pods(release: Release) -> dict[str, dict[str, Any]]:
    return {
        "exporter": release.one("DaemonSet")["spec"]["template"]["spec"],
        "tainter": release.one("Deployment")["spec"]["template"]["spec"],
    }


def _config(release: Release, component: str, tmp_path: Path) -> Path:
    """The component's rendered web config, its certificate paths pointing at a test PKI."""
    (secret_object,) = [
        o
        for o in release.of_kind("Secret")
        if o["metadata"]["name"].endswith(f"-{component}-web-config")
    ]
    pki = write_pki(tmp_path / component)
    secret = tmp_path / f"{component}-secret"
    secret.mkdir()
    for source, name in (
        (pki.server_cert, "tls.crt"),
        (pki.server_key, "tls.key"),
        (pki.ca, "ca.crt"),
    ):
        shutil.copy(source, secret / name)
    text = secret_object["stringData"]["web-config.yml"].replace(
        "/etc/fleetwatch/web-tls", str(secret)
    )
    path = tmp_path / f"{component}-web-config.yml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", list(WEB_OVERRIDES))
def test_every_listener_serves_the_web_config_file(
    releases: dict[str, Release], name: str, tmp_path: Path
) -> None:
    release, mutual = releases[name], name == "web-mtls"
    for component, pod in _pods(release).items():
        config = check_web_config(_config(release, component, tmp_path))
        assert config.tls is not None
        assert config.tls.client_auth_type == ("RequireAndVerifyClientCert" if mutual else "")
        secret = "fleet-serving" if mutual else f"fw-fleetwatch-{component}-tls"
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["web-tls"]["secret"]["secretName"] == secret
        assert (
            volumes["web-config"]["secret"]["secretName"] == f"fw-fleetwatch-{component}-web-config"
        )
        for container in pod["containers"]:
            assert "--web.config.file=/etc/fleetwatch/web/web-config.yml" in container["args"]
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert mounts["web-config"] == "/etc/fleetwatch/web"
            assert mounts["web-tls"] == "/etc/fleetwatch/web-tls"
            args = [
                f"--web.config.file={tmp_path / f'{component}-web-config.yml'}"
                if a.startswith("--web.config.file=")
                else a
                for a in container["args"]
                if not a.startswith(("--web.token-file", "--rules.config-file"))
            ]
            assert build_parser().parse_args(args).web_config_file is not None
            for probe in (container["livenessProbe"], container["readinessProbe"]):
                if mutual:  # the kubelet presents no client certificate
                    assert "httpGet" not in probe
                    assert probe["tcpSocket"]["port"] in ("metrics", "metrics-admin")
                else:
                    assert probe["httpGet"]["scheme"] == "HTTPS"
    (tainter,) = _pods(release)["tainter"]["containers"]
    assert "--leader-elect.advertise-url=https://$(POD_IP):9848" in tainter["args"]


@pytest.mark.parametrize("name", list(WEB_OVERRIDES))
def test_prometheus_and_alertmanager_speak_tls_to_match(
    releases: dict[str, Release], name: str
) -> None:
    release, mutual = releases[name], name == "web-mtls"
    for monitor in release.of_kind("ServiceMonitor"):
        component = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["scheme"] == "https"
            tls = endpoint["tlsConfig"]
            assert tls["serverName"] == f"fw-fleetwatch-{component}.monitoring.svc"
            secret = "fleet-serving" if mutual else f"fw-fleetwatch-{component}-tls"
            assert tls["ca"]["secret"] == {"name": secret, "key": "ca.crt"}
            if mutual:
                assert tls["cert"]["secret"] == {"name": "prometheus-client", "key": "tls.crt"}
                assert tls["keySecret"] == {"name": "prometheus-client", "key": "tls.key"}
            else:
                assert "cert" not in tls
    (hook,) = release.one("AlertmanagerConfig")["spec"]["receivers"][0]["webhookConfigs"]
    assert hook["url"] == "https://fw-fleetwatch-tainter.monitoring.svc:9848/alerts"
    assert hook["httpConfig"]["authorization"]["type"] == "Bearer"
    assert "ca" in hook["httpConfig"]["tlsConfig"]
    assert ("cert" in hook["httpConfig"]["tlsConfig"]) is mutual


def test_cert_manager_writes_the_serving_secrets(releases: dict[str, Release]) -> None:
    certificates = {
        c["metadata"]["name"]: c["spec"] for c in releases["web-tls"].of_kind("Certificate")
    }
    assert set(certificates) == {"fw-fleetwatch-exporter", "fw-fleetwatch-tainter"}
    for name, spec in certificates.items():
        assert spec["secretName"] == f"{name}-tls"
        assert spec["issuerRef"] == ISSUER
        assert spec["dnsNames"] == [name, f"{name}.monitoring.svc"]
    assert not releases["web-mtls"].of_kind("Certificate")


@pytest.mark.parametrize("name", list(WEB_OVERRIDES))
def test_network_policies_are_unchanged(releases: dict[str, Release], name: str) -> None:
    assert releases[name].of_kind("NetworkPolicy") == releases["defaults"].of_kind("NetworkPolicy")


def test_basic_auth_on_the_exporter(releases: dict[str, Release], tmp_path: Path) -> None:
    release = releases["web-basic"]
    config = check_web_config(_config(release, "exporter", tmp_path))
    assert config.users == {"prometheus": HASH.encode()}
    for container in _pods(release)["exporter"]["containers"]:
        for probe in (container["livenessProbe"], container["readinessProbe"]):
            assert "httpGet" not in probe  # the kubelet sends no password
            assert "tcpSocket" in probe
    monitors = {
        m["metadata"]["labels"]["app.kubernetes.io/component"]: m["spec"]["endpoints"]
        for m in release.of_kind("ServiceMonitor")
    }
    for endpoint in monitors["exporter"]:
        assert endpoint["basicAuth"] == {
            "username": {"name": "prometheus-basic-auth", "key": "username"},
            "password": {"name": "prometheus-basic-auth", "key": "password"},
        }
    assert all("basicAuth" not in e and "scheme" not in e for e in monitors["tainter"])
    assert not [s for s in release.of_kind("Secret") if "tainter-web" in s["metadata"]["name"]]
