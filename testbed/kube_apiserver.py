"""A real Kubernetes API server on loopback for the tests (the envtest convention).

Kubernetes controller projects test against a real `kube-apiserver` and etcd found through
`KUBEBUILDER_ASSETS`: a folder holding `kube-apiserver`, and `etcd` unless it is on PATH
(Debian's `etcd-server` installs /usr/bin/etcd). `api_server` starts both on free
127.0.0.1 ports with a temporary PKI (a CA, a serving certificate for 127.0.0.1/localhost,
a service-account key pair) and a static token file holding one token per `Identity`,
waits for `/readyz` with a deadline, writes a kubeconfig per identity, and stops both
processes by PID on exit. There is no controller-manager, scheduler or kubelet: nothing is
garbage-collected and node status is whatever a test writes.

What a real server cannot do on demand (an injected 429, an outage, a race at a chosen
moment) stays with the simulated API (`fleetwatch.sim.kubeapi`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fleetwatch.sim.loopback_servers import process
from testbed.pki import CertificateAuthority, pem_key

ASSETS_ENV = "KUBEBUILDER_ASSETS"
READY_TIMEOUT = 90.0  # seconds; about 4 s on a quiet 2-core machine


class MissingAssets(FileNotFoundError):
    """The binaries a real API server needs are not there; the message says how to get them."""


@dataclass(frozen=True)
class Assets:
    """The two binaries: kube-apiserver from KUBEBUILDER_ASSETS, etcd from there or PATH."""

    apiserver: Path
    etcd: Path


def find_assets(environ: Mapping[str, str] | None = None) -> Assets:
    """The binaries named by `KUBEBUILDER_ASSETS`, or MissingAssets saying what is absent."""
    environ = os.environ if environ is None else environ
    folder = environ.get(ASSETS_ENV, "")
    if not folder:
        raise MissingAssets(
            f"{ASSETS_ENV} is not set: point it at a folder holding kube-apiserver "
            "(see CONTRIBUTING.md, 'A real Kubernetes API server')"
        )
    apiserver = Path(folder) / "kube-apiserver"
    if not os.access(apiserver, os.X_OK):
        raise MissingAssets(f"{ASSETS_ENV}={folder} holds no executable kube-apiserver")
    etcd = Path(folder) / "etcd"
    if not os.access(etcd, os.X_OK):
        on_path = shutil.which("etcd")
        if on_path is None:
            raise MissingAssets(
                f"no etcd in {ASSETS_ENV}={folder} nor on PATH "
                "(Debian: apt-get install etcd-server; ./dev.sh test installs it)"
            )
        etcd = Path(on_path)
    return Assets(apiserver=apiserver, etcd=etcd)


@dataclass(frozen=True)
class Identity:
    """Someone the server knows by a static token: a user name and its groups."""

    name: str  # the kubeconfig's file name and the key tests use
    user: str
    groups: tuple[str, ...] = ()


ADMIN = Identity("admin", "admin", ("system:masters",))


def service_account(namespace: str, name: str) -> Identity:
    """A ServiceAccount's identity as the API server sees it, so RBAC bindings to the
    ServiceAccount apply to requests made with this identity's token."""
    return Identity(
        name=f"sa-{namespace}-{name}",
        user=f"system:serviceaccount:{namespace}:{name}",
        groups=(
            "system:serviceaccounts",
            f"system:serviceaccounts:{namespace}",
            "system:authenticated",
        ),
    )


class ApiCallFailed(Exception):
    """A request of `ApiServer.call` was answered outside 2xx."""

    def __init__(self, *, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{method} {path} answered {status}: {message}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class ApiServer:
    """A running server: its URL, CA, and a token and kubeconfig per identity."""

    url: str
    ca_file: Path
    workdir: Path
    tokens: Mapping[str, str]
    startup_seconds: float

    def kubeconfig(self, identity: Identity | str = ADMIN) -> Path:
        """The kubeconfig file of `identity` (written at start)."""
        name = identity if isinstance(identity, str) else identity.name
        return self.workdir / "kubeconfigs" / f"{name}.json"

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        identity: Identity | str = ADMIN,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """One JSON request as `identity`: the status and the decoded body."""
        name = identity if isinstance(identity, str) else identity.name
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.tokens[name]}",
                "Content-Type": content_type,
                "Accept": "application/json",
            },
        )
        context = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(request, timeout=30, context=context) as response:
                return response.status, _decode(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _decode(exc.read())

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        identity: Identity | str = ADMIN,
        content_type: str = "application/json",
    ) -> Any:
        """`request`, returning the body of a 2xx answer and raising ApiCallFailed otherwise."""
        status, answer = self.request(
            method, path, body, identity=identity, content_type=content_type
        )
        if not 200 <= status < 300:
            raise ApiCallFailed(method=method, path=path, status=status, body=answer)
        return answer

    def allowed(
        self,
        identity: Identity | str,
        *,
        verb: str,
        resource: str,
        group: str = "",
        namespace: str = "",
        name: str = "",
        subresource: str = "",
    ) -> bool:
        """Whether RBAC lets `identity` do `verb` on `resource`: a SelfSubjectAccessReview
        made with the identity's own token, as `kubectl auth can-i` does."""
        attributes = {
            "verb": verb,
            "resource": resource,
            "group": group,
            "namespace": namespace,
            "name": name,
            "subresource": subresource,
        }
        review = self.call(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {k: v for k, v in attributes.items() if v}},
            },
            identity=identity,
        )
        return bool(review["status"].get("allowed"))

    def apply(self, obj: Mapping[str, Any]) -> Any:
        """Create `obj` as admin, or replace it when it exists (a plain `kubectl apply`)."""
        path = object_path(obj)
        status, current = self.request("GET", path)
        if status == 404:
            return self.call("POST", path.rsplit("/", 1)[0], obj)
        if status != 200:
            raise ApiCallFailed(method="GET", path=path, status=status, body=current)
        body = {**obj, "metadata": {**obj["metadata"], **_version_of(current)}}
        return self.call("PUT", path, body)


def _decode(raw: bytes) -> Any:
    """A body as JSON, or as text when it is not JSON (`/readyz` answers `ok`)."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def _version_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return {"resourceVersion": obj["metadata"]["resourceVersion"]}


# (kind) -> (URL prefix, plural, namespaced) for the kinds the tests apply.
KINDS: Mapping[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
}


def object_path(obj: Mapping[str, Any]) -> str:
    """The URL path of `obj` (one of KINDS), from its kind, namespace and name."""
    kind = obj["kind"]
    if kind not in KINDS:
        raise ValueError(f"testbed.kube_apiserver knows no URL for kind {kind!r}: add it to KINDS")
    prefix, plural, namespaced = KINDS[kind]
    metadata = obj["metadata"]
    where = f"/namespaces/{metadata['namespace']}" if namespaced else ""
    return f"{prefix}{where}/{plural}/{metadata['name']}"


def _loopback_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that nothing listens on right now."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


@dataclass(frozen=True)
class Pki:
    """The files the API server is started with."""

    ca: Path
    serving_cert: Path
    serving_key: Path
    sa_public: Path
    sa_private: Path


def write_pki(folder: Path) -> Pki:
    """A CA, a serving certificate for 127.0.0.1/localhost, a service-account key pair."""
    folder.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca=folder / "ca.crt",
        serving_cert=folder / "apiserver.crt",
        serving_key=folder / "apiserver.key",
        sa_public=folder / "sa.pub",
        sa_private=folder / "sa.key",
    )
    ca = CertificateAuthority.create()
    ca.write(pki.ca)
    ca.issue_to(pki.serving_cert, pki.serving_key, "kube-apiserver")
    sa_key = ec.generate_private_key(ec.SECP256R1())
    pki.sa_private.write_bytes(pem_key(sa_key))
    pki.sa_public.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def write_tokens(path: Path, identities: Sequence[Identity]) -> dict[str, str]:
    """The static token file (`token,user,uid,"group1,group2"`); returns name -> token."""
    tokens = {identity.name: os.urandom(16).hex() for identity in identities}
    lines = [f'{tokens[i.name]},{i.user},uid-{i.name},"{",".join(i.groups)}"' for i in identities]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return tokens


def write_kubeconfig(path: Path, *, url: str, ca: Path, token: str) -> Path:
    """A kubeconfig for one identity (JSON is valid YAML)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "test", "cluster": {"server": url, "certificate-authority": str(ca)}}
                ],
                "users": [{"name": "test", "user": {"token": token}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
                "current-context": "test",
            }
        )
    )
    return path


def _wait_ready(
    server: ApiServer, processes: Mapping[str, tuple[subprocess.Popen[bytes], Path]]
) -> None:
    """Poll /readyz until it answers `ok`, failing early (with the log's tail) when a process
    exits, and after READY_TIMEOUT."""
    deadline = time.monotonic() + READY_TIMEOUT
    last = "no answer yet"
    while time.monotonic() < deadline:
        for what, (daemon, log) in processes.items():
            if daemon.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{what} exited with {daemon.returncode}:\n{tail}")
        try:
            status, body = server.request("GET", "/readyz")
        except (OSError, ValueError) as exc:  # not listening yet
            last = repr(exc)
        else:
            if status == 200 and body == "ok":
                return
            last = f"{status} {body!r}"
        time.sleep(0.1)
    raise RuntimeError(f"kube-apiserver not ready after {READY_TIMEOUT}s (last: {last})")


@contextlib.contextmanager
def api_server(
    workdir: Path, *, identities: Sequence[Identity] = (), assets: Assets | None = None
) -> Iterator[ApiServer]:
    """etcd and kube-apiserver on loopback, ready, with `identities` (and ADMIN) as static
    token users; both processes are stopped by PID on exit. MissingAssets when the binaries
    are not there."""
    assets = assets or find_assets()
    everyone = [ADMIN, *(i for i in identities if i.name != ADMIN.name)]
    started = time.monotonic()
    pki = write_pki(workdir / "pki")
    tokens = write_tokens(workdir / "tokens.csv", everyone)
    client_port, peer_port, api_port = _loopback_ports(3)
    etcd_url = f"http://127.0.0.1:{client_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    etcd_argv = [
        str(assets.etcd),
        "--name=test",
        f"--data-dir={workdir / 'etcd'}",
        f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=test={peer_url}",
        "--initial-cluster-state=new",
    ]
    apiserver_argv = [
        str(assets.apiserver),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        f"--secure-port={api_port}",
        "--advertise-address=127.0.0.1",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca}",
        f"--token-auth-file={workdir / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_public}",
        f"--service-account-signing-key-file={pki.sa_private}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--endpoint-reconciler-type=none",
        f"--cert-dir={workdir / 'certs'}",
        "--profiling=false",
    ]
    with (
        process(etcd_argv, workdir / "etcd.log") as etcd,
        process(apiserver_argv, workdir / "kube-apiserver.log") as apiserver,
    ):
        url = f"https://127.0.0.1:{api_port}"
        for identity in everyone:
            write_kubeconfig(
                workdir / "kubeconfigs" / f"{identity.name}.json",
                url=url,
                ca=pki.ca,
                token=tokens[identity.name],
            )
        probe = ApiServer(
            url=url, ca_file=pki.ca, workdir=workdir, tokens=tokens, startup_seconds=0.0
        )
        _wait_ready(
            probe,
            {
                "etcd": (etcd, workdir / "etcd.log"),
                "kube-apiserver": (apiserver, workdir / "kube-apiserver.log"),
            },
        )
        yield ApiServer(
            url=url,
            ca_file=pki.ca,
            workdir=workdir,
            tokens=tokens,
            startup_seconds=time.monotonic() - started,
        )


def bound_pod(
    name: str,
    *,
    namespace: str,
    node: str,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    gpus: int = 1,
    owner_kind: str | None = None,
) -> dict[str, Any]:
    """A pod manifest already bound to `node` (no scheduler here), requesting `gpus`
    nvidia.com/gpu (none when 0), owned by a made-up `owner_kind` object when given."""
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
    }
    if owner_kind is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner_kind,
                "name": f"{name}-owner",
                "uid": "00000000-0000-0000-0000-000000000001",
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "trainer", "resources": resources}],
        },
    }
