"""The Kubernetes side of the tainter: the narrow node/pod/event/Lease API and its real client.

The seam the controller sees is `fleetwatch.tainter.backend` (`NodeApi`, `LeaseApi`,
`PodApi`), which knows no orchestrator; `KubeNodeApi` implements them all with kubernetes_asyncio,
configured from a kubeconfig file or the in-cluster service account by the library
itself. The objects it returns, and the shape checks on every reply, are in
`fleetwatch.tainter.kube_objects`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from fleetwatch.tainter.backend import (
    LeaseApi,
    NodeApi,
    PodApi,
    RemediationApi,
    RepairTicket,
    RepairView,
)
from fleetwatch.tainter.kube_objects import (
    ApiError,
    Conflict,
    Lease,
    Malformed,
    NodeCondition,
    NodeView,
    PodView,
    Taint,
    lease_from_api,
    merge_patch_body,
    node_from_api,
    nodes_from_api,
    pods_from_api,
)
from fleetwatch.tainter.kube_repair import KubeRepairs
from fleetwatch.tainter.repair_settings import RepairSettings
from fleetwatch.tainter.writes import Throttled, retry_after

__all__ = ["KubeNodeApi", "LeaseApi", "NodeApi", "PodApi", "RemediationApi"]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class KubeNodeApi:
    """NodeApi over kubernetes_asyncio. Use `await KubeNodeApi.connect(...)`, then `close()`."""

    def __init__(
        self,
        *,
        api_client: client.ApiClient,
        event_namespace: str,
        component: str,
        timeout: float,
        repairs: RepairSettings | None = None,
    ) -> None:
        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self._coordination = client.CoordinationV1Api(api_client)
        self._batch = client.BatchV1Api(api_client)
        # Repairs (`tainter.kube_repair`) only when --repair.mode is not off.
        self._repairs = (
            KubeRepairs(api=self, settings=repairs)
            if repairs is not None and repairs.mode != "off"
            else None
        )
        self._event_namespace = event_namespace
        self._component = component
        self._timeout = timeout

    @classmethod
    async def connect(
        cls,
        *,
        kubeconfig: Path | None,
        event_namespace: str = "default",
        component: str = "fleetwatch-tainter",
        timeout: float = 10.0,
        repairs: RepairSettings | None = None,
    ) -> KubeNodeApi:
        """Configure from `kubeconfig`, or from the pod's service account when None."""
        configuration = client.Configuration()
        if kubeconfig is None:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await config.load_kube_config(
                config_file=str(kubeconfig),
                client_configuration=configuration,
                persist_config=False,
            )
        configuration.connection_pool_maxsize = 64
        return cls(
            api_client=client.ApiClient(configuration),
            event_namespace=event_namespace,
            component=component,
            timeout=timeout,
            repairs=repairs,
        )

    async def close(self) -> None:
        """Close the client's connection pool."""
        await self._api_client.close()

    async def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """Call a generated API method for its raw JSON; map failures to ApiError."""
        try:
            response = await method(
                *args, _preload_content=False, _request_timeout=self._timeout, **kwargs
            )
            async with response:
                body = await response.read()
                if response.status == 409:
                    raise Conflict(status=409, reason=_status_message(body))
                if not 200 <= response.status < 300:
                    reason = _status_message(body)
                    wait = retry_after(response.headers.get("Retry-After"))
                    if wait is not None:  # 429 and 503 ask to be retried after a while
                        raise Throttled(status=response.status, reason=reason, retry_after=wait)
                    raise ApiError(status=response.status, reason=reason)
                try:
                    return json.loads(body)
                except ValueError as exc:
                    raise Malformed("body (not JSON)") from exc
        except client.ApiException as exc:
            wait = retry_after(exc.headers.get("Retry-After") if exc.headers else None)
            if wait is not None:
                raise Throttled(
                    status=exc.status or 0, reason=str(exc.reason), retry_after=wait
                ) from exc
            raise ApiError(status=exc.status or 0, reason=str(exc.reason)) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(status=0, reason=f"Kubernetes API unreachable: {exc!r}") from exc

    async def get_node(self, name: str) -> NodeView:
        return node_from_api(await self._call(self._core.read_node, name))

    async def list_nodes(self, *, label_selector: str = "") -> list[NodeView]:
        return nodes_from_api(await self._call(self._core.list_node, label_selector=label_selector))

    async def get_lease(self, *, namespace: str, name: str) -> Lease:
        return lease_from_api(
            await self._call(self._coordination.read_namespaced_lease, name, namespace)
        )

    async def create_lease(self, *, namespace: str, lease: Lease) -> Lease:
        body = lease.to_api(namespace=namespace)
        return lease_from_api(
            await self._call(self._coordination.create_namespaced_lease, namespace, body)
        )

    async def replace_lease(self, *, namespace: str, lease: Lease) -> Lease:
        body = lease.to_api(namespace=namespace)
        return lease_from_api(
            await self._call(
                self._coordination.replace_namespaced_lease, lease.name, namespace, body
            )
        )

    async def patch_lease_annotations(
        self, *, namespace: str, name: str, resource_version: str, annotations: Mapping[str, str]
    ) -> Lease:
        body = {"metadata": {"resourceVersion": resource_version, "annotations": annotations}}
        return lease_from_api(
            await self._call(
                self._coordination.patch_namespaced_lease,
                name,
                namespace,
                body,
                _content_type=MERGE_PATCH,
            )
        )

    async def patch_node(
        self,
        name: str,
        *,
        resource_version: str,
        taints: Sequence[Taint] | None,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> NodeView:
        body = merge_patch_body(
            resource_version=resource_version,
            taints=taints,
            labels=labels,
            annotations=annotations,
        )
        data = await self._call(self._core.patch_node, name, body, _content_type=MERGE_PATCH)
        return node_from_api(data)

    async def create_event(
        self,
        *,
        node: NodeView,
        reason: str,
        message: str,
        warning: bool,
    ) -> None:
        await self._event(
            namespace=self._event_namespace,
            involved=client.V1ObjectReference(
                api_version="v1", kind="Node", name=node.name, uid=node.uid or None
            ),
            prefix=node.name,
            reason=reason,
            message=message,
            warning=warning,
        )

    async def _event(
        self,
        *,
        namespace: str,
        involved: client.V1ObjectReference,
        prefix: str,
        reason: str,
        message: str,
        warning: bool,
    ) -> None:
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{prefix}.fleetwatch-"),
            involved_object=involved,
            reason=reason,
            message=message,
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component=self._component),
            reporting_component=self._component,
            reporting_instance=self._component,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        await self._call(self._core.create_namespaced_event, namespace, event)

    async def list_pods(
        self, *, node: str | None = None, namespace: str | None = None, label_selector: str = ""
    ) -> list[PodView]:
        fields = f"spec.nodeName={node}" if node is not None else ""
        if namespace is None:
            data = await self._call(
                self._core.list_pod_for_all_namespaces,
                field_selector=fields,
                label_selector=label_selector,
            )
        else:
            data = await self._call(
                self._core.list_namespaced_pod,
                namespace,
                field_selector=fields,
                label_selector=label_selector,
            )
        return pods_from_api(data)

    async def evict_pod(self, *, namespace: str, name: str) -> None:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        await self._call(self._core.create_namespaced_pod_eviction, name, namespace, body)

    async def patch_node_conditions(
        self, name: str, *, resource_version: str, conditions: Sequence[NodeCondition]
    ) -> NodeView:
        body = {
            "metadata": {"resourceVersion": resource_version},
            "status": {"conditions": [c.to_api() for c in conditions]},
        }
        data = await self._call(
            self._core.patch_node_status, name, body, _content_type=STRATEGIC_MERGE_PATCH
        )
        return node_from_api(data)

    async def create_pod_event(
        self, *, pod: PodView, reason: str, message: str, warning: bool
    ) -> None:
        await self._event(
            namespace=pod.namespace,
            involved=client.V1ObjectReference(
                api_version="v1",
                kind="Pod",
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid or None,
            ),
            prefix=pod.name,
            reason=reason,
            message=message,
            warning=warning,
        )

    @property
    def can_repair(self) -> bool:
        """Whether repairs are on (`backend.RepairApi`)."""
        return self._repairs is not None

    async def repair_view(
        self, name: str, *, repair: str, ticket: RepairTicket | None
    ) -> RepairView:
        return await self._repairer().repair_view(name, repair=repair, ticket=ticket)

    async def start_repair(
        self, node: NodeView, *, repair: str, reason: str, alert: str
    ) -> RepairTicket:
        return await self._repairer().start_repair(node, repair=repair, reason=reason, alert=alert)

    def _repairer(self) -> KubeRepairs:
        if self._repairs is None:
            raise ApiError(status=501, reason="repairs are off (--repair.mode=off)")
        return self._repairs

    async def create_job(self, *, namespace: str, body: Mapping[str, Any]) -> None:
        """Create a batch/v1 Job (the GPU reset's, `tainter.kube_repair`); Conflict when one of
        that name exists."""
        await self._call(self._batch.create_namespaced_job, namespace, dict(body))

    async def get_job(self, *, namespace: str, name: str) -> Mapping[str, Any]:
        """A Job's JSON form; ApiError 404 when there is none."""
        data = await self._call(self._batch.read_namespaced_job, name, namespace)
        if not isinstance(data, dict):
            raise Malformed("Job")
        return data


def _status_message(body: bytes) -> str:
    """The `message` of a Kubernetes Status body, or the body itself."""
    try:
        data = json.loads(body)
    except ValueError:
        return body[:200].decode(errors="replace")
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str):
        return message
    return body[:200].decode(errors="replace")
