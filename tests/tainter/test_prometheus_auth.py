"""The tainter asks Prometheus for untaint evidence through the `--prometheus.*` client
group: over TLS with a private CA, basic auth and a client certificate; refused credentials
keep the taint and count a source error."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from fleetwatch.catalog.tainter import TAINTER_SOURCE_ERRORS_TOTAL
from fleetwatch.promclient import PrometheusAccess, PrometheusClientSettings
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.sources import PrometheusEvidence
from tests.promtls import Pki, basic, guarded_api, server_context, write_pki

QUERY = 'up{node="$node"} == 1'


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return write_pki(tmp_path_factory.mktemp("pki"))


async def test_evidence_is_read_over_mutual_tls_with_basic_auth(pki: Pki, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("hunter2\n")
    wanted = [basic("tainter", "hunter2")]
    context = server_context(pki.server_cert, pki.server_key, client_ca=pki.ca)
    with guarded_api(context, lambda: wanted[0]) as api:
        settings = PrometheusClientSettings(
            url=api.url,
            basic_auth_username="tainter",
            basic_auth_password_file=password,
            tls_ca_file=pki.ca,
            tls_cert_file=pki.client_cert,
            tls_key_file=pki.client_key,
        )
        assert settings.problem() is None
        metrics = TainterMetrics()
        async with aiohttp.ClientSession() as session:
            evidence = PrometheusEvidence(
                session=session,
                access=PrometheusAccess(settings),
                queries={"gpu-overheat": QUERY},
                metrics=metrics,
            )
            result = await evidence.condition_clear(node="gpu-1", reason="gpu-overheat")
            assert result.clear, result.detail
            assert api.queries == ['up{node="gpu-1"} == 1']
            wanted[0] = basic("tainter", "rotated")
            refused = await evidence.condition_clear(node="gpu-1", reason="gpu-overheat")
        assert not refused.clear
        assert "refused the credentials: HTTP 401" in refused.detail
        errors = metrics.registry.get_sample_value(
            TAINTER_SOURCE_ERRORS_TOTAL.name, {"source": "prometheus"}
        )
        assert errors == 1.0
