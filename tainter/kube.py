"""The Kubernetes side of the tainter: a narrow node/event API and its real client.

`NodeApi` is the seam: the controller reads nodes as `NodeView`s and writes taints with
a merge patch guarded by `metadata.resourceVersion` (a stale one answers 409 and the
controller re-reads). `KubeNodeApi` implements it with kubernetes_asyncio, configured
from a kubeconfig file or the in-cluster service account by the library itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client, config

MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True, slots=True)
class Taint:
    """One entry of `spec.taints`."""

    key: str
    value: str
    effect: str
    time_added: str | None = None

    def to_api(self) -> dict[str, str]:
        """The JSON form the API server takes."""
        body = {"key": self.key, "value": self.value, "effect": self.effect}
        if self.time_added:
            body["timeAdded"] = self.time_added
        return body


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the tainter reads of a node."""

    name: str
    uid: str
    resource_version: str
    taints: tuple[Taint, ...]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


class ApiError(Exception):
    """The Kubernetes API failed; `status` is the HTTP status (0 when unreachable)."""

    def __init__(self, *, status: int, reason: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {reason}" if status else reason)
        self.status = status
        self.reason = reason


class Conflict(ApiError):
    """The node changed since it was read (409): re-read and retry."""


class NodeApi(Protocol):
    """The node and event operations the controller needs."""

    async def get_node(self, name: str) -> NodeView: ...

    async def list_nodes(self, *, label_selector: str = "") -> list[NodeView]: ...

    async def patch_node(
        self,
        name: str,
        *,
        resource_version: str,
        taints: Sequence[Taint] | None,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> NodeView:
        """Merge-patch labels/annotations (None deletes) and replace `spec.taints` whole
        (None leaves it alone), only if the node is still at `resource_version`."""
        ...

    async def create_event(
        self,
        *,
        node: NodeView,
        reason: str,
        message: str,
        warning: bool,
    ) -> None: ...


def now_rfc3339() -> str:
    """The current UTC time as Kubernetes writes it (seconds precision)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_from_api(data: Mapping[str, Any]) -> NodeView:
    """A NodeView from a node's JSON form."""
    meta = data.get("metadata") or {}
    spec = data.get("spec") or {}
    return NodeView(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        resource_version=meta.get("resourceVersion", ""),
        taints=tuple(
            Taint(
                key=t.get("key", ""),
                value=t.get("value") or "",
                effect=t.get("effect", ""),
                time_added=t.get("timeAdded"),
            )
            for t in spec.get("taints") or ()
        ),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
    )


def merge_patch_body(
    *,
    resource_version: str,
    taints: Sequence[Taint] | None,
    labels: Mapping[str, str | None],
    annotations: Mapping[str, str | None],
) -> dict[str, Any]:
    """The JSON merge patch for a guarded taint write."""
    metadata: dict[str, Any] = {"resourceVersion": resource_version}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    body: dict[str, Any] = {"metadata": metadata}
    if taints is not None:
        body["spec"] = {"taints": [t.to_api() for t in taints]}
    return body


class KubeNodeApi:
    """NodeApi over kubernetes_asyncio. Use `await KubeNodeApi.connect(...)`, then `close()`."""

    def __init__(
        self,
        *,
        api_client: client.ApiClient,
        event_namespace: str,
        component: str,
        timeout: float,
    ) -> None:
        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)
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
                    raise ApiError(status=response.status, reason=_status_message(body))
                return json.loads(body)
        except client.ApiException as exc:
            raise ApiError(status=exc.status or 0, reason=str(exc.reason)) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(status=0, reason=f"Kubernetes API unreachable: {exc!r}") from exc

    async def get_node(self, name: str) -> NodeView:
        return node_from_api(await self._call(self._core.read_node, name))

    async def list_nodes(self, *, label_selector: str = "") -> list[NodeView]:
        data = await self._call(self._core.list_node, label_selector=label_selector)
        return [node_from_api(item) for item in data.get("items") or ()]

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
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{node.name}.fleetwatch-"),
            involved_object=client.V1ObjectReference(
                api_version="v1",
                kind="Node",
                name=node.name,
                uid=node.uid or None,
            ),
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
        await self._call(self._core.create_namespaced_event, self._event_namespace, event)


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
