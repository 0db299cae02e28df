"""A simulated Kubernetes API for nodes, events and Leases, with the real semantics that matter.

No API server can run on a laptop or in CI, so tests and `fleetwatch demo` point the real
client library at this aiohttp app through a generated kubeconfig. It keeps what makes
taint writes hard: every write bumps `metadata.resourceVersion`; a write carrying a stale
one answers 409; a JSON patch whose `test` op fails answers 422; merge and strategic-merge
patches replace `spec.taints` whole (the list has no merge key). Faults can be injected:
a queue of error statuses (429, 500, ...), added latency, a full outage, and callbacks run
just before the next write (another writer racing us).

`coordination.k8s.io/v1` Leases behave as leader election needs: create answers 409 when
the Lease exists, replace and patch answer 409 on a stale resourceVersion, and the spec
(`holderIdentity`, `leaseDurationSeconds`, `acquireTime`, `renewTime`, `leaseTransitions`)
is checked for type. Each bearer token is a user; every accepted write is recorded with
the user that made it, so a test can prove who wrote (and who never did).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from aiohttp import web

CLUSTER_KEY: Final = web.AppKey["FakeCluster"]("cluster")
USER_KEY: Final = web.RequestKey("user", str)
ADMIN: Final = "admin"
NOT_JSON: Final = object()
LEASES: Final = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
JSON_PATCH: Final = "application/json-patch+json"
MERGE_PATCHES: Final = frozenset(
    {"application/merge-patch+json", "application/strategic-merge-patch+json"}
)


class PatchFailed(Exception):
    """A JSON patch op that cannot apply (422)."""


@dataclass
class Faults:
    """What the fake does wrong on purpose."""

    statuses: deque[int] = field(default_factory=deque)  # next requests fail with these
    latency_s: float = 0.0
    outage: bool = False  # every request answers 503
    before_write: deque[Callable[[FakeCluster], None]] = field(default_factory=deque)


@dataclass
class Write:
    """One accepted write, for tests that assert what was (not) written."""

    node: str
    kind: str  # "merge", "json-patch" or "put"
    body: Any
    user: str = ADMIN


class FakeCluster:
    """Nodes and events in memory, with a cluster-wide increasing resourceVersion."""

    def __init__(self, *, token: str | None = None, users: dict[str, str] | None = None) -> None:
        """`token` authenticates the user `admin`; `users` maps more tokens to user names.
        With neither, every request is accepted as `admin` (a loopback-only simulation)."""
        self.token = token
        self.users = {**({token: ADMIN} if token else {}), **(users or {})}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[Write] = []
        self.writers: list[tuple[str, str]] = []  # (user, what) of every accepted write
        self.faults = Faults()
        self._versions = itertools.count(1)

    def _bump(self, node: dict[str, Any]) -> None:
        node["metadata"]["resourceVersion"] = str(next(self._versions))

    def add_node(self, name: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """Create a node with no taints."""
        node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid4()),
                "labels": dict(labels or {}),
                "annotations": {},
            },
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        self._bump(node)
        self.nodes[name] = node
        return node

    def mutate(self, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        """Change a node as another writer would (bumps its resourceVersion)."""
        change(self.nodes[name])
        self._bump(self.nodes[name])

    def taints(self, name: str) -> list[dict[str, Any]]:
        """The node's `spec.taints` (a copy)."""
        return copy.deepcopy(self.nodes[name]["spec"].get("taints") or [])

    def events_for(self, name: str, reason: str | None = None) -> list[dict[str, Any]]:
        """Events whose involvedObject is node `name` (optionally with `reason`)."""
        return [
            e
            for e in self.events
            if e.get("involvedObject", {}).get("name") == name
            and (reason is None or e.get("reason") == reason)
        ]


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch: objects merge, null deletes, lists are replaced whole."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            child = target.get(key)
            if not isinstance(child, dict):
                child = target[key] = {}
            _merge(child, value)
        else:
            target[key] = copy.deepcopy(value)


def _pointer(doc: Any, path: str) -> tuple[Any, str | int]:
    """The parent container and final token of an RFC 6901 pointer."""
    if not path.startswith("/"):
        raise PatchFailed(f"path {path!r} must start with /")
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]
    parent = doc
    for token in tokens[:-1]:
        try:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        except (KeyError, IndexError, ValueError) as exc:
            raise PatchFailed(f"path {path!r} does not exist") from exc
    last = tokens[-1]
    if isinstance(parent, list):
        return parent, (len(parent) if last == "-" else int(last))
    if not isinstance(parent, dict):
        raise PatchFailed(f"path {path!r} does not exist")
    return parent, last


def _json_patch(doc: dict[str, Any], ops: Any) -> None:
    """RFC 6902 add/remove/replace/test on `doc` (in place)."""
    if not isinstance(ops, list):
        raise PatchFailed("a JSON patch is a list of operations")
    for op in ops:
        if not isinstance(op, dict) or "path" not in op:
            raise PatchFailed(f"bad operation {op!r}")
        parent, token = _pointer(doc, op["path"])
        kind = op.get("op")
        try:
            if kind == "test":
                current = parent[token]
                if current != op.get("value"):
                    raise PatchFailed(f"test failed at {op['path']}")
            elif kind == "add":
                if isinstance(parent, list):
                    parent.insert(int(token), copy.deepcopy(op.get("value")))
                else:
                    parent[token] = copy.deepcopy(op.get("value"))
            elif kind == "remove":
                del parent[token]
            elif kind == "replace":
                parent[token]  # must exist before replace
                parent[token] = copy.deepcopy(op.get("value"))
            else:
                raise PatchFailed(f"unsupported op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise PatchFailed(f"op {kind} failed at {op['path']}: {exc!r}") from exc


def _matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selector: `a=b`, `a==b`, `a!=b`, `a`, `!a`, comma-joined."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


@web.middleware
async def _faults_and_auth(
    request: web.Request, handler: Callable[[web.Request], Any]
) -> web.StreamResponse:
    cluster = request.app[CLUSTER_KEY]
    if request.path == "/readyz":  # like a real API server: readiness needs no token
        ready: web.StreamResponse = await handler(request)
        return ready
    if cluster.users:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        user = cluster.users.get(token) if scheme == "Bearer" else None
        if user is None:
            return _status(401, "Unauthorized", "Unauthorized")
        request[USER_KEY] = user
    else:
        request[USER_KEY] = ADMIN
    if cluster.faults.latency_s:
        await asyncio.sleep(cluster.faults.latency_s)
    if cluster.faults.outage:
        return _status(503, "ServiceUnavailable", "simulated API outage")
    if cluster.faults.statuses:
        code = cluster.faults.statuses.popleft()
        return _status(code, "Injected", f"injected failure {code}")
    response: web.StreamResponse = await handler(request)
    return response


def _node_or_404(request: web.Request) -> dict[str, Any] | web.Response:
    cluster = request.app[CLUSTER_KEY]
    name = request.match_info["name"]
    node: dict[str, Any] | None = cluster.nodes.get(name)
    if node is None:
        return _status(404, "NotFound", f'nodes "{name}" not found')
    return node


async def _list_nodes(request: web.Request) -> web.Response:
    cluster = request.app[CLUSTER_KEY]
    selector = request.query.get("labelSelector", "")
    items = [n for n in cluster.nodes.values() if _matches(n["metadata"]["labels"], selector)]
    return web.json_response(
        {
            "apiVersion": "v1",
            "kind": "NodeList",
            "items": items,
            "metadata": {"resourceVersion": str(next(cluster._versions))},
        }
    )


async def _get_node(request: web.Request) -> web.Response:
    node = _node_or_404(request)
    return node if isinstance(node, web.Response) else web.json_response(node)


async def _write_node(request: web.Request) -> web.Response:
    cluster = request.app[CLUSTER_KEY]
    while cluster.faults.before_write:
        cluster.faults.before_write.popleft()(cluster)
    node = _node_or_404(request)
    if isinstance(node, web.Response):
        return node
    body = await _read_json(request)
    if body is NOT_JSON:
        return _status(400, "BadRequest", "body is not JSON")
    content_type = request.content_type
    candidate = copy.deepcopy(node)
    if request.method == "PUT" or content_type in MERGE_PATCHES:
        if not isinstance(body, dict):
            return _status(400, "BadRequest", "body must be an object")
        version = (body.get("metadata") or {}).get("resourceVersion")
        if version is not None and version != node["metadata"]["resourceVersion"]:
            return _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on nodes "'
                f'{node["metadata"]["name"]}": the object has been modified; '
                "please apply your changes to the latest version and try again",
            )
        if request.method == "PUT":
            for part in ("labels", "annotations"):
                candidate["metadata"][part] = dict((body.get("metadata") or {}).get(part) or {})
            candidate["spec"] = copy.deepcopy(body.get("spec") or {})
            kind = "put"
        else:
            patch = copy.deepcopy(body)
            (patch.get("metadata") or {}).pop("resourceVersion", None)
            _merge(candidate, patch)
            kind = "merge"
    elif content_type == JSON_PATCH:
        try:
            _json_patch(candidate, body)
        except PatchFailed as exc:
            return _status(422, "Invalid", str(exc))
        kind = "json-patch"
    else:
        return _status(415, "UnsupportedMediaType", f"content type {content_type!r}")
    for fixed in ("name", "uid"):
        candidate["metadata"][fixed] = node["metadata"][fixed]
    cluster._bump(candidate)
    cluster.nodes[node["metadata"]["name"]] = candidate
    user = request[USER_KEY]
    cluster.writes.append(Write(node=node["metadata"]["name"], kind=kind, body=body, user=user))
    cluster.writers.append((user, f"node/{node['metadata']['name']}"))
    return web.json_response(candidate)


async def _create_event(request: web.Request) -> web.Response:
    cluster = request.app[CLUSTER_KEY]
    event = await _read_json(request)
    if not isinstance(event, dict):
        return _status(400, "BadRequest", "body is not a JSON object")
    metadata = event.setdefault("metadata", {})
    metadata.setdefault("name", metadata.get("generateName", "event-") + uuid.uuid4().hex[:8])
    metadata["namespace"] = request.match_info["namespace"]
    cluster.events.append(event)
    cluster.writers.append((request[USER_KEY], f"event/{metadata['name']}"))
    return web.json_response(event, status=201)


async def _list_events(request: web.Request) -> web.Response:
    cluster = request.app[CLUSTER_KEY]
    namespace = request.match_info.get("namespace")
    items = [
        e for e in cluster.events if namespace is None or e["metadata"]["namespace"] == namespace
    ]
    return web.json_response({"apiVersion": "v1", "kind": "EventList", "items": items})


_LEASE_SPEC_TYPES: Final = {
    "holderIdentity": str,
    "leaseDurationSeconds": int,
    "acquireTime": str,
    "renewTime": str,
    "leaseTransitions": int,
}


def _lease_invalid(lease: Any) -> str | None:
    """Why `lease` is not a valid Lease object (the API server's 422), or None."""
    if not isinstance(lease, dict) or not isinstance(lease.get("metadata") or {}, dict):
        return "a Lease is an object with metadata"
    spec = lease.get("spec") or {}
    if not isinstance(spec, dict):
        return "spec: expected an object"
    for key, value in spec.items():
        kind = _LEASE_SPEC_TYPES.get(key)
        if kind is None:
            return f"spec.{key}: unknown field"
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            return f"spec.{key}: expected {kind.__name__}"
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and duration < 1:
        return "spec.leaseDurationSeconds: must be greater than 0"
    return None


def _lease_or_404(request: web.Request) -> dict[str, Any] | web.Response:
    cluster = request.app[CLUSTER_KEY]
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    lease = cluster.leases.get((namespace, name))
    if lease is None:
        return _status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
    return lease


def _store_lease(request: web.Request, lease: dict[str, Any], *, verb: str) -> web.Response:
    cluster = request.app[CLUSTER_KEY]
    namespace = request.match_info["namespace"]
    lease["apiVersion"] = "coordination.k8s.io/v1"
    lease["kind"] = "Lease"
    lease["metadata"]["namespace"] = namespace
    cluster._bump(lease)
    cluster.leases[(namespace, lease["metadata"]["name"])] = lease
    cluster.writers.append((request[USER_KEY], f"lease/{verb}/{lease['metadata']['name']}"))
    return web.json_response(lease, status=201 if verb == "create" else 200)


async def _read_json(request: web.Request) -> Any:
    """The request body decoded, or NOT_JSON (the caller answers 400)."""
    try:
        return json.loads(await request.read())
    except ValueError:
        return NOT_JSON


async def _get_lease(request: web.Request) -> web.Response:
    lease = _lease_or_404(request)
    return lease if isinstance(lease, web.Response) else web.json_response(lease)


async def _create_lease(request: web.Request) -> web.Response:
    cluster = request.app[CLUSTER_KEY]
    body = await _read_json(request)
    if body is NOT_JSON:
        return _status(400, "BadRequest", "body is not JSON")
    problem = _lease_invalid(body)
    if problem is not None:
        return _status(422, "Invalid", problem)
    name = (body.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        return _status(422, "Invalid", "metadata.name: Required value")
    if (request.match_info["namespace"], name) in cluster.leases:
        return _status(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists')
    lease = copy.deepcopy(body)
    lease["metadata"] = {
        "name": name,
        "uid": str(uuid.uuid4()),
        "annotations": dict(body["metadata"].get("annotations") or {}),
        "labels": dict(body["metadata"].get("labels") or {}),
    }
    return _store_lease(request, lease, verb="create")


def _stale(body: dict[str, Any], current: dict[str, Any], *, required: bool) -> bool:
    version = (body.get("metadata") or {}).get("resourceVersion")
    if version is None:
        return required
    return bool(version != current["metadata"]["resourceVersion"])


async def _write_lease(request: web.Request) -> web.Response:
    current = _lease_or_404(request)
    if isinstance(current, web.Response):
        return current
    body = await _read_json(request)
    if not isinstance(body, dict):
        return _status(400, "BadRequest", "body must be a JSON object")
    if request.method == "PATCH" and request.content_type not in MERGE_PATCHES:
        return _status(415, "UnsupportedMediaType", f"content type {request.content_type!r}")
    # A replace must carry the version it read (an update without one is refused here,
    # as leader election must never blindly overwrite); a patch may carry one as a guard.
    if _stale(body, current, required=request.method == "PUT"):
        name = current["metadata"]["name"]
        return _status(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": '
            "the object has been modified; please apply your changes to the latest "
            "version and try again",
        )
    if request.method == "PUT":
        candidate = copy.deepcopy(body)
        candidate["metadata"] = {
            **current["metadata"],
            "annotations": dict((body.get("metadata") or {}).get("annotations") or {}),
            "labels": dict((body.get("metadata") or {}).get("labels") or {}),
        }
    else:
        candidate = copy.deepcopy(current)
        patch = copy.deepcopy(body)
        (patch.get("metadata") or {}).pop("resourceVersion", None)
        _merge(candidate, patch)
        for fixed in ("name", "uid"):
            candidate["metadata"][fixed] = current["metadata"][fixed]
    problem = _lease_invalid(candidate)
    if problem is not None:
        return _status(422, "Invalid", problem)
    return _store_lease(request, candidate, verb="update")


async def _ready(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app(cluster: FakeCluster) -> web.Application:
    """The aiohttp application serving `cluster` under the real API paths."""
    app = web.Application(middlewares=[_faults_and_auth])
    app[CLUSTER_KEY] = cluster
    app.router.add_get("/readyz", _ready)
    app.router.add_get("/api/v1/nodes", _list_nodes)
    app.router.add_get("/api/v1/nodes/{name}", _get_node)
    app.router.add_patch("/api/v1/nodes/{name}", _write_node)
    app.router.add_put("/api/v1/nodes/{name}", _write_node)
    app.router.add_post("/api/v1/namespaces/{namespace}/events", _create_event)
    app.router.add_get("/api/v1/namespaces/{namespace}/events", _list_events)
    app.router.add_get("/api/v1/events", _list_events)
    app.router.add_post(LEASES, _create_lease)
    app.router.add_get(LEASES + "/{name}", _get_lease)
    app.router.add_put(LEASES + "/{name}", _write_lease)
    app.router.add_patch(LEASES + "/{name}", _write_lease)
    return app


def kubeconfig(*, server: str, token: str | None) -> dict[str, Any]:
    """A kubeconfig (as a dict) that points a client at the fake API."""
    user: dict[str, Any] = {"token": token} if token else {}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "fleetwatch-simulated",
        "clusters": [{"name": "fleetwatch-simulated", "cluster": {"server": server}}],
        "users": [{"name": "fleetwatch-simulated", "user": user}],
        "contexts": [
            {
                "name": "fleetwatch-simulated",
                "context": {"cluster": "fleetwatch-simulated", "user": "fleetwatch-simulated"},
            }
        ],
    }


def write_kubeconfig(path: Path, *, server: str, token: str | None) -> Path:
    """Write `kubeconfig(...)` to `path` (mode 0600: it may hold a token)."""
    path.write_text(yaml.safe_dump(kubeconfig(server=server, token=token)))
    path.chmod(0o600)
    return path
