"""This node's DRA ResourceSlices (`resource.k8s.io/v1`), listed once and then watched.

A DRA claim in the kubelet's PodResources reply names a device by (driver, pool, device);
the GPU behind it is the device's `uuid` attribute in the ResourceSlice its driver
publishes for this node. `ResourceSliceWatcher` keeps those slices in memory: one list
with the field selector `spec.nodeName=NODE`, then a watch from the list's
resourceVersion, reconnecting with backoff, and listing again when the server answers 410
Gone. Nothing is fetched per scrape, and memory is bounded by this node's slices (a few
devices each) plus one event being decoded.

It speaks plain HTTPS through `http.client` with the pod's ServiceAccount token and CA (or a
kubeconfig's token or client certificate), so the exporter carries no Kubernetes client.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import ssl
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.client import HTTPException, HTTPResponse, HTTPSConnection
from pathlib import Path
from typing import Any, Final

import yaml

from fleetwatch.collectors.sources.podresources import CHANNEL_DRIVER, GPU_DRIVER

log = logging.getLogger(__name__)

DRIVERS: Final = frozenset({GPU_DRIVER, CHANNEL_DRIVER})
SLICES_PATH: Final = "/apis/resource.k8s.io/v1/resourceslices"
SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
WATCH_SECONDS: Final = 300  # the server ends each watch after this; we reconnect at once
BACKOFF_MAX: Final = 60.0


class KubeAccessError(ValueError):
    """No way to reach the API server (not in a cluster, or a kubeconfig we cannot use)."""


@dataclass(frozen=True)
class KubeAccess:
    """Where the API server is and how to authenticate: a bearer token, a token file read
    at each request (the kubelet rotates a projected ServiceAccount token in place), or a
    client cert (already loaded into `context`)."""

    server: str
    context: ssl.SSLContext
    token: str | None
    token_file: Path | None = None

    def bearer(self) -> str | None:
        """The token to send now."""
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip()
            except OSError as exc:
                raise ApiError(0, f"cannot read {self.token_file}: {exc.strerror}") from exc
        return self.token

    @classmethod
    def in_cluster(cls, environ: Mapping[str, str] | None = None) -> KubeAccess:
        """The pod's own ServiceAccount: KUBERNETES_SERVICE_HOST/PORT, token and CA."""
        env = os.environ if environ is None else environ
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise KubeAccessError("not in a cluster: KUBERNETES_SERVICE_HOST/PORT unset")
        try:
            (SERVICE_ACCOUNT / "token").read_bytes()
            context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        except OSError as exc:
            raise KubeAccessError(
                f"no ServiceAccount token at {SERVICE_ACCOUNT}: {exc.strerror}"
            ) from exc
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", context, None, SERVICE_ACCOUNT / "token")

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeAccess:
        """The current context of kubeconfig `path`: its server, CA and token or client cert."""
        try:
            config = yaml.safe_load(path.read_text())
            name = config["current-context"]
            (context,) = [c["context"] for c in config["contexts"] if c["name"] == name]
            (cluster,) = [
                c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"]
            ]
            (user,) = [u.get("user") or {} for u in config["users"] if u["name"] == context["user"]]
            server = cluster["server"]
        except (OSError, yaml.YAMLError) as exc:
            raise KubeAccessError(f"cannot read kubeconfig {path}: {exc}") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise KubeAccessError(
                f"kubeconfig {path}: no usable current context ({exc!r})"
            ) from exc
        ssl_context = ssl.create_default_context()
        with tempfile.TemporaryDirectory(prefix="fleetwatch-kubeconfig-") as folder:
            ca = _file_or_data(cluster, "certificate-authority", Path(folder) / "ca.crt")
            if ca is not None:
                ssl_context.load_verify_locations(cafile=str(ca))
            cert = _file_or_data(user, "client-certificate", Path(folder) / "client.crt")
            key = _file_or_data(user, "client-key", Path(folder) / "client.key")
            if cert is not None:
                ssl_context.load_cert_chain(str(cert), None if key is None else str(key))
        if not str(server).startswith("https://"):
            raise KubeAccessError(f"kubeconfig {path}: server {server!r} is not https://")
        token = user.get("token")
        token_file = Path(user["tokenFile"]) if "tokenFile" in user else None
        if token is None and token_file is None and cert is None:
            raise KubeAccessError(f"kubeconfig {path}: user has neither token nor client cert")
        return cls(server.rstrip("/"), ssl_context, token, token_file)


def _file_or_data(section: Mapping[str, Any], key: str, spill: Path) -> Path | None:
    """A kubeconfig's `KEY` (a file) or `KEY-data` (base64, written to `spill`)."""
    if key in section:
        return Path(section[key])
    if f"{key}-data" in section:
        spill.write_bytes(base64.b64decode(section[f"{key}-data"]))
        return spill
    return None


@dataclass(frozen=True)
class SliceDevice:
    """One device a DRA driver publishes for this node, with the attributes we read."""

    driver: str
    pool: str
    name: str
    uuid: str  # "" when the driver published none
    kind: str  # the `type` attribute: gpu, mig, channel, ...
    product: str
    profile: str


class ApiError(Exception):
    """The API server answered outside 2xx (`status`), or the stream broke."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status


def _mapping(value: Any) -> Mapping[str, Any]:
    """`value` when it is an object; an empty one for anything else a broken slice holds."""
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    """`value` when it is a string, else "" (a field of the wrong type is not read)."""
    return value if isinstance(value, str) else ""


def _attribute(device: Mapping[str, Any], name: str) -> str:
    """A device attribute as text (`{string|int|bool|version: value}`), "" when absent."""
    value = _mapping(_mapping(device.get("attributes")).get(name))
    for kind in ("string", "version", "int", "bool"):
        if kind in value:
            return str(value[kind])
    return ""


def slice_devices(obj: Mapping[str, Any]) -> tuple[SliceDevice, ...]:
    """The devices of one ResourceSlice object (the drivers we resolve; others skipped).
    Parts of the wrong shape (a slice edited by hand, a driver's bug) are not read: a device
    that is not an object or has no name is left out, a field of another type reads as ""."""
    spec = _mapping(_mapping(obj).get("spec"))
    driver = _text(spec.get("driver"))
    devices = spec.get("devices")
    if driver not in DRIVERS or not isinstance(devices, list):
        return ()
    pool = _text(_mapping(spec.get("pool")).get("name"))
    return tuple(
        SliceDevice(
            driver=driver,
            pool=pool,
            name=_text(device["name"]),
            uuid=_attribute(device, "uuid"),
            kind=_attribute(device, "type"),
            product=_attribute(device, "productName"),
            profile=_attribute(device, "profile") or _attribute(device, "migProfile"),
        )
        for device in devices
        if isinstance(device, Mapping) and _text(device.get("name"))
    )


class ResourceSliceWatcher:
    """Keeps this node's ResourceSlices of NVIDIA's drivers; `devices()` reads them.

    `mode` "auto" gives up for good, logging why once, when the first list finds that the
    API does not serve ResourceSlices (404) or the token may not list them (401/403); "on"
    keeps retrying with backoff, as both modes do on any failure after a first success.
    """

    def __init__(
        self,
        *,
        access: KubeAccess,
        node: str,
        mode: str,
    ) -> None:
        self._access = access
        self._node = node
        self._mode = mode
        self._lock = threading.Lock()
        self._slices: dict[str, tuple[SliceDevice, ...]] = {}
        self._synced = False
        self._off_reason: str | None = None
        self._stop = threading.Event()
        self._connection: HTTPSConnection | None = None
        self._thread: threading.Thread | None = None
        self.events = 0  # watch events applied, for the benchmark and tests
        self.lists = 0  # full lists, the first included

    @property
    def synced(self) -> bool:
        """Whether a list has succeeded (before that, every claim is unresolved)."""
        with self._lock:
            return self._synced

    @property
    def off_reason(self) -> str | None:
        """Why the watcher gave up for good ("auto" mode only), else None."""
        with self._lock:
            return self._off_reason

    def devices(self) -> dict[tuple[str, str, str], SliceDevice]:
        """Every device, by (driver, pool, device name)."""
        with self._lock:
            slices = list(self._slices.values())
        return {(d.driver, d.pool, d.name): d for devices in slices for d in devices}

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="resourceslices", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the watch: shutting the socket down wakes the reader blocked on it (closing
        the response from this thread would wait for the reader's lock)."""
        self._stop.set()
        connection = self._connection
        if connection is not None and connection.sock is not None:
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)
            except OSError as exc:  # already closed by the reader: it ends either way
                log.debug("shutting the watch down: %s", exc)
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        """List, then watch; on any failure back off and start over (supervised)."""
        backoff = 1.0
        failing: str | None = None
        while not self._stop.is_set():
            try:
                version = self._list()
                if failing is not None:
                    log.info("ResourceSlices: listing again", extra={"node": self._node})
                    failing = None
                backoff = 1.0
                self._watch(version)
            except ApiError as exc:
                # auto gives up only on the first answer: a later 401 (a token being
                # rotated) or 403 (RBAC being re-applied) is retried like any failure
                if self._mode == "auto" and exc.status in (401, 403, 404) and not self.synced:
                    reason = _why_off(exc.status)
                    with self._lock:
                        self._off_reason = reason
                    log.warning(
                        "DRA attribution off: %s; device-plugin attribution goes on",
                        reason,
                        extra={"node": self._node, "detail": str(exc)},
                    )
                    return
                if exc.status == 410:  # our resourceVersion is too old: list afresh
                    continue
                if str(exc) != failing:
                    log.warning(
                        "ResourceSlices: failing", extra={"node": self._node, "detail": str(exc)}
                    )
                    failing = str(exc)
            except Exception as exc:  # supervised: any surprise backs off and retries
                if self._stop.is_set():  # close() cut the stream under the reader
                    return
                if repr(exc) != failing:
                    log.exception("ResourceSlices: watch failed", extra={"node": self._node})
                    failing = repr(exc)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _path(self, **query: str) -> str:
        query["fieldSelector"] = f"spec.nodeName={self._node}"
        return f"{SLICES_PATH}?{urllib.parse.urlencode(query)}"

    def _open(self, path: str, timeout: float) -> HTTPResponse:
        """GET `path`; the connection is kept in `_connection` for close()."""
        headers = {"Accept": "application/json"}
        token = self._access.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = urllib.parse.urlsplit(self._access.server)
        connection = HTTPSConnection(
            url.hostname or "", url.port, timeout=timeout, context=self._access.context
        )
        self._connection = connection
        try:
            connection.request("GET", url.path.rstrip("/") + path, headers=headers)
            response = connection.getresponse()
        except (OSError, HTTPException) as exc:
            connection.close()
            raise ApiError(0, f"cannot reach {self._access.server}: {exc}") from exc
        if not 200 <= response.status < 300:
            body = response.read()
            connection.close()
            raise ApiError(response.status, _status_message(body))
        return response

    def _list(self) -> str:
        """Replace the slices with a fresh list; return its resourceVersion."""
        response = self._open(self._path(), timeout=30)
        try:
            body = json.loads(response.read())
        finally:
            self._hang_up(response)
        slices = {item["metadata"]["name"]: slice_devices(item) for item in body["items"]}
        with self._lock:
            self._slices = slices
            self._synced = True
            self.lists += 1
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> None:
        """Apply watch events until the server ends the watch or we are closed."""
        while not self._stop.is_set():
            path = self._path(
                watch="1",
                resourceVersion=version,
                allowWatchBookmarks="true",
                timeoutSeconds=str(WATCH_SECONDS),
            )
            response = self._open(path, timeout=WATCH_SECONDS + 30)
            try:
                for event in _events(response):
                    version = self._apply(event) or version
            except (OSError, ValueError, HTTPException) as exc:
                if self._stop.is_set():
                    return
                raise ApiError(0, f"watch stream broke: {exc}") from exc
            finally:
                self._hang_up(response)

    def _hang_up(self, response: HTTPResponse) -> None:
        response.close()
        if self._connection is not None:
            self._connection.close()

    def _apply(self, event: Mapping[str, Any]) -> str | None:
        """Apply one watch event; return the resourceVersion it brings."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise ApiError(int(obj.get("code", 0)), str(obj.get("message", "")))
        metadata = obj.get("metadata") or {}
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            with self._lock:
                if kind == "DELETED":
                    self._slices.pop(metadata.get("name", ""), None)
                else:
                    self._slices[metadata.get("name", "")] = slice_devices(obj)
                self.events += 1
        version = metadata.get("resourceVersion")
        return None if version is None else str(version)


def _events(response: HTTPResponse) -> Iterator[Mapping[str, Any]]:
    """The watch stream's events, one JSON object per line."""
    for line in response:
        if line.strip():
            yield json.loads(line)


def _status_message(body: bytes) -> str:
    """The `message` of a Kubernetes Status body, else the body's start."""
    try:
        return str(json.loads(body)["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


def _why_off(status: int) -> str:
    if status == 404:
        return "the API server does not serve resource.k8s.io/v1 ResourceSlices"
    if status == 401:
        return "the API server does not accept the exporter's credentials"
    return (
        "the exporter's ServiceAccount may not list resourceslices "
        "(the chart's ClusterRole grants get, list, watch)"
    )
