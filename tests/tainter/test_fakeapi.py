"""The simulated Kubernetes API keeps the semantics the tainter's safety depends on.

The tainter's own tests run on a real API server; the simulated one serves the demo, the
end-to-end and HA stacks and the injected faults, so it must answer as a real one would."""

from __future__ import annotations

import json
from typing import Any

from aiohttp.test_utils import TestClient

from fleetwatch.sim.kubeapi import FakeCluster

AUTH = {"Authorization": "Bearer kube-token"}
LEASES = "/apis/coordination.k8s.io/v1/namespaces/fw/leases"
Client = TestClient[Any, Any]


async def patch(kube_http: Client, body: Any, content_type: str) -> tuple[int, Any]:
    response = await kube_http.patch(
        "/api/v1/nodes/gpu-1", data=json.dumps(body), headers={**AUTH, "Content-Type": content_type}
    )
    return response.status, await response.json()


async def get(kube_http: Client) -> Any:
    return await (await kube_http.get("/api/v1/nodes/gpu-1", headers=AUTH)).json()


async def test_requires_token(kube_http: Client) -> None:
    assert (await kube_http.get("/api/v1/nodes/gpu-1")).status == 401


async def test_merge_patch_replaces_taints_whole_and_bumps_version(kube_http: Client) -> None:
    first = await get(kube_http)
    taints = [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoSchedule"}]
    status, node = await patch(
        kube_http, {"spec": {"taints": taints}}, "application/merge-patch+json"
    )
    assert status == 200
    status, node = await patch(
        kube_http, {"spec": {"taints": [taints[1]]}}, "application/strategic-merge-patch+json"
    )
    assert node["spec"]["taints"] == [taints[1]]
    assert int(node["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])


async def test_stale_resource_version_is_409(kube_http: Client) -> None:
    version = (await get(kube_http))["metadata"]["resourceVersion"]
    ok, _ = await patch(
        kube_http,
        {"metadata": {"resourceVersion": version, "labels": {"x": "1"}}},
        "application/merge-patch+json",
    )
    stale, body = await patch(
        kube_http,
        {"metadata": {"resourceVersion": version, "labels": {"x": "2"}}},
        "application/merge-patch+json",
    )
    assert (ok, stale, body["reason"]) == (200, 409, "Conflict")
    assert (await get(kube_http))["metadata"]["labels"]["x"] == "1"


async def test_json_patch_failed_test_is_422_and_changes_nothing(kube_http: Client) -> None:
    version = (await get(kube_http))["metadata"]["resourceVersion"]
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "0"},
        {"op": "add", "path": "/spec/taints", "value": []},
    ]
    status, _ = await patch(kube_http, ops, "application/json-patch+json")
    assert status == 422
    assert (await get(kube_http))["metadata"]["resourceVersion"] == version
    ops[0]["value"] = version
    status, node = await patch(kube_http, ops, "application/json-patch+json")
    assert (status, node["spec"]["taints"]) == (200, [])


async def test_injected_statuses_and_label_selector(
    kube_http: Client, cluster: FakeCluster
) -> None:
    cluster.faults.statuses.extend([429, 500])
    assert (await kube_http.get("/api/v1/nodes", headers=AUTH)).status == 429
    assert (await kube_http.get("/api/v1/nodes", headers=AUTH)).status == 500
    cluster.mutate("gpu-1", lambda n: n["metadata"]["labels"].update(pool="a"))
    response = await kube_http.get(
        "/api/v1/nodes", params={"labelSelector": "pool=a"}, headers=AUTH
    )
    assert [n["metadata"]["name"] for n in (await response.json())["items"]] == ["gpu-1"]
    response = await kube_http.get("/api/v1/nodes", params={"labelSelector": "!pool"}, headers=AUTH)
    assert len((await response.json())["items"]) == 9


def lease_body(holder: str, version: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "lock"}
    if version is not None:
        metadata["resourceVersion"] = version
    return {
        "metadata": metadata,
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": 0},
    }


async def test_fake_leases_have_real_semantics(kube_http: Client) -> None:
    created = await kube_http.post(LEASES, json=lease_body("a"), headers=AUTH)
    assert created.status == 201
    version = (await created.json())["metadata"]["resourceVersion"]
    again = await kube_http.post(LEASES, json=lease_body("b"), headers=AUTH)
    assert (again.status, (await again.json())["reason"]) == (409, "AlreadyExists")
    ok = await kube_http.put(f"{LEASES}/lock", json=lease_body("b", version), headers=AUTH)
    assert ok.status == 200
    stale = await kube_http.put(f"{LEASES}/lock", json=lease_body("c", version), headers=AUTH)
    assert (stale.status, (await stale.json())["reason"]) == (409, "Conflict")
    blind = await kube_http.put(f"{LEASES}/lock", json=lease_body("c"), headers=AUTH)
    assert blind.status == 409  # a replace must say which version it read
    bad = lease_body("c", (await ok.json())["metadata"]["resourceVersion"])
    bad["spec"]["leaseDurationSeconds"] = "15"
    assert (await kube_http.put(f"{LEASES}/lock", json=bad, headers=AUTH)).status == 422
    current = await (await kube_http.get(f"{LEASES}/lock", headers=AUTH)).json()
    assert current["spec"]["holderIdentity"] == "b"
    assert (await kube_http.get(f"{LEASES}/other", headers=AUTH)).status == 404
    patched = await kube_http.patch(
        f"{LEASES}/lock",
        data=json.dumps({"metadata": {"annotations": {"x": "1"}}}),
        headers={**AUTH, "Content-Type": "application/merge-patch+json"},
    )
    body = await patched.json()
    assert (patched.status, body["metadata"]["annotations"], body["spec"]["holderIdentity"]) == (
        200,
        {"x": "1"},
        "b",
    )
