"""The Kubernetes objects the tainter reads and writes, and the checked parsing of their JSON.

`NodeView`, `PodView` and `Lease` are what the controller, removal from the run and leader
election see of a node, a pod and a Lease; `Taint` and `NodeCondition` are the entries
they write. `*_from_api` turn the API server's JSON into them and check its shape first: a
body that is not the object asked for raises `Malformed` (an `ApiError`), never an
AttributeError deep in the controller. The client that fetches and writes them is
`fleetwatch.tainter.kube`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final


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
    boot_id: str = ""  # status.nodeInfo.bootID: the kubelet's, new after each boot
    unschedulable: bool = False  # spec.unschedulable: cordoned (never ours to touch)


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
    status = _object(data.get("status"), "node status")
    raw_conditions = status.get("conditions") or []
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
        unschedulable=spec.get("unschedulable") is True,
        boot_id=_text(_object(status.get("nodeInfo"), "node nodeInfo").get("bootID"), "bootID"),
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


def _items(data: Any, what: str) -> list[Any]:
    """The `items` of a list's JSON form (absent counts as empty), else Malformed."""
    items = _object(data, what).get("items") or []
    if not isinstance(items, list):
        raise Malformed(f"{what} items")
    return items


def nodes_from_api(data: Any) -> list[NodeView]:
    """The NodeViews of a node list's JSON form; Malformed when it is not a node list."""
    return [node_from_api(item) for item in _items(data, "node list")]


def pods_from_api(data: Any) -> list[PodView]:
    """The PodViews of a pod list's JSON form; Malformed when it is not a pod list."""
    return [pod_from_api(item) for item in _items(data, "pod list")]


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
