"""The fake Kubernetes API keeps the semantics the tainter's safety depends on."""

from __future__ import annotations

import json
from typing import Any

from aiohttp.test_utils import TestClient
from fleetwatch.sim.kubeapi import FakeCluster

AUTH = {"Authorization": "Bearer kube-token"}
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
