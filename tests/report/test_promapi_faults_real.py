"""The report's Prometheus client against a real Prometheus behind the fault proxy
(`testbed.fault_proxy`): 503s and a reset are retried with bounded attempts and the answer is
Prometheus' own; an answer marked partial comes back with its data and names what is
missing; an outage longer than the retries is one typed error. One Prometheus for the module.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from fleetwatch.promclient import PrometheusAccess, PrometheusClientSettings
from fleetwatch.report.promapi import PrometheusClient, PrometheusUnreachable
from fleetwatch.sim.loopback_servers import prometheus
from testbed.fault_proxy import Fault, FaultProxy

pytestmark = pytest.mark.integration

RANGE = r"^/api/v1/query_range\?"


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FaultProxy, str]]:
    with prometheus(tmp_path_factory.mktemp("prometheus"), scrape_configs=[]) as prom:
        proxy = FaultProxy(upstream=prom.url)
        with proxy.serve() as url:
            yield proxy, url


def client(url: str) -> PrometheusClient:
    return PrometheusClient(
        access=PrometheusAccess(PrometheusClientSettings(url=url)), retries=3, backoff_s=0.05
    )


async def test_errors_are_retried_and_partial_answers_name_what_is_missing(
    proxied: tuple[FaultProxy, str],
) -> None:
    proxy, url = proxied
    proxy.clear()
    proxy.add(
        Fault.answer(503, path=RANGE),
        Fault.reset(path=RANGE),
        Fault.warn("remote read from store-b failed: partial data", path=RANGE),
    )
    end = time.time()
    async with client(url) as prom:
        answer = await prom.query_range("vector(3)", start=end - 60, end=end, step=15)
    assert [s.fault for s in proxy.seen(path=RANGE)] == ["answer", "reset", "warn"]
    assert {v for series in answer.series for v in series.values} == {3.0}
    assert answer.warnings == ["remote read from store-b failed: partial data"]


async def test_an_outage_longer_than_the_retries_is_one_typed_error(
    proxied: tuple[FaultProxy, str],
) -> None:
    proxy, url = proxied
    proxy.clear()
    proxy.add(Fault.answer(503, path=RANGE, times=0))
    end = time.time()
    async with client(url) as prom:
        with pytest.raises(PrometheusUnreachable, match="HTTP 503"):
            await prom.query_range("vector(3)", start=end - 60, end=end, step=15)
    assert len(proxy.seen(path=RANGE)) == 4  # the first try and three retries, no more
