"""The cost of `--web.config.file` on `/metrics`: plain HTTP, TLS, mutual TLS, and basic auth
over TLS, for a real `fleetwatch export --simulate=dgx-h100` process.

For each mode: scrape latency (p50, p99) and the exporter's CPU per scrape, over one
kept-alive connection (how Prometheus scrapes) and with a new connection per scrape (the
handshake's cost, what a keep-alive shorter than the scrape interval pays); for basic auth,
the first request of a credential (bcrypt at cost 10) and the cached ones after it.

The exporter's CPU is read from /proc (utime + stime), less what it spends collecting over
the same time without scrapes. Prints figures; asserts nothing.
Run: `.venv/bin/python bench/bench_web.py [--scrapes N]`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import os
import ssl
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetwatch.sim.loopback_servers import free_port, process, wait_until
from testbed.pki import CLIENT_AUTH, CertificateAuthority

PASSWORD = "bench-s3cret"
AUTH = "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def exporter(workdir: Path, config: Path | None) -> Iterator[tuple[int, int]]:
    """A simulated exporter under `config`; yields (pid, port) once it is ready."""
    port = free_port()
    argv = [
        sys.executable, "-m", "fleetwatch", "export", "--simulate=dgx-h100",
        f"--web.listen-address=127.0.0.1:{port}", "--log.format=json",
        *([f"--web.config.file={config}"] if config else []),
    ]  # fmt: skip
    with process(argv, workdir / "export.log") as started:
        yield started.pid, port


def connect(port: int, context: ssl.SSLContext | None) -> http.client.HTTPConnection:
    if context is None:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    return http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)


def scrape(connection: http.client.HTTPConnection, headers: dict[str, str]) -> int:
    connection.request("GET", "/metrics", headers={"Accept-Encoding": "gzip", **headers})
    response = connection.getresponse()
    response.read()
    return response.status


def measure(
    pid: int,
    port: int,
    context: ssl.SSLContext | None,
    headers: dict[str, str],
    *,
    scrapes: int,
    reuse: bool,
) -> tuple[float, float, float]:
    """(p50 ms, p99 ms, exporter CPU ms per scrape). The exporter's own collection CPU, measured
    idle for as long as the scrapes took, is taken off."""
    latencies = []
    kept = connect(port, context)
    cpu, began = cpu_seconds(pid), time.monotonic()
    for _ in range(scrapes):
        connection = kept if reuse else connect(port, context)
        start = time.perf_counter()
        assert scrape(connection, headers) == 200
        latencies.append(time.perf_counter() - start)
        if not reuse:
            connection.close()
    used, elapsed = cpu_seconds(pid) - cpu, time.monotonic() - began
    kept.close()
    idle = cpu_seconds(pid)
    time.sleep(elapsed)  # the same time without scrapes: the collectors' CPU alone
    used -= cpu_seconds(pid) - idle
    latencies.sort()
    return (
        latencies[len(latencies) // 2] * 1000,
        latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000,
        used / scrapes * 1000,
    )


def bench_mode(
    name: str,
    workdir: Path,
    config: Path | None,
    context: ssl.SSLContext | None,
    headers: dict[str, str],
    *,
    scrapes: int,
) -> None:
    """Start an exporter under `config` and print its figures."""
    with exporter(workdir, config) as (pid, port):

        def ready() -> bool:
            connection = connect(port, context)
            try:
                connection.request("GET", "/readyz", headers=headers)
                return connection.getresponse().status == 200
            finally:
                connection.close()

        wait_until(ready, timeout=60, what=f"the exporter ({name})")
        if headers:
            first = connect(port, context)
            start = time.perf_counter()
            new = "Basic " + base64.b64encode(b"prometheus:another").decode()
            scrape(first, {"Authorization": new})
            took = (time.perf_counter() - start) * 1000
            print(f"{name:<18} a new credential's first request (bcrypt, cost 10): {took:.1f} ms")
            first.close()
        for reuse in (True, False):
            p50, p99, cpu = measure(pid, port, context, headers, scrapes=scrapes, reuse=reuse)
            label = "kept alive" if reuse else "new each"
            print(f"{name:<18} {label:<12} {p50:8.2f} {p99:8.2f} {cpu:14.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-web-") as folder:
        root = Path(folder)
        pki = root / "pki"
        pki.mkdir()
        ca = CertificateAuthority.create()
        ca.write(pki / "ca.crt")
        ca.issue_to(pki / "server.crt", pki / "server.key", "fleetwatch-exporter")
        ca.issue_to(pki / "client.crt", pki / "client.key", "prometheus", usage=CLIENT_AUTH)
        tls = {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key")}
        mutual = {
            **tls,
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": str(pki / "ca.crt"),
        }
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
        modes: dict[str, tuple[dict[str, object] | None, dict[str, str]]] = {
            "plain HTTP": (None, {}),
            "TLS": ({"tls_server_config": tls}, {}),
            "mutual TLS": ({"tls_server_config": mutual}, {}),
            "TLS + basic auth": (
                {"tls_server_config": tls, "basic_auth_users": {"prometheus": hashed}},
                {"Authorization": AUTH},
            ),
        }
        client = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        client.load_cert_chain(pki / "client.crt", pki / "client.key")
        print(f"fleetwatch export --simulate=dgx-h100, {args.scrapes} scrapes of /metrics (gzip)")
        print(f"{'mode':<18} {'connection':<12} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/scrape':>14}")
        for name, (document, headers) in modes.items():
            workdir = root / name.replace(" ", "-").replace("+", "")
            workdir.mkdir()
            config = None
            if document is not None:
                config = workdir / "web.yml"
                config.write_text(yaml.safe_dump(document))
            context = client if document is not None else None
            bench_mode(name, workdir, config, context, headers, scrapes=args.scrapes)


if __name__ == "__main__":
    main()
