"""Real servers on loopback: Prometheus, Alertmanager and fleetwatch's own commands.

Each starts as a process of its own on a loopback port (a preferred one when it is free,
else any free port), with its log in its own working directory; it is awaited with a
deadline (never a fixed sleep) and stopped by PID when its context exits. `fleetwatch demo`
starts its servers with these, and so do the integration tests and the benchmarks, so a
server is started one way everywhere; `process` runs a daemon with no HTTP readiness endpoint
(Slurm's, etcd, kube-apiserver) the same way. Standard library and PyYAML only: the demo runs
from the base install.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import yaml

PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
STOP_GRACE_SECONDS = 10.0

T = TypeVar("T")


class MissingBinary(FileNotFoundError):
    """A Debian binary (Prometheus, Alertmanager, ...) to start is not installed."""


class ServerError(RuntimeError):
    """A server exited, or did not become ready in time; the message holds its log's tail."""


def require_binary(path: str) -> str:
    """`path`, or an error naming the missing binary and how to get it."""
    if not Path(path).exists():
        raise MissingBinary(
            f"{path} is missing: ./dev.sh installs the Debian packages that provide it"
        )
    return path


def free_port(preferred: int = 0) -> int:
    """`preferred` when nothing listens there on 127.0.0.1, else any free loopback port."""
    for candidate in dict.fromkeys((preferred, 0)):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            port: int = sock.getsockname()[1]
            return port
    raise OSError("no free TCP port on 127.0.0.1")


def wait_until(
    probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.05
) -> T:
    """Poll `probe` until it returns something other than None/False; TimeoutError naming
    `what` (and the probe's last error) when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = probe()
        except (OSError, ValueError, KeyError) as exc:  # not up yet, or not there yet
            last_error = exc
            result = None
        if result is not None and result is not False:
            return result
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last error: {last_error})")


def http_get(url: str, *, timeout: float = 5.0, headers: dict[str, str] | None = None) -> bytes:
    """GET a URL and return the body; raises on non-2xx."""
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310 - loopback
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback
        body: bytes = response.read()
        return body


def http_status(url: str, *, timeout: float = 5.0) -> int:
    """The HTTP status of a GET, including error statuses."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code


@dataclass
class Server:
    """A started process and where it listens."""

    process: subprocess.Popen[bytes]
    url: str
    workdir: Path
    log_path: Path

    @property
    def address(self) -> str:
        """`HOST:PORT`, as flags and scrape targets want it."""
        return self.url.removeprefix("http://")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; always reaps the PID."""
        stop(self.process)


def stop(started: subprocess.Popen[bytes]) -> None:
    """Stop `started` by its PID: SIGTERM, then SIGKILL after a grace period; reaped."""
    if started.poll() is None:
        started.send_signal(signal.SIGTERM)
        try:
            started.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            started.kill()
            started.wait(timeout=STOP_GRACE_SECONDS)


@contextlib.contextmanager
def running(
    argv: Sequence[str],
    *,
    url: str,
    ready_path: str,
    workdir: Path,
    name: str,
    env: dict[str, str] | None = None,
    ready_timeout: float = 60.0,
) -> Iterator[Server]:
    """Start `argv` in `workdir` (its output in NAME.log there, in a session of its own so a
    Ctrl-C meant for the caller does not reach it), wait until `url + ready_path` answers
    200, and stop it when the context exits."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{name}.log"
    log_path.unlink(missing_ok=True)  # this run's log only, when a workdir is reused
    with process(argv, log_path, env=env, cwd=workdir) as started:
        server = Server(process=started, url=url, workdir=workdir, log_path=log_path)

        def ready() -> bool:
            if started.poll() is not None:
                tail = server.log()[-2000:]
                raise ServerError(f"{name} exited with {started.returncode}:\n{tail}")
            return http_status(url + ready_path, timeout=2) == 200

        try:
            wait_until(ready, timeout=ready_timeout, what=f"{name} at {url}{ready_path}")
        except TimeoutError as exc:
            raise ServerError(f"{name} did not become ready: {exc}") from None
        yield server


@contextlib.contextmanager
def process(
    argv: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` (in `cwd`) with its output appended to `log`, in a session of its own (a
    Ctrl-C meant for the caller does not reach it), with `env` added to the environment; on
    exit stop it by PID: SIGTERM, then SIGKILL after a grace period."""
    with log.open("ab") as out:
        started = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    try:
        yield started
    finally:
        stop(started)


@contextlib.contextmanager
def prometheus(
    workdir: Path,
    *,
    scrape_configs: list[dict[str, Any]],
    rule_files: Sequence[Path] = (),
    alertmanager_urls: Sequence[str] = (),
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    extra_args: Sequence[str] = (),
    storage: Path | None = None,
    port: int = 0,
    remote_write_urls: Sequence[str] = (),
) -> Iterator[Server]:
    """A real Prometheus with the given scrape configs and rules, on `port` when free,
    remote-writing every sample and rule result to `remote_write_urls` (flushed each
    second: a shard feeding a global store)."""
    require_binary(PROMETHEUS)
    port = free_port(port)
    config: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "scrape_configs": scrape_configs,
        "rule_files": [str(p) for p in rule_files],
    }
    if alertmanager_urls:
        targets = [u.removeprefix("http://") for u in alertmanager_urls]
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": targets}]}]}
    if remote_write_urls:
        config["remote_write"] = [
            {"url": url, "queue_config": {"batch_send_deadline": "1s"}} for url in remote_write_urls
        ]
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    argv = [
        PROMETHEUS,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={storage or workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        *extra_args,
    ]
    with running(
        argv,
        url=f"http://127.0.0.1:{port}",
        ready_path="/-/ready",
        workdir=workdir,
        name="prometheus",
    ) as server:
        yield server


@contextlib.contextmanager
def alertmanager(workdir: Path, *, config: dict[str, Any], port: int = 0) -> Iterator[Server]:
    """A real Alertmanager (no clustering), on `port` when free."""
    require_binary(ALERTMANAGER)
    port = free_port(port)
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "alertmanager.yml"
    config_path.write_text(yaml.safe_dump(config))
    argv = [
        ALERTMANAGER,
        f"--config.file={config_path}",
        f"--storage.path={workdir / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    with running(
        argv,
        url=f"http://127.0.0.1:{port}",
        ready_path="/-/ready",
        workdir=workdir,
        name="alertmanager",
    ) as server:
        yield server


@contextlib.contextmanager
def fleetwatch_export(
    workdir: Path, *, simulate: str, args: Sequence[str] = (), port: int = 0
) -> Iterator[Server]:
    """`fleetwatch export --simulate SCENARIO` as a real process, ready at /readyz."""
    with fleetwatch_command(
        workdir,
        command="export",
        args=[f"--simulate={simulate}", *args],
        ready_path="/readyz",
        port=port,
    ) as server:
        yield server


@contextlib.contextmanager
def fleetwatch_command(
    workdir: Path,
    *,
    command: str,
    args: Sequence[str] = (),
    ready_path: str = "/healthz",
    port: int = 0,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """`fleetwatch COMMAND --web.listen-address=127.0.0.1:PORT ARGS` as a real process
    (e.g. `taint`, `simulate-cluster`), ready when `ready_path` answers 200; `env` adds to
    the environment it inherits. It runs on this interpreter, so it is the fleetwatch
    installed here."""
    port = free_port(port)
    argv = [
        sys.executable,
        "-m",
        "fleetwatch",
        command,
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.format=json",
        *args,
    ]
    with running(
        argv,
        url=f"http://127.0.0.1:{port}",
        ready_path=ready_path,
        workdir=workdir,
        name=f"fleetwatch-{command}",
        env=env,
    ) as server:
        yield server


def prom_alerts(prom: Server) -> list[dict[str, Any]]:
    """Alerts Prometheus currently holds (pending and firing)."""
    body = json.loads(http_get(f"{prom.url}/api/v1/alerts"))
    alerts: list[dict[str, Any]] = body["data"]["alerts"]
    return alerts


def post_alert(alertmanager_url: str, labels: dict[str, str], *, lasting: float = 300.0) -> None:
    """One firing alert with `labels` straight into Alertmanager's API, as Prometheus sends
    it, ending `lasting` seconds from now unless sent again."""
    now = datetime.now(UTC)
    body = [
        {
            "labels": labels,
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(seconds=lasting)).isoformat(),
        }
    ]
    request = urllib.request.Request(  # noqa: S310 - loopback
        f"{alertmanager_url}/api/v2/alerts",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback
        answer.read()
