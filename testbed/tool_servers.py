"""Test-only servers and tools: node_exporter, promtool, PromQL queries and in-thread apps.

The servers the demo also starts (Prometheus, Alertmanager, fleetwatch's own commands) and
the harness that starts them (free loopback ports, temporary directories, readiness with a
deadline, stop by PID) ship in the package as `fleetwatch.sim.loopback_servers`; what is here only
tests and benches use, and it starts its servers with the same harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import subprocess
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from fleetwatch.sim.loopback_servers import (
    Server,
    free_port,
    http_get,
    prometheus,
    require_binary,
    running,
)
from testbed.victoria import import_series, victoria_metrics

if TYPE_CHECKING:
    from fleetwatch.sim.fleet import FleetSpec, Injected

PROMTOOL = "/usr/bin/promtool"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"


@contextlib.contextmanager
def node_exporter(
    workdir: Path,
    *,
    sysfs: Path,
    collectors: Sequence[str] | None,
    procfs: Path | None = None,
) -> Iterator[Server]:
    """Debian's node_exporter reading `sysfs` (and `procfs`, when given), with only the
    named collectors (None: its default collectors)."""
    require_binary(NODE_EXPORTER)
    port = free_port()
    chosen = [] if collectors is None else ["--collector.disable-defaults"]
    chosen += [f"--collector.{name}" for name in collectors or ()]
    argv = [
        NODE_EXPORTER,
        f"--web.listen-address=127.0.0.1:{port}",
        f"--path.sysfs={sysfs}",
        *([f"--path.procfs={procfs}"] if procfs is not None else []),
        *chosen,
    ]
    with running(
        argv,
        url=f"http://127.0.0.1:{port}",
        ready_path="/metrics",
        workdir=workdir,
        name="node_exporter",
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
        # A guard against a hang, under the suite's 300 s a test: `promtool test rules` of the
        # training file takes 70 s of one core alone, twice that beside the suite's workers.
        timeout=270,
        check=False,
    )


def backfill(openmetrics: Path, data: Path) -> None:
    """Prometheus blocks in `data` from an OpenMetrics file (`promtool tsdb
    create-blocks-from openmetrics`), for a Prometheus started on that storage."""
    result = promtool("tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(data))
    assert result.returncode == 0, result.stderr


def backfill_fleet(spec: FleetSpec, root: Path) -> Injected:
    """The simulated fleet's history (sim/fleet.py) as Prometheus blocks in `root/data`
    (through OpenMetrics in `root/fleet.om`), for a Prometheus started on that storage;
    returns what was injected."""
    from fleetwatch.sim.fleet import write_openmetrics  # numpy: only where a history is made

    plan = write_openmetrics(spec, root / "fleet.om")
    backfill(root / "fleet.om", root / "data")
    return plan


@contextlib.contextmanager
def history_store(
    engine: str,
    root: Path,
    *,
    openmetrics: Callable[[Path], object],
    victoria: Callable[[], Iterable[Mapping[str, Any]]],
) -> Iterator[Server]:
    """A real store holding one history: "prometheus" on blocks backfilled from the
    OpenMetrics `openmetrics(path)` writes, or "victoriametrics" fed `victoria()`'s
    JSON-lines series through its import API. Both keep samples of any age."""
    root.mkdir(parents=True, exist_ok=True)
    if engine == "victoriametrics":
        with victoria_metrics(root / "vm") as vm:
            import_series(vm, victoria())
            yield vm
        return
    openmetrics(root / "history.om")
    backfill(root / "history.om", root / "data")
    with history_prometheus(root) as prom:
        yield prom


@contextlib.contextmanager
def history_prometheus(
    root: Path,
    *,
    name: str = "prom",
    rule_files: Sequence[Path] = (),
    extra_args: Sequence[str] = (),
) -> Iterator[Server]:
    """A real Prometheus (working directory `root/name`) on the blocks in `root/data`,
    scraping nothing and keeping samples of any age."""
    with prometheus(
        root / name,
        scrape_configs=[],
        rule_files=rule_files,
        storage=root / "data",
        extra_args=["--storage.tsdb.retention.time=100y", *extra_args],
    ) as prom:
        yield prom


def report_recording_rules(path: Path, *, interval: str | None = None) -> Path:
    """Write to `path` the shipped recording rules whose series a report query reads
    (`Query.recorded`), as the generator builds them, and return it: what a backfill
    (`promtool tsdb create-blocks-from rules`, vmalert's replay) evaluates over a history.
    `interval` is their groups' evaluation interval (the history's step); None leaves it
    out, for the evaluator's own (promtool's `--eval-interval`)."""
    from fleetwatch.report.query_table import QUERIES  # pandas: only where the report is tested
    from fleetwatch.rules.config import load_config
    from fleetwatch.rules.groups import dump_groups, recording_groups

    records = {q.recorded.record for q in QUERIES if q.recorded is not None}
    groups: list[dict[str, Any]] = []
    for group in recording_groups(load_config()):
        rules = [rule for rule in group["rules"] if rule["record"] in records]
        if rules:
            groups.append({"name": group["name"], "rules": rules})
            if interval is not None:
                groups[-1]["interval"] = interval
    found = {rule["record"] for group in groups for rule in group["rules"]}
    if found != records:
        raise ValueError(f"no recording rule writes {sorted(records - found)}")
    path.write_text(dump_groups(groups))
    return path


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
def served_in_thread(
    app: web.Application, *, ssl_context: ssl.SSLContext | None = None
) -> Iterator[str]:
    """Serve `app` on a loopback port from a thread of its own (for code under test that
    runs its own event loop, or other processes), over TLS with `ssl_context`; yields its
    base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    started = threading.Event()
    ports: list[int] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(
            web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
        )
        ports.append(runner.addresses[0][1])
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, name="served-in-thread", daemon=True)
    thread.start()
    if not started.wait(10):
        raise AssertionError("the in-thread server did not start within 10s")
    try:
        yield f"{'http' if ssl_context is None else 'https'}://127.0.0.1:{ports[0]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
