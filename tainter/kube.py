"""The Kubernetes side of the tainter: a narrow node/pod/event/Lease API and its real client.

`NodeApi` is the seam: the controller reads nodes as `NodeView`s and writes taints with
a merge patch guarded by `metadata.resourceVersion` (a stale one answers 409 and the
controller re-reads). `LeaseApi` reads and writes the `coordination.k8s.io/v1` Lease that
leader election and the breaker's state live on. `KubeNodeApi` implements both with
kubernetes_asyncio, configured from a kubeconfig file or the in-cluster service account
by the library itself. `PodApi` is what removal from the run and the node condition need:
pods bound to a node, the policy/v1 Eviction subresource, the node's status conditions.
Every reply is checked for shape before use: a body that is not
the object asked for raises ApiError, never an AttributeError deep in the controller.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol

import aiohttp
from kubernetes_asyncio import client, config

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


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
class NodeCondition:
    """One entry of `status.conditions` (a list keyed by `type`)."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    last_heartbeat_time: str | None = None

    def to_api(self) -> dict[str, str]:
        """The JSON form the API server takes."""
        body = {"type": self.type, "status": self.status}
        for key, value in (
            ("reason", self.reason),
            ("message", self.message),
            ("lastTransitionTime", self.last_transition_time),
            ("lastHeartbeatTime", self.last_heartbeat_time),
        ):
            if value:
                body[key] = value
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
    conditions: tuple[NodeCondition, ...] = ()


@dataclass(frozen=True, slots=True)
class PodView:
    """What removal from the run reads of a pod."""

    namespace: str
    name: str
    uid: str
    node_name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owner_kinds: tuple[str, ...]
    phase: str
    terminating: bool  # metadata.deletionTimestamp is set
    gpu_request: bool  # some container's limits or requests name nvidia.com/gpu


class ApiError(Exception):
    """The Kubernetes API failed; `status` is the HTTP status (0 when unreachable)."""

    def __init__(self, *, status: int, reason: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {reason}" if status else reason)
        self.status = status
        self.reason = reason


class Conflict(ApiError):
    """The object changed since it was read (409): re-read and retry."""


class Malformed(ApiError):
    """The API answered 2xx with a body that is not the object asked for."""

    def __init__(self, what: str) -> None:
        super().__init__(status=0, reason=f"Kubernetes API answered a malformed {what}")


@dataclass(frozen=True, slots=True)
class Lease:
    """A `coordination.k8s.io/v1` Lease: its spec, annotations and resourceVersion."""

    name: str
    resource_version: str
    holder: str
    duration_seconds: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int
    annotations: Mapping[str, str]

    def to_api(self, *, namespace: str) -> dict[str, Any]:
        """The JSON form for create and replace (a replace is guarded by the version)."""
        metadata: dict[str, Any] = {
            "name": self.name,
            "namespace": namespace,
            "annotations": dict(self.annotations),
        }
        if self.resource_version:
            metadata["resourceVersion"] = self.resource_version
        spec: dict[str, Any] = {"leaseTransitions": self.transitions}
        if self.holder:
            spec["holderIdentity"] = self.holder
        if self.duration_seconds:
            spec["leaseDurationSeconds"] = self.duration_seconds
        if self.acquire_time:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time:
            spec["renewTime"] = self.renew_time
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }


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


class PodApi(Protocol):
    """The pod, eviction and node-status operations of removal from the run."""

    async def list_pods(
        self, *, node: str | None = None, namespace: str | None = None, label_selector: str = ""
    ) -> list[PodView]:
        """Pods bound to `node` (every namespace), or of `namespace`, matching the selector."""
        ...

    async def evict_pod(self, *, namespace: str, name: str) -> None:
        """Create a policy/v1 Eviction: the API server honours PodDisruptionBudgets (429)."""
        ...

    async def patch_node_conditions(
        self, name: str, *, resource_version: str, conditions: Sequence[NodeCondition]
    ) -> NodeView:
        """Strategic-merge `status.conditions` (merged by type: other conditions stay),
        only if the node is still at `resource_version` (else Conflict)."""
        ...

    async def create_pod_event(
        self, *, pod: PodView, reason: str, message: str, warning: bool
    ) -> None:
        """Record an Event on `pod`, in the pod's namespace."""
        ...


class RemediationApi(NodeApi, PodApi, Protocol):
    """Nodes and pods: what the node condition and removal from the run call (the real
    client; they check leadership and `--dry-run` themselves)."""


class LeaseApi(Protocol):
    """The Lease operations leader election and the breaker's state need."""

    async def get_lease(self, *, namespace: str, name: str) -> Lease:
        """The Lease; ApiError with status 404 when it does not exist."""
        ...

    async def create_lease(self, *, namespace: str, lease: Lease) -> Lease:
        """Create it; Conflict when another process created it first."""
        ...

    async def replace_lease(self, *, namespace: str, lease: Lease) -> Lease:
        """Replace it whole, only if still at `lease.resource_version` (else Conflict)."""
        ...

    async def patch_lease_annotations(
        self, *, namespace: str, name: str, resource_version: str, annotations: Mapping[str, str]
    ) -> Lease:
        """Merge-patch annotations, only if still at `resource_version` (else Conflict)."""
        ...


def now_rfc3339() -> str:
    """The current UTC time as Kubernetes writes it (seconds precision)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339(seconds: float) -> str:
    """A Unix time as Kubernetes writes times (UTC, seconds precision)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: object) -> int:
    """Unix seconds of a UTC time written as `rfc3339` writes it; ValueError otherwise."""
    if not isinstance(text, str) or not text.endswith("Z"):
        raise ValueError(f"{text!r} is not an RFC 3339 UTC time")
    return int(datetime.fromisoformat(text.removesuffix("Z") + "+00:00").timestamp())


def now_micro() -> str:
    """The current UTC time as a Kubernetes MicroTime (Lease acquire and renew times)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _object(value: Any, what: str) -> Mapping[str, Any]:
    """`value` if it is a JSON object (absent counts as empty), else Malformed."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Malformed(what)
    return value


def _strings(value: Any, what: str) -> dict[str, str]:
    mapping = _object(value, what)
    if not all(isinstance(v, str) for v in mapping.values()):
        raise Malformed(what)
    return dict(mapping)


def _text(value: Any, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Malformed(what)
    return value


def node_from_api(data: Any) -> NodeView:
    """A NodeView from a node's JSON form; Malformed when it is not shaped like a node."""
    if not isinstance(data, dict):
        raise Malformed("node")
    meta = _object(data.get("metadata"), "node metadata")
    spec = _object(data.get("spec"), "node spec")
    raw_taints = spec.get("taints") or []
    if not isinstance(raw_taints, list):
        raise Malformed("node spec.taints")
    taints = []
    for raw in raw_taints:
        taint = _object(raw, "taint")
        taints.append(
            Taint(
                key=_text(taint.get("key"), "taint key"),
                value=_text(taint.get("value"), "taint value"),
                effect=_text(taint.get("effect"), "taint effect"),
                time_added=_text(taint.get("timeAdded"), "taint timeAdded") or None,
            )
        )
    name = _text(meta.get("name"), "node name")
    if not name:
        raise Malformed("node without a name")
    raw_conditions = _object(data.get("status"), "node status").get("conditions") or []
    if not isinstance(raw_conditions, list):
        raise Malformed("node status.conditions")
    return NodeView(
        name=name,
        uid=_text(meta.get("uid"), "node uid"),
        resource_version=_text(meta.get("resourceVersion"), "node resourceVersion"),
        taints=tuple(taints),
        labels=_strings(meta.get("labels"), "node labels"),
        annotations=_strings(meta.get("annotations"), "node annotations"),
        conditions=tuple(_condition(raw) for raw in raw_conditions),
    )


def _condition(raw: Any) -> NodeCondition:
    condition = _object(raw, "node condition")
    return NodeCondition(
        type=_text(condition.get("type"), "condition type"),
        status=_text(condition.get("status"), "condition status"),
        reason=_text(condition.get("reason"), "condition reason"),
        message=_text(condition.get("message"), "condition message"),
        last_transition_time=_text(condition.get("lastTransitionTime"), "condition time") or None,
        last_heartbeat_time=_text(condition.get("lastHeartbeatTime"), "condition time") or None,
    )


GPU_RESOURCE: Final = "nvidia.com/gpu"


def _requests_gpu(spec: Mapping[str, Any]) -> bool:
    """True when a container (or init container) limits or requests nvidia.com/gpu."""
    for group in ("containers", "initContainers"):
        containers = spec.get(group) or []
        if not isinstance(containers, list):
            raise Malformed(f"pod spec.{group}")
        for raw in containers:
            resources = _object(_object(raw, "container").get("resources"), "resources")
            for kind in ("limits", "requests"):
                if GPU_RESOURCE in _object(resources.get(kind), f"resources.{kind}"):
                    return True
    return False


def pod_from_api(data: Any) -> PodView:
    """A PodView from a pod's JSON form; Malformed when it is not shaped like a pod."""
    if not isinstance(data, dict):
        raise Malformed("pod")
    meta = _object(data.get("metadata"), "pod metadata")
    spec = _object(data.get("spec"), "pod spec")
    owners = meta.get("ownerReferences") or []
    if not isinstance(owners, list):
        raise Malformed("pod ownerReferences")
    name = _text(meta.get("name"), "pod name")
    if not name:
        raise Malformed("pod without a name")
    return PodView(
        namespace=_text(meta.get("namespace"), "pod namespace"),
        name=name,
        uid=_text(meta.get("uid"), "pod uid"),
        node_name=_text(spec.get("nodeName"), "pod spec.nodeName"),
        labels=_strings(meta.get("labels"), "pod labels"),
        annotations=_strings(meta.get("annotations"), "pod annotations"),
        owner_kinds=tuple(_text(_object(o, "owner").get("kind"), "owner kind") for o in owners),
        phase=_text(_object(data.get("status"), "pod status").get("phase"), "pod phase"),
        terminating=meta.get("deletionTimestamp") is not None,
        gpu_request=_requests_gpu(spec),
    )


def lease_from_api(data: Any) -> Lease:
    """A Lease from its JSON form; Malformed when it is not shaped like a Lease."""
    if not isinstance(data, dict):
        raise Malformed("Lease")
    meta = _object(data.get("metadata"), "Lease metadata")
    spec = _object(data.get("spec"), "Lease spec")
    duration = spec.get("leaseDurationSeconds") or 0
    transitions = spec.get("leaseTransitions") or 0
    if not isinstance(duration, int) or not isinstance(transitions, int):
        raise Malformed("Lease spec")
    return Lease(
        name=_text(meta.get("name"), "Lease name"),
        resource_version=_text(meta.get("resourceVersion"), "Lease resourceVersion"),
        holder=_text(spec.get("holderIdentity"), "Lease holderIdentity"),
        duration_seconds=duration,
        acquire_time=_text(spec.get("acquireTime"), "Lease acquireTime") or None,
        renew_time=_text(spec.get("renewTime"), "Lease renewTime") or None,
        transitions=transitions,
        annotations=_strings(meta.get("annotations"), "Lease annotations"),
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
        self._coordination = client.CoordinationV1Api(api_client)
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
                try:
                    return json.loads(body)
                except ValueError as exc:
                    raise Malformed("body (not JSON)") from exc
        except client.ApiException as exc:
            raise ApiError(status=exc.status or 0, reason=str(exc.reason)) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(status=0, reason=f"Kubernetes API unreachable: {exc!r}") from exc

    async def get_node(self, name: str) -> NodeView:
        return node_from_api(await self._call(self._core.read_node, name))

    async def list_nodes(self, *, label_selector: str = "") -> list[NodeView]:
        data = _object(
            await self._call(self._core.list_node, label_selector=label_selector), "node list"
        )
        items = data.get("items") or []
        if not isinstance(items, list):
            raise Malformed("node list items")
        return [node_from_api(item) for item in items]

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
        items = _object(data, "pod list").get("items") or []
        if not isinstance(items, list):
            raise Malformed("pod list items")
        return [pod_from_api(item) for item in items]

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
