"""The chart's rendered RBAC, applied to a real API server and asked, as the tainter's
ServiceAccount, what it may do (SelfSubjectAccessReview, as `kubectl auth can-i`): every
call tainter/kube.py makes is allowed, and the neighbours of those calls are not. The chart
is rendered with every feature on (eviction is off by default; tests/deploy/test_chart.py
checks its rights come only with it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import pytest

from testbed.kube_apiserver import ApiServer
from tests.deploy import fakekube
from tests.deploy.chart import NAMESPACE, Release, default_values, install, tainter_api_calls
from tests.tainter.realkube import ALL_FEATURES, RBAC_KINDS, TAINTER, apply_release, wait_for

pytestmark = pytest.mark.integration


class Access(NamedTuple):
    verb: str
    resource: str
    group: str = ""
    namespace: str = ""
    name: str = ""
    subresource: str = ""


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """The chart rendered with its default values and eviction on."""
    path = tmp_path_factory.mktemp("helm") / "kubeconfig.json"
    with fakekube.serve(fakekube.FakeKubeApi(), path) as kubeconfig:
        yield install(kubeconfig, ALL_FEATURES)


@pytest.fixture(scope="module")
def rbac(api_server: ApiServer, release: Release) -> ApiServer:
    """The real server with the chart's ServiceAccount, roles and bindings applied."""
    apply_release(api_server, release, RBAC_KINDS)
    wait_for(
        lambda: api_server.allowed(TAINTER, verb="list", resource="nodes"),
        what="the chart's ClusterRoleBinding to take effect",
    )
    return api_server


def lease_name(release: Release) -> str:
    args = release.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    return str(next(a for a in args if a.startswith("--leader-elect.name=")).split("=", 1)[1])


def used(release: Release) -> list[Access]:
    """Every call the tainter makes, where it makes it (from tainter/kube.py's source)."""
    events = default_values()["tainter"]["eventsNamespace"]
    where = {
        "nodes": Access("", "nodes"),
        "nodes/status": Access("", "nodes", subresource="status"),
        "pods": Access("", "pods"),
        "pods/eviction": Access("", "pods", namespace="team-a", subresource="eviction"),
        "events": Access("", "events", namespace=events),
        "leases": Access(
            "", "leases", group="coordination.k8s.io", namespace=NAMESPACE, name=lease_name(release)
        ),
        "jobs": Access("", "jobs", group="batch", namespace=NAMESPACE),
    }
    calls = tainter_api_calls() | tainter_api_calls("_coordination") | tainter_api_calls("_batch")
    accesses = []
    for resource, verb in sorted(calls):
        base = where[resource]
        # RBAC cannot limit create by name: a create is asked without one.
        name = "" if verb == "create" else base.name
        accesses.append(base._replace(verb=verb, name=name))
    return accesses


def test_the_chart_binds_the_service_account_the_tests_impersonate(release: Release) -> None:
    account = release.one("ServiceAccount", "tainter")["metadata"]
    assert TAINTER.user == f"system:serviceaccount:{account['namespace']}:{account['name']}"


def test_every_call_the_tainter_makes_is_allowed(rbac: ApiServer, release: Release) -> None:
    accesses = used(release)
    assert {a.resource for a in accesses} == {"nodes", "pods", "events", "leases", "jobs"}
    # an evicted pod's Events go to the pod's namespace
    accesses.append(Access("create", "events", namespace="team-a"))
    refused = [a for a in accesses if not rbac.allowed(TAINTER, **a._asdict())]
    assert refused == []


@pytest.mark.parametrize(
    "access",
    [
        Access("delete", "nodes"),
        Access("create", "nodes"),
        Access("update", "nodes"),
        Access("watch", "nodes"),
        Access("update", "nodes", subresource="status"),
        Access("get", "secrets", namespace=NAMESPACE),
        Access("list", "secrets"),
        Access("delete", "pods", namespace="default"),
        Access("deletecollection", "pods", namespace="default"),
        Access("create", "pods", namespace="default"),
        Access("patch", "pods", namespace="default"),
        Access("watch", "pods"),
        Access("update", "pods", namespace="default", subresource="status"),
        Access("list", "poddisruptionbudgets", group="policy"),
        Access("get", "configmaps", namespace=NAMESPACE),
        Access("patch", "events", namespace="default"),
        Access("delete", "leases", group="coordination.k8s.io", namespace=NAMESPACE),
        Access("list", "leases", group="coordination.k8s.io", namespace=NAMESPACE),
        Access("update", "leases", group="coordination.k8s.io", namespace=NAMESPACE, name="other"),
        Access("create", "leases", group="coordination.k8s.io", namespace="default"),
        Access("escalate", "clusterroles", group="rbac.authorization.k8s.io"),
        Access("impersonate", "serviceaccounts", namespace=NAMESPACE),
        Access("create", "jobs", group="batch", namespace="default"),
        Access("delete", "jobs", group="batch", namespace=NAMESPACE),
        Access("list", "jobs", group="batch", namespace=NAMESPACE),
        Access("create", "pods", namespace=NAMESPACE),
    ],
    ids=lambda a: "-".join(p for p in (a.verb, a.resource, a.subresource, a.name) if p),
)
def test_nothing_the_tainter_does_not_call_is_allowed(rbac: ApiServer, access: Access) -> None:
    assert not rbac.allowed(TAINTER, **access._asdict())


def test_the_refusal_is_real_not_just_a_review(rbac: ApiServer) -> None:
    status, body = rbac.request("DELETE", "/api/v1/nodes/gpu-0", identity=TAINTER)
    assert status == 403, body
    assert TAINTER.user in body["message"]
