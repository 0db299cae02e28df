"""A stand-in Kubernetes API server that lets the real Helm library install a chart.

helm-sdkpy has no client-only render (`helm template`), but its install returns the
release's rendered manifest and NOTES. An install needs an API server for discovery
(`/version`, `/api`, `/apis`, resource lists), the pre-install existence check (GET of
each object: 404 here unless seeded), the creates (POST: echoed back) and the adoption
of seeded objects (PATCH: accepted). This server answers exactly that for the kinds the
chart uses and serves seeded objects to Helm's `lookup`. Only Helm's install path is
covered; it is no general fake of Kubernetes semantics.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Kind:
    group_version: str
    kind: str
    plural: str
    namespaced: bool = True


CORE_KINDS = (
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "Secret", "secrets"),
    Kind("v1", "Service", "services"),
    Kind("v1", "ServiceAccount", "serviceaccounts"),
    Kind("v1", "Namespace", "namespaces", namespaced=False),
    Kind("apps/v1", "DaemonSet", "daemonsets"),
    Kind("apps/v1", "Deployment", "deployments"),
    Kind("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", namespaced=False),
    Kind(
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        namespaced=False,
    ),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    Kind(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        namespaced=False,
    ),
    Kind(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        namespaced=False,
    ),
)
OPERATOR_KINDS = (
    Kind("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors"),
    Kind("monitoring.coreos.com/v1", "PodMonitor", "podmonitors"),
    Kind("monitoring.coreos.com/v1", "PrometheusRule", "prometheusrules"),
    Kind("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig", "alertmanagerconfigs"),
)
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


@dataclass
class FakeKubeApi:
    """State of the stand-in server: the kinds it serves and the objects seeded in it."""

    kinds: tuple[Kind, ...] = CORE_KINDS + OPERATOR_KINDS
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def seed(self, path: str, obj: Mapping[str, Any]) -> None:
        """Serve `obj` at the object URL `path` (e.g. /api/v1/namespaces/x/secrets/y)."""
        with self.lock:
            self.objects[path] = dict(obj)

    def groups(self) -> dict[str, list[Kind]]:
        by_group: dict[str, list[Kind]] = {}
        for kind in self.kinds:
            by_group.setdefault(kind.group_version, []).append(kind)
        return by_group

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        """The status and JSON body for one request."""
        groups = self.groups()
        if path == "/version":
            return 200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0"}
        if path == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"]}
        if path == "/apis":
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": self._group_list()}
        prefix = "/api/" if path.startswith("/api/") else "/apis/"
        group_version = path.removeprefix(prefix)
        if group_version in groups:
            return 200, self._resource_list(group_version, groups[group_version])
        if method == "POST":
            return 201, self._create(path, body)
        with self.lock:
            seeded = self.objects.get(path)
        if seeded is not None and method in ("GET", "PATCH", "PUT"):
            return 200, seeded  # a write to a seeded object is accepted, not applied
        if method == "GET" and self._is_collection(path):
            return 200, {"kind": "List", "apiVersion": "v1", "items": [], "metadata": {}}
        return 404, {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "NotFound",
            "code": 404,
        }

    def _create(self, path: str, body: bytes) -> dict[str, Any]:
        """Echo a JSON create. Helm's release store (a typed client) sends protobuf, which
        is not decoded here: it gets back a bare object of its kind."""
        try:
            obj: dict[str, Any] = json.loads(body)
        except ValueError:
            plural = path.rstrip("/").rsplit("/", 1)[-1]
            kind = next(k for k in self.kinds if k.plural == plural)
            return {"apiVersion": kind.group_version, "kind": kind.kind, "metadata": {}}
        return obj

    def _group_list(self) -> list[dict[str, Any]]:
        names: dict[str, list[str]] = {}
        for group_version in self.groups():
            if "/" in group_version:
                group, version = group_version.split("/")
                names.setdefault(group, []).append(version)
        return [
            {
                "name": group,
                "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                "preferredVersion": {
                    "groupVersion": f"{group}/{versions[0]}",
                    "version": versions[0],
                },
            }
            for group, versions in names.items()
        ]

    @staticmethod
    def _resource_list(group_version: str, kinds: list[Kind]) -> dict[str, Any]:
        return {
            "kind": "APIResourceList",
            "groupVersion": group_version,
            "resources": [
                {
                    "name": k.plural,
                    "singularName": k.kind.lower(),
                    "namespaced": k.namespaced,
                    "kind": k.kind,
                    "verbs": VERBS,
                }
                for k in kinds
            ],
        }

    def _is_collection(self, path: str) -> bool:
        return any(path.endswith("/" + kind.plural) for kind in self.kinds)


def _handler(api: FakeKubeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, payload = api.answer(self.command, self.path.split("?")[0], body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            del format, args  # quiet: pytest shows failures, not every request

    return Handler


@contextlib.contextmanager
def serve(api: FakeKubeApi, kubeconfig: Path) -> Iterator[Path]:
    """Serve `api` on a loopback port; write a kubeconfig for it; stop on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    thread = threading.Thread(target=server.serve_forever, name="fake-kube-api", daemon=True)
    thread.start()
    port = server.server_port
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "fake", "user": {"token": "fake"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                "current-context": "fake",
            }
        )
    )
    try:
        yield kubeconfig
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
