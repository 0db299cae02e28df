"""The live lemon rule's path on loopback: a scripted scrape target, Prometheus evaluating
the rules generated with shortened live windows, Alertmanager with the shipped route, and
`fleetwatch taint` taking nodes out on whatever backend the caller names.

The target (`InterruptionTarget`) serves the series the interruption rules read
(rules/alerts/goodput.py): kube-state-metrics' pods of training jobs on nodes
(`kube_pod_labels` with the JobSet name, `kube_pod_info`, container restart counts) and,
per node, the exporter's GPU allocation (a Kubernetes pod's, or a Slurm job's under
`namespace="slurm"`); a test restarts a pod's container or makes a node's exporter silent
(its scrape answers 503) as it goes, and polls for what follows. The rules are rendered by
`fleetwatch rules generate --rules.config-file` from `FAST_LIVE` (one-second scrapes and
evaluations, seconds-long live windows), as an operator would override them; the tainter
reads the same override. Every server goes on the caller's ExitStack.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.catalog.allocation import GPU_ALLOCATION_INFO
from fleetwatch.catalog.slurm import SLURM_NAMESPACE
from fleetwatch.catalog.tainter import TAINTER_UNTAINT_DEFERRED_TOTAL
from fleetwatch.cli import main
from fleetwatch.rules.config import ALERTS_FILE, GLOBAL_FILE, RECORDING_FILE, load_config
from fleetwatch.rules.definitions import kube_state_metrics_label
from fleetwatch.sim.loopback_servers import (
    Server,
    alertmanager,
    free_port,
    http_get,
    prometheus,
)
from fleetwatch.sim.stack import WEBHOOK_BEARER_FILE, alertmanager_config, tainter_process
from testbed.tool_servers import served_in_thread

JOB_LABEL: Final = kube_state_metrics_label(load_config().job_label_keys[0])
"""kube_pod_labels' label of the first job label key (JobSet's name)."""
LEMON_WINDOW_SECONDS: Final = 30
INTERVAL: Final = "1s"
MERGE_WINDOW: Final = "5s"
FAST_LIVE: Final[dict[str, Any]] = {
    "intervals": {"scrape": INTERVAL, "evaluation": INTERVAL},
    "thresholds": {
        "goodput": {
            "live_merge_window": MERGE_WINDOW,
            "live_startup_grace": "10s",
            "live_node_silence": "4s",
            "live_lemon_window": f"{LEMON_WINDOW_SECONDS}s",
        }
    },
}
"""The rules config override of the live tests: the live windows from minutes and a day
to seconds, so a lemon is taken out (and its alert resolves) within a test."""


@dataclass
class _Pod:
    namespace: str
    name: str
    job: str
    node: str
    restarts: int = 0


@dataclass
class InterruptionTarget:
    """What the target serves now; the test changes it between scrapes."""

    pods: dict[str, _Pod] = field(default_factory=dict)
    slurm_jobs: dict[str, list[str]] = field(default_factory=dict)
    silent: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_pod(self, name: str, *, job: str, node: str, namespace: str = "ml") -> None:
        """A running pod of JobSet `job` on `node`, holding GPU 0 there."""
        with self.lock:
            self.pods[name] = _Pod(namespace=namespace, name=name, job=job, node=node)

    def restart(self, pod: str) -> None:
        """The pod's container restarts in place (its restart count grows by one)."""
        with self.lock:
            self.pods[pod].restarts += 1

    def run_slurm_job(self, job_id: str, node: str) -> None:
        """Slurm job `job_id` holds a GPU of `node` (its exporter's allocation series)."""
        with self.lock:
            self.slurm_jobs.setdefault(node, []).append(job_id)

    def end_slurm_job(self, job_id: str, node: str) -> None:
        """Slurm job `job_id` no longer holds a GPU of `node`."""
        with self.lock:
            self.slurm_jobs[node].remove(job_id)

    def silence(self, node: str, *, silent: bool = True) -> None:
        """The node's exporter stops answering (a node that fails), or answers again."""
        with self.lock:
            (self.silent.add if silent else self.silent.discard)(node)

    def kube_state_metrics(self) -> str:
        """kube-state-metrics' exposition of the pods."""
        lines = []
        with self.lock:
            for p in self.pods.values():
                ident = f'namespace="{p.namespace}",pod="{p.name}",uid="{p.name}-uid"'
                lines += [
                    f'kube_pod_labels{{{ident},{JOB_LABEL}="{p.job}"}} 1',
                    f'kube_pod_info{{{ident},node="{p.node}"}} 1',
                    f'kube_pod_container_status_restarts_total{{{ident},container="trainer"}} '
                    f"{p.restarts}",
                ]
        return "\n".join(lines) + "\n"

    def exporter(self, node: str) -> str | None:
        """The node exporter's GPU allocation exposition, None while the node is silent."""
        with self.lock:
            if node in self.silent:
                return None
            owners = [(p.namespace, p.name) for p in self.pods.values() if p.node == node]
            owners += [(SLURM_NAMESPACE, job) for job in self.slurm_jobs.get(node, [])]
        lines = [
            f'{GPU_ALLOCATION_INFO.name}{{gpu="{gpu}",uuid="GPU-{node}-{gpu}",'
            f'namespace="{namespace}",pod="{pod}",container="trainer",claim=""}} 1'
            for gpu, (namespace, pod) in enumerate(owners)
        ]
        return "\n".join(lines) + "\n"

    def app(self) -> web.Application:
        """The target: /kube-state-metrics and /node/NAME (an exporter per node)."""

        async def ksm(_: web.Request) -> web.Response:
            return web.Response(text=self.kube_state_metrics())

        async def node(request: web.Request) -> web.Response:
            text = self.exporter(request.match_info["node"])
            if text is None:
                return web.Response(status=503, text="silent")
            return web.Response(text=text)

        app = web.Application()
        app.router.add_get("/kube-state-metrics", ksm)
        app.router.add_get("/node/{node}", node)
        return app


def scrape_configs(url: str, nodes: Sequence[str]) -> list[dict[str, Any]]:
    """The target as the shipped rules select it: each node's exporter (job `fleetwatch`,
    with its `node` label) and kube-state-metrics."""
    jobs = load_config().scrape_jobs()
    address = url.removeprefix("http://")
    return [
        {
            "job_name": jobs["exporter"],
            "static_configs": [
                {"targets": [address], "labels": {"node": n, "__metrics_path__": f"/node/{n}"}}
                for n in nodes
            ],
        },
        {
            "job_name": jobs["kube_state_metrics"],
            "metrics_path": "/kube-state-metrics",
            "static_configs": [{"targets": [address]}],
        },
    ]


def fast_rules(workdir: Path) -> tuple[Path, list[Path]]:
    """The override file holding `FAST_LIVE` and the rule files (both scopes)
    `fleetwatch rules generate` renders from it."""
    workdir.mkdir(parents=True, exist_ok=True)
    override = workdir / "rules-override.yaml"
    override.write_text(yaml.safe_dump(FAST_LIVE))
    out = workdir / "rules"
    status = main(["rules", "generate", f"--rules.config-file={override}", f"--out={out}"])
    if status != 0:
        raise RuntimeError(f"fleetwatch rules generate exited {status}")
    return override, [out / f.name for f in (ALERTS_FILE, RECORDING_FILE, GLOBAL_FILE)]


@dataclass(frozen=True)
class LemonStack:
    """The servers of the path, and the target they read; no Alertmanager and no tainter
    when the caller asked for Prometheus alone."""

    target: InterruptionTarget
    prometheus: Server
    alertmanager: Server | None
    tainter: Server | None
    override: Path

    def untaint_deferred(self, why: str) -> float:
        """Untaint checks the tainter answered with `why` (`manual`: a person releases it)."""
        assert self.tainter is not None, "the stack runs no tainter"
        text = http_get(f"{self.tainter.url}/metrics").decode()
        name = TAINTER_UNTAINT_DEFERRED_TOTAL.name
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and sample.labels.get("why") == why
        )


def start_lemon_stack(
    workdir: Path,
    servers: contextlib.ExitStack,
    *,
    nodes: Sequence[str],
    tainter_args: Sequence[str] | None,
) -> LemonStack:
    """The target for `nodes` and Prometheus evaluating the fast rules; with `tainter_args`
    (its backend), the tainter and Alertmanager routing to it. `servers` stops them all."""
    target = InterruptionTarget()
    url = servers.enter_context(served_in_thread(target.app()))
    override, rule_files = fast_rules(workdir)
    ports: list[int] = []
    while len(ports) < 3:  # Prometheus, Alertmanager, the tainter: free now, and distinct
        port = free_port()
        ports += [] if port in ports else [port]
    prom_port, am_port, tainter_port = ports
    tainter = am = None
    if tainter_args is not None:
        tainter = servers.enter_context(
            tainter_process(
                workdir,
                port=tainter_port,
                prometheus_url=f"http://127.0.0.1:{prom_port}",
                alertmanager_url=f"http://127.0.0.1:{am_port}",
                args=[f"--rules.config-file={override}", "--reconcile.interval=2s", *tainter_args],
            )
        )
        am = servers.enter_context(
            alertmanager(
                workdir / "alertmanager",
                config=alertmanager_config(
                    tainter_url=tainter.url, token_file=workdir / WEBHOOK_BEARER_FILE
                ),
                port=am_port,
            )
        )
    prom = servers.enter_context(
        prometheus(
            workdir / "prometheus",
            port=prom_port,
            scrape_configs=scrape_configs(url, nodes),
            rule_files=rule_files,
            alertmanager_urls=[am.url] if am else [],
            scrape_interval=INTERVAL,
            evaluation_interval=INTERVAL,
        )
    )
    return LemonStack(
        target=target, prometheus=prom, alertmanager=am, tainter=tainter, override=override
    )


@contextlib.contextmanager
def lemon_stack(
    workdir: Path, *, nodes: Sequence[str], tainter_args: Sequence[str] | None
) -> Iterator[LemonStack]:
    """`start_lemon_stack` on its own ExitStack, stopped when the block ends."""
    with contextlib.ExitStack() as servers:
        yield start_lemon_stack(workdir, servers, nodes=nodes, tainter_args=tainter_args)
