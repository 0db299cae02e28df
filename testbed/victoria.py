"""VictoriaMetrics, vmagent and vmalert (Debian's `victoria-metrics`) for tests and benches.

The second engine the rules must agree with: single-node VictoriaMetrics as the store,
vmagent scraping targets and remote-writing into it, vmalert evaluating rule files against
it with MetricsQL (which does not extrapolate `increase()`), its state remote-written back.
Each server starts on a free loopback port with a temporary directory, is awaited with a
deadline and stopped by PID, through the same machinery as testbed.tool_servers.

Debian ships 1.79, whose vmalert refuses `keep_firing_for` (read from vmalert v1.92.0 on):
`rules_for_vmalert` strips it when the installed vmalert does not read it.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import subprocess
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from fleetwatch.sim.loopback_servers import Server, free_port, http_get, require_binary, running

VICTORIA_METRICS = "/usr/bin/victoria-metrics"
VMAGENT = "/usr/bin/vmagent"
VMALERT = "/usr/bin/vmalert"


@contextlib.contextmanager
def victoria_metrics(
    workdir: Path, *, retention: str = "100y", extra_args: Sequence[str] = ()
) -> Iterator[Server]:
    """Single-node VictoriaMetrics on a free loopback port, storing under `workdir`.

    Queries see samples as soon as they are stored (`-search.latencyOffset=0s`, no response
    cache): by default VictoriaMetrics hides the last 30 s, which would delay every alert
    vmalert evaluates against it by that much. The long default retention keeps imported
    history of any age.
    """
    args = [
        f"-storageDataPath={workdir / 'data'}",
        f"-retentionPeriod={retention}",
        "-search.latencyOffset=0s",
        "-search.disableCache",
        *extra_args,
    ]
    with _victoria_command(VICTORIA_METRICS, workdir, args) as server:
        yield server


@contextlib.contextmanager
def _victoria_command(binary: str, workdir: Path, args: Sequence[str]) -> Iterator[Server]:
    """`binary ARGS` listening on a free loopback port, ready when /health answers 200 (as
    every VictoriaMetrics command does once it serves)."""
    require_binary(binary)
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    with running(
        [binary, f"-httpListenAddr=127.0.0.1:{port}", *args],
        url=f"http://127.0.0.1:{port}",
        ready_path="/health",
        workdir=workdir,
        name=Path(binary).name,
    ) as server:
        yield server


@contextlib.contextmanager
def vmagent(
    workdir: Path,
    *,
    scrape_configs: list[dict[str, Any]],
    remote_write_url: str,
    scrape_interval: str = "1s",
) -> Iterator[Server]:
    """vmagent scraping `scrape_configs` (Prometheus syntax) and remote-writing every sample
    to `remote_write_url` (a VictoriaMetrics base URL or any remote-write endpoint URL)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "scrape.yml"
    config_path.write_text(
        yaml.safe_dump(
            {"global": {"scrape_interval": scrape_interval}, "scrape_configs": scrape_configs}
        )
    )
    args = [
        f"-promscrape.config={config_path}",
        f"-remoteWrite.url={remote_write_endpoint(remote_write_url)}",
        f"-remoteWrite.tmpDataPath={workdir / 'remote-write-queue'}",
    ]
    with _victoria_command(VMAGENT, workdir, args) as server:
        yield server


def remote_write_endpoint(url: str) -> str:
    """`url` if it names an endpoint already, else VictoriaMetrics' Prometheus remote-write
    path under that base URL."""
    return url if urllib.parse.urlsplit(url).path.strip("/") else f"{url}/api/v1/write"


@contextlib.contextmanager
def vmalert(
    workdir: Path,
    *,
    rule_files: Sequence[Path],
    datasource_url: str,
    notifier_urls: Sequence[str],
    remote_write_url: str | None = None,
    remote_read_url: str | None = None,
    evaluation_interval: str = "5s",
    extra_args: Sequence[str] = (),
) -> Iterator[Server]:
    """vmalert evaluating `rule_files` against `datasource_url`, sending alerts to
    `notifier_urls` (Alertmanager base URLs; 1.79 has no `-notifier.blackhole` and refuses
    alerting rules without a notifier). With `remote_write_url` it writes recording-rule
    results and alert state there (recording rules need it to be read back); with
    `remote_read_url` it restores alert state on start.

    Rule files must be readable by this vmalert (see `rules_for_vmalert`). Alerts carry no
    `alertgroup` label, so their labels compare with Prometheus' as they are.
    """
    if not notifier_urls:
        raise ValueError("vmalert needs at least one notifier URL (an Alertmanager) to start")
    args = [
        *(f"-rule={path}" for path in rule_files),
        f"-datasource.url={datasource_url}",
        *(f"-notifier.url={url}" for url in notifier_urls),
        f"-evaluationInterval={evaluation_interval}",
        "-disableAlertgroupLabel",
        *extra_args,
    ]
    if remote_write_url is not None:
        args += [f"-remoteWrite.url={remote_write_url}", "-remoteWrite.flushInterval=1s"]
    if remote_read_url is not None:
        args.append(f"-remoteRead.url={remote_read_url}")
    with _victoria_command(VMALERT, workdir, args) as server:
        yield server


REPLAY_POINTS = 12
"""Points of each rule per replay request (an hour at a 5-minute step)."""
REPLAY_QUEUE = 10_000_000
"""vmalert's write queue in replay, in points: a request's answer at 80,000 series x
`REPLAY_POINTS` (960,000 points) with room for the next."""


def vmalert_replay(
    workdir: Path, *, rule_files: Sequence[Path], url: str, start: float, end: float
) -> None:
    """Evaluate the recording rules of `rule_files` over the history in [start, end] (epoch
    seconds) with vmalert's replay mode, reading from and writing their series into the
    VictoriaMetrics at `url`: recorded series for a history imported raw. Each group is
    evaluated at its own `interval`. Runs to completion (its log in `workdir`); raises
    naming vmalert's exit status and log tail when it fails."""
    require_binary(VMALERT)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "vmalert-replay.log"

    def rfc3339(seconds: float) -> str:
        return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    with log_path.open("wb") as log:
        result = subprocess.run(
            [
                VMALERT,
                *(f"-rule={path}" for path in rule_files),
                f"-datasource.url={url}",
                f"-remoteWrite.url={url}",
                f"-replay.timeFrom={rfc3339(start)}",
                f"-replay.timeTo={rfc3339(end)}",
                "-replay.disableProgressBar",
                # A rule's answer per request is its series times these points; the write
                # queue must hold it whole, or vmalert drops what does not fit (by default
                # 1,000 points a request into a 100,000-point queue: 7,000 of 80,000 GPUs).
                f"-replay.maxDatapointsPerQuery={REPLAY_POINTS}",
                f"-remoteWrite.maxQueueSize={REPLAY_QUEUE}",
                "-remoteWrite.concurrency=4",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            timeout=3600,
            check=False,
        )
    if result.returncode != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"vmalert replay exited {result.returncode}:\n{tail}")


def vmalert_alerts(server: Server) -> list[dict[str, Any]]:
    """Alerts vmalert currently holds (pending and firing), as its /api/v1/alerts lists them
    (`name`, `state`, `labels`, `annotations`, `value`, `activeAt`)."""
    body = json.loads(http_get(f"{server.url}/api/v1/alerts"))
    if body.get("status") != "success":
        raise AssertionError(f"vmalert /api/v1/alerts failed: {body}")
    # 1.79 answers `null` rather than an empty list while it holds no alert.
    alerts: list[dict[str, Any]] = body["data"]["alerts"] or []
    return alerts


def vmalert_check(rule_files: Sequence[Path]) -> subprocess.CompletedProcess[str]:
    """`vmalert -dryRun` on `rule_files`: parses them and validates every expression with
    MetricsQL and every template. Never raises on exit status."""
    require_binary(VMALERT)
    return subprocess.run(
        [VMALERT, "-dryRun", *(f"-rule={path}" for path in rule_files)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@functools.cache
def vmalert_reads_keep_firing_for() -> bool:
    """Whether the installed vmalert accepts `keep_firing_for` (from v1.92.0 on), found by
    checking a one-rule file with it: Debian's build prints no version number."""
    rule = {"alert": "Probe", "expr": "vector(1)", "for": "1m", "keep_firing_for": "1m"}
    with tempfile.TemporaryDirectory(prefix="vmalert-probe-") as folder:
        probe = Path(folder) / "probe.yaml"
        probe.write_text(yaml.safe_dump({"groups": [{"name": "probe", "rules": [rule]}]}))
        result = vmalert_check([probe])
    if result.returncode == 0:
        return True
    if "keep_firing_for" in result.stderr + result.stdout:
        return False
    raise AssertionError(f"vmalert -dryRun refused a valid probe rule:\n{result.stderr}")


def without_keep_firing_for(groups: Mapping[str, Any]) -> dict[str, Any]:
    """A rule file's content (`{"groups": [...]}`) with `keep_firing_for` dropped from every
    rule: what vmalert before v1.92.0 reads. Alerts then resolve as soon as their condition
    clears instead of after the hold."""
    return {
        **groups,
        "groups": [
            {
                **group,
                "rules": [
                    {key: value for key, value in rule.items() if key != "keep_firing_for"}
                    for rule in group["rules"]
                ],
            }
            for group in groups["groups"]
        ],
    }


def rules_for_vmalert(rule_file: Path, out_dir: Path) -> Path:
    """`rule_file` as the installed vmalert reads it: unchanged from v1.92.0 on, else a copy
    in `out_dir` without `keep_firing_for`."""
    if vmalert_reads_keep_firing_for():
        return rule_file
    out_dir.mkdir(parents=True, exist_ok=True)
    stripped = out_dir / rule_file.name
    content = yaml.safe_load(rule_file.read_text())
    stripped.write_text(yaml.safe_dump(without_keep_firing_for(content), allow_unicode=True))
    return stripped


def import_series(server: Server, series: Iterable[Mapping[str, Any]]) -> None:
    """Store samples through VictoriaMetrics' JSON-lines import API and make them queryable
    at once. Each item is `{"metric": {"__name__": ..., label: value}, "values": [...],
    "timestamps": [unix milliseconds...]}`."""
    body = b"".join(json.dumps(item).encode() + b"\n" for item in series)
    _post(f"{server.url}/api/v1/import", body)
    force_flush(server)


def force_flush(server: Server) -> None:
    """Make samples VictoriaMetrics has received visible to queries now (it otherwise
    buffers them for up to a second)."""
    http_get(f"{server.url}/internal/force_flush")


def query_range(
    server: Server, expr: str, *, start: float, end: float, step: str
) -> list[dict[str, Any]]:
    """A range query through the Prometheus HTTP API (VictoriaMetrics and Prometheus alike);
    returns `data.result` (a matrix). Instant queries: testbed.tool_servers.prom_query."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    body = json.loads(http_get(f"{server.url}/api/v1/query_range?{params}", timeout=60))
    if body.get("status") != "success":
        raise AssertionError(f"range query {expr!r} failed: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _post(url: str, body: bytes) -> None:
    request = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        if response.status not in (200, 204):
            raise AssertionError(f"POST {url} answered {response.status}")
