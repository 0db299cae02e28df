"""The webhook receiver: auth, size cap, strict validation, fuzzed bodies, 5xx on API failure."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetwatch.sim.kubeapi import FakeCluster
from tests.tainter.conftest import AUTH, Client, alert, keys, post, webhook


async def test_valid_notification_taints(tainter_client: Client, cluster: FakeCluster) -> None:
    status, body = await post(tainter_client, webhook(alert("gpu-1")))
    assert (status, body) == (200, {"status": "ok", "alerts": 1})
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]


async def test_alerts_without_taint_label_are_ignored(
    tainter_client: Client, cluster: FakeCluster
) -> None:
    plain = alert("gpu-1")
    del plain["labels"]["fleetwatch_taint"]
    status, body = await post(tainter_client, webhook(plain))
    assert (status, body["alerts"]) == (200, 0)
    assert cluster.writes == []


async def test_unknown_keys_are_tolerated(tainter_client: Client, cluster: FakeCluster) -> None:
    body = webhook({**alert("gpu-2"), "someNewField": {"x": 1}})
    body["anotherNewTopLevelKey"] = [1, 2]
    status, _ = await post(tainter_client, body)
    assert status == 200
    assert keys(cluster, "gpu-2") == ["fleetwatch.io/gpu-overheat"]


async def test_bad_requests_get_clear_4xx_and_write_nothing(
    tainter_client: Client, cluster: FakeCluster
) -> None:
    no_node = alert("gpu-1")
    del no_node["labels"]["node"]
    cases: list[tuple[Any, dict[str, str] | None, int, str]] = [
        (webhook(alert("gpu-1")), {}, 401, "bearer token"),
        (webhook(alert("gpu-1")), {"Authorization": "Bearer wrong"}, 401, "bearer token"),
        ({**webhook(alert("gpu-1")), "version": "3"}, None, 400, "version"),
        (webhook(no_node), None, 400, "node"),
        (webhook(alert("gpu-1", effect="Evict")), None, 400, "fleetwatch_taint_effect"),
        (webhook(alert("gpu-1", reason="bad reason!")), None, 400, "taint key"),
        (webhook({**alert("gpu-1"), "status": "maybe"}), None, 400, "status"),
        (webhook({**alert("gpu-1"), "startsAt": "2026-12-01T10:00:00"}), None, 400, "time zone"),
        (webhook({**alert("gpu-1"), "startsAt": "0001-01-01T00:00:00Z"}), None, 400, "missing"),
        (webhook({**alert("gpu-1"), "fingerprint": ["fp"]}), None, 400, "fingerprint"),
        (webhook({**alert("gpu-1"), "fingerprint": ""}), None, 400, "fingerprint"),
        (b"{not json", None, 400, "not JSON"),
        (b"x" * (65 * 1024), None, 413, "larger than"),
    ]
    for body, headers, want_status, want_text in cases:
        status, answer = await post(tainter_client, body, headers)
        assert status == want_status, (body if isinstance(body, dict) else body[:40], answer)
        assert want_text in answer["error"]
    assert cluster.writes == []
    metrics = await (await tainter_client.get("/metrics")).text()
    assert 'fleetwatch_tainter_webhook_requests_total{result="unauthorized"} 2.0' in metrics
    assert 'fleetwatch_tainter_webhook_requests_total{result="too_large"} 1.0' in metrics


async def test_api_outage_answers_503_then_retry_succeeds(
    tainter_client: Client, cluster: FakeCluster
) -> None:
    cluster.faults.outage = True
    status, body = await post(tainter_client, webhook(alert("gpu-1")))
    assert status == 503
    assert "retry" in body["error"]
    cluster.faults.outage = False
    status, _ = await post(tainter_client, webhook(alert("gpu-1")))  # Alertmanager retries
    assert status == 200
    assert keys(cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"]


async def test_health_metrics_and_no_breaker_reset_over_the_webhook(tainter_client: Client) -> None:
    assert (await tainter_client.get("/healthz")).status == 200
    assert (await tainter_client.get("/readyz")).status == 200  # no election: always leader
    metrics = await (await tainter_client.get("/metrics")).text()
    assert "fleetwatch_tainter_breaker_open 0.0" in metrics
    # the webhook token can never lift the safety cap: there is no such route
    assert (await tainter_client.post("/breaker/reset", headers=AUTH)).status in (404, 405)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
label_values = st.sampled_from(
    ["gpu-1", "", "GPUOverheating", "gpu-overheat", "NoExecute", "x y", "ünï", "a" * 70]
)
fuzzed_alert = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(["firing", "resolved", "other"]) | json_values,
        "labels": st.dictionaries(
            st.sampled_from(
                ["alertname", "node", "fleetwatch_taint", "fleetwatch_taint_effect", "gpu"]
            ),
            label_values,
        )
        | json_values,
        "startsAt": st.sampled_from(
            ["2025-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "yesterday", "2025-01-01T00:00:00"]
        )
        | json_values,
        "endsAt": st.sampled_from(["0001-01-01T00:00:00Z", "nope"]) | json_values,
        "fingerprint": st.text(max_size=6) | json_values,
    },
)
fuzzed_body = (
    st.fixed_dictionaries(
        {},
        optional={
            "version": st.sampled_from(["4", "3", 4]) | json_values,
            "alerts": st.lists(fuzzed_alert, max_size=3) | json_values,
            "status": json_values,
        },
    )
    | json_values
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=fuzzed_body)
async def test_fuzzed_bodies_never_crash_and_rejections_write_nothing(
    tainter_client: Client, cluster: FakeCluster, body: Any
) -> None:
    before = len(cluster.writes)
    status, answer = await post(tainter_client, body)
    assert status in (200, 400), answer
    if status == 400:
        assert answer["error"]
        assert len(cluster.writes) == before
    for left in answer.get("left_alone", ()):
        assert left["why"]
        assert left["refused"]
    declared = {"fleetwatch.io/" + r for r in ("gpu-overheat", "xid", "gpu-lost")}
    for node in cluster.nodes:
        assert set(keys(cluster, node)) <= declared  # the policy held whatever came in
        assert all(t["effect"] != "NoExecute" for t in cluster.taints(node))
