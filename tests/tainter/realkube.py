"""The tainter's tests on a real Kubernetes API server (testbed/kube_apiserver.py): who the server
knows, and a view of its nodes, Events and Leases shaped like the simulated cluster's
(`taints`, `nodes`, `events_for`, `mutate`), so a test reads the same on either."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.kube_apiserver import ApiServer, Identity, bound_pod, service_account
from tests.deploy.chart import NAMESPACE, RELEASE, Release

# The chart's tainter ServiceAccount (release RELEASE in NAMESPACE), as the API server sees
# a pod running under it; test_rbac_real checks the rendered chart names the same one.
TAINTER = service_account(NAMESPACE, f"{RELEASE}-fleetwatch-tainter")
# A person with no rights but those a test binds to the group.
TESTER = Identity("tester", "tester", ("fleetwatch:testers",))
IDENTITIES = (TAINTER, TESTER)
GPU_LABELS = {"nvidia.com/gpu.present": "true"}
EVENTS_NAMESPACE = "default"


@dataclass(frozen=True)
class RealCluster:
    """Nodes, Events and Leases of a real API server, read and written as admin."""

    server: ApiServer

    def reset(self, *, nodes: int = 10, lease_namespaces: tuple[str, ...] = ()) -> None:
        """Start a test from `nodes` fresh GPU nodes (gpu-0...), no Events, no Leases in
        `lease_namespaces` (created when missing)."""
        self.server.call("DELETE", "/api/v1/nodes")
        self.server.call("DELETE", f"/api/v1/namespaces/{EVENTS_NAMESPACE}/events")
        for namespace in lease_namespaces:
            self.server.apply(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
            self.server.call(
                "DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
            )
        for index in range(nodes):
            name = f"gpu-{index}"
            self.server.call(
                "POST",
                "/api/v1/nodes",
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name, "labels": GPU_LABELS},
                },
            )
            # The TaintNodesByCondition admission plugin gives a new node the
            # node.kubernetes.io/not-ready taint; the node lifecycle controller (absent here)
            # removes it once the kubelet reports Ready. Do its part: a ready GPU node.
            self.server.call(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"spec": {"taints": None}},
                content_type="application/merge-patch+json",
            )

    def node(self, name: str) -> dict[str, Any]:
        """The node as the server has it now."""
        node: dict[str, Any] = self.server.call("GET", f"/api/v1/nodes/{name}")
        return node

    @property
    def nodes(self) -> dict[str, dict[str, Any]]:
        """Every node by name, with `labels` and `annotations` always present."""
        items = self.server.call("GET", "/api/v1/nodes")["items"]
        for item in items:
            item["metadata"].setdefault("labels", {})
            item["metadata"].setdefault("annotations", {})
        return {item["metadata"]["name"]: item for item in items}

    def versions(self) -> dict[str, str]:
        """Every node's resourceVersion: unchanged means nothing wrote any node."""
        return {name: n["metadata"]["resourceVersion"] for name, n in self.nodes.items()}

    def taints(self, name: str) -> list[dict[str, Any]]:
        """`spec.taints` of the node (empty when it has none)."""
        taints: list[dict[str, Any]] = self.node(name).get("spec", {}).get("taints", [])
        return taints

    def mutate(self, name: str, change: Callable[[dict[str, Any]], Any]) -> None:
        """Change the node as another writer would: read, change, replace (guarded)."""
        node = self.node(name)
        node["metadata"].setdefault("labels", {})
        node["metadata"].setdefault("annotations", {})
        node.setdefault("spec", {})
        change(node)
        self.server.call("PUT", f"/api/v1/nodes/{name}", node)

    def events_for(self, name: str, reason: str) -> list[dict[str, Any]]:
        """Events about node `name` with `reason`, oldest first."""
        selector = urllib.parse.quote(f"involvedObject.name={name},reason={reason}")
        items: list[dict[str, Any]] = self.server.call(
            "GET", f"/api/v1/namespaces/{EVENTS_NAMESPACE}/events?fieldSelector={selector}"
        )["items"]
        return sorted(items, key=lambda e: e["metadata"]["creationTimestamp"])

    def fresh_namespace(self, namespace: str) -> None:
        """`namespace` with its `default` ServiceAccount (no controller-manager makes it),
        no pods, no PodDisruptionBudgets and no Events."""
        self.server.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
        self.server.apply(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "default", "namespace": namespace},
            }
        )
        # no kubelet confirms a graceful deletion: remove them at once, as it would
        self.server.call("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0")
        self.server.call("DELETE", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets")
        self.server.call("DELETE", f"/api/v1/namespaces/{namespace}/events")

    def run_pod(self, name: str, *, namespace: str, node: str, **kwargs: Any) -> dict[str, Any]:
        """Create a pod bound to `node` and report it Running and Ready, as its kubelet
        would (`testbed.kube_apiserver.bound_pod` takes the keyword arguments)."""
        pod = self.server.call(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            bound_pod(name, namespace=namespace, node=node, **kwargs),
        )
        pod["status"] = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        found: dict[str, Any] = self.server.call(
            "PUT", f"/api/v1/namespaces/{namespace}/pods/{name}/status", pod
        )
        return found

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        """The pod as the server has it now."""
        found: dict[str, Any] = self.server.call(
            "GET", f"/api/v1/namespaces/{namespace}/pods/{name}"
        )
        return found

    def terminating(self, namespace: str) -> set[str]:
        """Names of the pods of `namespace` that have a deletionTimestamp (evicted)."""
        items = self.server.call("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        return {p["metadata"]["name"] for p in items if p["metadata"].get("deletionTimestamp")}

    def remove_pod(self, namespace: str, name: str) -> None:
        """Finish a graceful deletion as the kubelet would once the containers stopped."""
        self.server.call(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}?gracePeriodSeconds=0"
        )

    def pod_events(self, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
        """Events about pod `name` with `reason`."""
        selector = urllib.parse.quote(f"involvedObject.name={name},reason={reason}")
        items: list[dict[str, Any]] = self.server.call(
            "GET", f"/api/v1/namespaces/{namespace}/events?fieldSelector={selector}"
        )["items"]
        return items

    def budget(self, namespace: str, name: str, *, selector: dict[str, str], allowed: int) -> None:
        """A PodDisruptionBudget whose status allows `allowed` disruptions (no disruption
        controller runs here: the status is written as it would compute it)."""
        path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
        status, current = self.server.request("GET", f"{path}/{name}")
        if status == 404:
            current = self.server.call(
                "POST",
                path,
                {
                    "apiVersion": "policy/v1",
                    "kind": "PodDisruptionBudget",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"minAvailable": 1, "selector": {"matchLabels": selector}},
                },
            )
        current["status"] = {
            "observedGeneration": current["metadata"].get("generation", 1),
            "disruptionsAllowed": allowed,
            "currentHealthy": 1 + allowed,
            "desiredHealthy": 1,
            "expectedPods": 1 + allowed,
        }
        self.server.call("PUT", f"{path}/{name}/status", current)

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease, or None when there is none."""
        status, lease = self.server.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        )
        if status == 404:
            return None
        assert status == 200, lease
        found: dict[str, Any] = lease
        return found


# Chart values with every tainter feature on (removal from the run is off by default).
ALL_FEATURES = {
    "tainter": {
        "evict": {"reasons": ["gpu-overheat"]},
        "repair": {"mode": "on", "kinds": ["gpu-reset"], "resetByReboot": False},
    }
}
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def apply_release(server: ApiServer, release: Release, kinds: tuple[str, ...]) -> None:
    """Apply the chart's objects of `kinds` (creating the namespaces they live in)."""
    objects = [o for o in release.objects if o["kind"] in kinds]
    for namespace in sorted({o["metadata"].get("namespace", "") for o in objects} - {""}):
        server.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for obj in objects:
        server.apply(obj)


def wait_for(probe: Callable[[], bool], *, what: str, timeout: float = 30.0) -> None:
    """Poll `probe` until true (RBAC and admission policies take effect within moments of
    being applied, not at once)."""
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)
