"""A simulated Kubernetes API for nodes and events, with the real semantics that matter.

No API server can run on a laptop or in CI, so tests and `fleetwatch demo` point the real
client library at this aiohttp app through a generated kubeconfig. It keeps what makes
taint writes hard: every write bumps `metadata.resourceVersion`; a write carrying a stale
one answers 409; a JSON patch whose `test` op fails answers 422; merge and strategic-merge
patches replace `spec.taints` whole (the list has no merge key). Faults can be injected:
a queue of error statuses (429, 500, ...), added latency, a full outage, and callbacks run
just before the next write (another writer racing us).
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


class FakeCluster:
    """Nodes and events in memory, with a cluster-wide increasing resourceVersion."""

    def __init__(self, *, token: str | None = None) -> None:
        self.token = token
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.writes: list[Write] = []
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
    if cluster.token is not None and request.headers.get("Authorization") != (
        f"Bearer {cluster.token}"
    ):
        return _status(401, "Unauthorized", "Unauthorized")
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
    try:
        body = json.loads(await request.read())
    except ValueError:
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
    cluster.writes.append(Write(node=node["metadata"]["name"], kind=kind, body=body))
    return web.json_response(candidate)


async def _create_event(request: web.Request) -> web.Response:
    cluster = request.app[CLUSTER_KEY]
    try:
        event = json.loads(await request.read())
    except ValueError:
        return _status(400, "BadRequest", "body is not JSON")
    metadata = event.setdefault("metadata", {})
    metadata.setdefault("name", metadata.get("generateName", "event-") + uuid.uuid4().hex[:8])
    metadata["namespace"] = request.match_info["namespace"]
    cluster.events.append(event)
    return web.json_response(event, status=201)


async def _list_events(request: web.Request) -> web.Response:
    cluster = request.app[CLUSTER_KEY]
    namespace = request.match_info.get("namespace")
    items = [
        e for e in cluster.events if namespace is None or e["metadata"]["namespace"] == namespace
    ]
    return web.json_response({"apiVersion": "v1", "kind": "EventList", "items": items})


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
