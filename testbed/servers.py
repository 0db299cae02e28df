"""Real servers for tests and benches: Prometheus, Alertmanager, node_exporter and our own
commands.

Each starts on a free loopback port with a temporary directory, is awaited with a
deadline (never a fixed sleep), and is stopped by PID when its context exits. Every
integration test uses these so that each server is started once per test module, not
once per case.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from aiohttp import web

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"

T = TypeVar("T")


class MissingBinary(FileNotFoundError):
    """A Debian binary the tests and benches start is not installed."""


def require_binary(path: str) -> str:
    """`path`, or an error naming the missing Debian binary (./dev.sh test installs them)."""
    if not Path(path).exists():
        raise MissingBinary(
            f"{path} is missing: run ./dev.sh test (it installs the Debian packages)"
        )
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(
    probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.05
) -> T:
    """Poll `probe` until it returns something other than None/False, or fail naming `what`."""
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
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what} (last error: {last_error})"
    )


def http_get(url: str, *, timeout: float = 5.0, headers: dict[str, str] | None = None) -> bytes:
    """GET a URL and return the body; raises on non-2xx."""
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body: bytes = response.read()
        return body


def http_status(url: str, *, timeout: float = 5.0) -> int:
    """The HTTP status of a GET, including error statuses."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
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

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; always reaps the PID."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@contextlib.contextmanager
def _running(
    argv: Sequence[str],
    *,
    url: str,
    ready_path: str,
    workdir: Path,
    name: str,
    env: dict[str, str] | None = None,
    ready_timeout: float = 60.0,
) -> Iterator[Server]:
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    server = Server(process=process, url=url, workdir=workdir, log_path=log_path)
    try:

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"{name} exited with {process.returncode}:\n{server.log()}")
            return http_status(url + ready_path, timeout=2) == 200

        wait_until(ready, timeout=ready_timeout, what=f"{name} at {url}{ready_path}")
        yield server
    finally:
        server.stop()


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
) -> Iterator[Server]:
    """A real Prometheus on a free loopback port with the given scrape configs and rules."""
    require_binary(PROMETHEUS)
    port = free_port()
    config: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "scrape_configs": scrape_configs,
        "rule_files": [str(p) for p in rule_files],
    }
    if alertmanager_urls:
        config["alerting"] = {
            "alertmanagers": [
                {
                    "static_configs": [
                        {"targets": [u.removeprefix("http://") for u in alertmanager_urls]}
                    ]
                }
            ]
        }
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
    with _running(
        argv,
        url=f"http://127.0.0.1:{port}",
        ready_path="/-/ready",
        workdir=workdir,
        name="prometheus",
    ) as server:
        yield server


@contextlib.contextmanager
def alertmanager(workdir: Path, *, config: dict[str, Any]) -> Iterator[Server]:
    """A real Alertmanager (no clustering) on a free loopback port."""
    require_binary(ALERTMANAGER)
    port = free_port()
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
    with _running(
        argv,
        url=f"http://127.0.0.1:{port}",
        ready_path="/-/ready",
        workdir=workdir,
        name="alertmanager",
    ) as server:
        yield server


@contextlib.contextmanager
def node_exporter(
    workdir: Path, *, sysfs: Path, collectors: Sequence[str] | None
) -> Iterator[Server]:
    """Debian's node_exporter reading `sysfs`, with only the named collectors (None: its
    default collectors)."""
    require_binary(NODE_EXPORTER)
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    chosen = [] if collectors is None else ["--collector.disable-defaults"]
    chosen += [f"--collector.{name}" for name in collectors or ()]
    argv = [
        NODE_EXPORTER,
        f"--web.listen-address=127.0.0.1:{port}",
        f"--path.sysfs={sysfs}",
        *chosen,
    ]
    with _running(
        argv,
        url=f"http://127.0.0.1:{port}",
        ready_path="/metrics",
        workdir=workdir,
        name="node_exporter",
    ) as server:
        yield server


@contextlib.contextmanager
def fleetwatch_export(
    workdir: Path,
    *,
    simulate: str,
    args: Sequence[str] = (),
) -> Iterator[Server]:
    """`fleetwatch export --simulate SCENARIO` as a real process, ready at /readyz."""
    with fleetwatch_command(
        workdir, command="export", args=[f"--simulate={simulate}", *args], ready_path="/readyz"
    ) as server:
        yield server


@contextlib.contextmanager
def fleetwatch_command(
    workdir: Path,
    *,
    command: str,
    args: Sequence[str] = (),
    ready_path: str = "/healthz",
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """`fleetwatch COMMAND --web.listen-address=127.0.0.1:PORT ARGS` as a real process
    (e.g. `taint`, `simulate-cluster`), ready when `ready_path` answers 200; `env` adds to
    the environment it inherits."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "fleetwatch",
        command,
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.format=json",
        *args,
    ]
    with _running(
        argv,
        url=f"http://127.0.0.1:{port}",
        ready_path=ready_path,
        workdir=workdir,
        name=f"fleetwatch-{command}",
        env=env,
    ) as server:
        yield server


def prom_query(prom: Server, expr: str, *, time_s: float | None = None) -> list[dict[str, Any]]:
    """Run an instant PromQL query and return `data.result`."""
    params = {"query": expr}
    if time_s is not None:
        params["time"] = str(time_s)
    body = json.loads(http_get(f"{prom.url}/api/v1/query?{urllib.parse.urlencode(params)}"))
    if body.get("status") != "success":
        raise AssertionError(f"query {expr!r} failed: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def prom_alerts(prom: Server) -> list[dict[str, Any]]:
    """Alerts Prometheus currently holds (pending and firing)."""
    body = json.loads(http_get(f"{prom.url}/api/v1/alerts"))
    alerts: list[dict[str, Any]] = body["data"]["alerts"]
    return alerts


def promtool(
    *args: str, cwd: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run promtool (`stdin` feeds e.g. `check metrics`); never raises on exit status."""
    require_binary(PROMTOOL)
    return subprocess.run(
        [PROMTOOL, *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def promtool_check_metrics(exposition: str) -> list[str]:
    """Every problem `promtool check metrics` finds in an exposition (lints included)."""
    result = promtool("check", "metrics", stdin=exposition)
    problems = [
        line.strip() for line in (result.stdout + result.stderr).splitlines() if line.strip()
    ]
    if result.returncode != 0 and not problems:
        problems.append(f"promtool exited {result.returncode}")
    return problems


@contextlib.contextmanager
def served_in_thread(app: web.Application) -> Iterator[str]:
    """Serve `app` on a loopback port from a thread of its own (for code under test that
    runs its own event loop, or other processes); yields its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    started = threading.Event()
    ports: list[int] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
        ports.append(runner.addresses[0][1])
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, name="served-in-thread", daemon=True)
    thread.start()
    if not started.wait(10):
        raise AssertionError("the in-thread server did not start within 10s")
    try:
        yield f"http://127.0.0.1:{ports[0]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
