"""`fleetwatch demo`: the whole stack on this machine, with simulated hardware.

Starts the exporter on the `demo` scenario (or `--scenario`); when installed, a real
Prometheus scraping it (with a `node` label, loading the shipped rules), a simulated
Kubernetes cluster (clearly labelled: the node, its kubelet's pod-to-GPU allocations and
kube-state-metrics' pod labels, from the scenario's `pods:`) and a real Alertmanager
routing taint alerts; when the tainter is part of the build, the tainter against the
simulated cluster. It prints the story of the scenario it runs (from its faults and pods:
with the built-in `demo`, a GPU heats past 78 °C and the node is tainted, and a training
job waits for its thermally throttled GPU while another GPU idles), follows it as it
happens (firing alerts, node taints) and stops every process it started on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from fleetwatch.collectors.sim.scenario import Fault, Scenario, ScenarioError, load_scenario
from fleetwatch.flags import listen_address

log = logging.getLogger(__name__)

RULES_PACKAGE = "fleetwatch.rules"
RULE_FILES = ("fleetwatch.rules.yaml", "fleetwatch.recording.yaml")
ALERTMANAGER_ROUTE = "alertmanager.yml"
PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
NODE = "demo-node"
DEFAULT_PORTS = {
    "exporter": 9842,
    "prometheus": 9090,
    "alertmanager": 9093,
    "tainter": 9843,
    "cluster": 18443,
}
INSTALL_HINT = "sudo apt-get install -y --no-install-recommends prometheus prometheus-alertmanager"


def add_subcommands(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register `fleetwatch demo`."""
    parser = subparsers.add_parser(
        "demo",
        help="run the whole stack locally on simulated hardware",
        description="Exporter, Prometheus, Alertmanager and the tainter on a simulated node.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--scenario", default="demo", help="built-in scenario name or file (default demo)"
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="stop after this many seconds (default: run until Ctrl-C)",
    )
    parser.set_defaults(run=run_demo)

    simulate = subparsers.add_parser("simulate-cluster")  # no help: hidden, for the demo
    simulate.add_argument(
        "--web.listen-address",
        dest="listen",
        type=listen_address,
        default=listen_address("127.0.0.1:0"),
    )
    simulate.add_argument("--node", dest="nodes", action="append", default=[])
    simulate.add_argument(
        "--node-scenario",
        dest="node_scenarios",
        action="append",
        type=node_scenario,
        default=[],
        metavar="NODE=SCENARIO",
        help="a node whose scenario's pods the cluster shows: its kubelet's PodResources "
        "socket KUBELET_DIR/NODE.sock and kube_pod_labels at /metrics",
    )
    simulate.add_argument("--kubelet-dir", type=Path, default=None)
    simulate.add_argument("--kubeconfig-out", type=Path, required=True)
    simulate.set_defaults(run=_run_simulate)


def node_scenario(text: str) -> tuple[str, Scenario]:
    """`NODE=SCENARIO` (a built-in name or a file) for `simulate-cluster --node-scenario`."""
    node, sep, spec = text.partition("=")
    if not sep or not node or not spec:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NODE=SCENARIO")
    try:
        return node, load_scenario(spec)
    except ScenarioError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def free_port(preferred: int) -> int:
    """`preferred` when nothing listens there, else any free loopback port."""
    for candidate in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            port: int = sock.getsockname()[1]
            return port
    raise OSError("no free TCP port on 127.0.0.1")


@dataclass
class Stack:
    """The processes the demo started, stopped by PID in reverse order."""

    workdir: Path
    processes: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], ready_url: str, timeout: float = 60) -> None:
        logfile = (self.workdir / f"{name}.log").open("wb")
        process = subprocess.Popen(
            argv,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            start_new_session=True,
        )
        logfile.close()
        self.processes.append((name, process))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail}")
            if http_ok(ready_url):
                return
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not become ready at {ready_url} within {timeout:g}s")

    def stop(self) -> None:
        for _name, process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _name, process in reversed(self.processes):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback
        return json.load(response)


def fleetwatch(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetwatch", *args, "--log.format=json"]


def run_demo(args: argparse.Namespace) -> int:
    """Entry point of `fleetwatch demo`."""
    workdir = Path(tempfile.mkdtemp(prefix="fleetwatch-demo-"))
    stack = Stack(workdir=workdir)
    stopping = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"fleetwatch demo: error: {exc}", file=sys.stderr)
        return 2
    try:
        urls = start_stack(stack, args.scenario)
        print_banner(urls, workdir, scenario)
        follow_story(
            urls,
            deadline=time.monotonic() + args.duration if args.duration else None,
            stopping=lambda: stopping,
        )
    except RuntimeError as exc:
        print(f"fleetwatch demo: error: {exc}", file=sys.stderr)
        return 1
    finally:
        print("\nstopping every process the demo started ...", flush=True)
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def start_stack(stack: Stack, scenario: str) -> dict[str, str]:
    """Start what is installed; return the URLs of what runs."""
    ports = {name: free_port(preferred) for name, preferred in DEFAULT_PORTS.items()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    port = ports["exporter"]
    running = {"exporter": urls["exporter"]}
    stack.start(
        "exporter",
        fleetwatch(
            "export",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--simulate={scenario}",
            "--collection-interval=2s",
            f"--collector.podresources.socket={stack.workdir / f'{NODE}.sock'}",
            "--collector.podresources.refresh-interval=2s",
        ),
        urls["exporter"] + "/readyz",
    )
    if not Path(PROMETHEUS).exists():
        return running
    start_cluster(stack, urls, scenario)
    running["cluster"] = urls["cluster"]
    if _tainter_available() and Path(ALERTMANAGER).exists():
        start_tainter(stack, urls)
        running["tainter"] = urls["tainter"]
    if Path(ALERTMANAGER).exists():
        start_alertmanager(stack, urls, with_tainter="tainter" in running)
        running["alertmanager"] = urls["alertmanager"]
    start_prometheus(stack, urls, with_alertmanager="alertmanager" in running)
    running["prometheus"] = urls["prometheus"]
    return running


def _tainter_available() -> bool:
    try:
        import fleetwatch.tainter.cli  # noqa: F401
    except ImportError:
        return False
    return True


def start_cluster(stack: Stack, urls: dict[str, str], scenario: str) -> None:
    """A SIMULATED Kubernetes cluster with one node: its API, its kubelet's PodResources
    socket (which the exporter reads) and kube-state-metrics' pod labels at /metrics."""
    stack.start(
        "simulated-cluster",
        fleetwatch(
            "simulate-cluster",
            f"--web.listen-address={urls['cluster'][7:]}",
            f"--node-scenario={NODE}={scenario}",
            f"--kubelet-dir={stack.workdir}",
            f"--kubeconfig-out={stack.workdir / 'simulated-kubeconfig.yaml'}",
        ),
        f"{urls['cluster']}/api/v1/nodes/{NODE}",
    )


def start_tainter(stack: Stack, urls: dict[str, str]) -> None:
    """The tainter, writing to the SIMULATED cluster's API."""
    kubeconfig = stack.workdir / "simulated-kubeconfig.yaml"
    token = stack.workdir / "webhook-token"
    token.write_text(os.urandom(16).hex())
    stack.start(
        "tainter",
        fleetwatch(
            "taint",
            f"--web.listen-address={urls['tainter'][7:]}",
            f"--web.token-file={token}",
            f"--kubeconfig={kubeconfig}",
            f"--prometheus-url={urls['prometheus']}",
            "--untaint.hold=30s",
            f"--alertmanager-url={urls['alertmanager']}",
        ),
        f"{urls['tainter']}/healthz",
    )


def shipped_rule_text(name: str) -> str:
    """A rules or Alertmanager file as the installed package ships it."""
    return resources.files(RULES_PACKAGE).joinpath(name).read_text(encoding="utf-8")


def start_alertmanager(stack: Stack, urls: dict[str, str], *, with_tainter: bool) -> None:
    """Alertmanager with the shipped taint route pointed at the demo's tainter."""
    config: dict[str, Any] = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
    if with_tainter:
        config = yaml.safe_load(shipped_rule_text(ALERTMANAGER_ROUTE))
        for receiver in config.get("receivers", []):
            for hook in receiver.get("webhook_configs", []):
                hook["url"] = f"{urls['tainter']}/alerts"
                authorization = hook.setdefault("http_config", {}).setdefault("authorization", {})
                authorization["credentials_file"] = str(stack.workdir / "webhook-token")
    path = stack.workdir / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    stack.start(
        "alertmanager",
        [
            ALERTMANAGER,
            f"--config.file={path}",
            f"--storage.path={stack.workdir / 'am'}",
            f"--web.listen-address={urls['alertmanager'][7:]}",
            "--cluster.listen-address=",
        ],
        urls["alertmanager"] + "/-/ready",
    )


def start_prometheus(stack: Stack, urls: dict[str, str], *, with_alertmanager: bool) -> None:
    """Prometheus scraping the exporter as node `demo-node`, with the shipped rules."""
    rule_files = []
    for name in RULE_FILES:
        path = stack.workdir / name
        path.write_text(shipped_rule_text(name))
        rule_files.append(str(path))
    config: dict[str, Any] = {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": rule_files,
        "scrape_configs": [
            {
                "job_name": "fleetwatch",
                "static_configs": [{"targets": [urls["exporter"][7:]], "labels": {"node": NODE}}],
            },
            {
                "job_name": "kube-state-metrics",
                "static_configs": [{"targets": [urls["cluster"][7:]]}],
            },
        ],
    }
    if with_alertmanager:
        config["alerting"] = {
            "alertmanagers": [{"static_configs": [{"targets": [urls["alertmanager"][7:]]}]}]
        }
    path = stack.workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    stack.start(
        "prometheus",
        [
            PROMETHEUS,
            f"--config.file={path}",
            f"--storage.tsdb.path={stack.workdir / 'prom'}",
            f"--web.listen-address={urls['prometheus'][7:]}",
        ],
        urls["prometheus"] + "/-/ready",
    )


def print_banner(urls: dict[str, str], workdir: Path, scenario: Scenario) -> None:
    """Where to look, and the story of the scenario being run."""
    lines = [
        "",
        f"fleetwatch demo: scenario {scenario.name}, a simulated node named {NODE} with "
        f"{scenario.gpus} x {scenario.gpu_model}",
    ]
    if scenario.description:
        lines.append(f"  ({scenario.description})")
    lines.append(f"  exporter      {urls['exporter']}/            (landing page, /metrics)")
    if "prometheus" in urls:
        query = "fleetwatch_gpu_temperature_celsius%7Bsensor%3D%22gpu%22%7D"
        lines += [
            f"  prometheus    {urls['prometheus']}/graph?g0.expr={query}",
            f"                {urls['prometheus']}/alerts",
        ]
    else:
        lines += [
            "  prometheus    not installed: the exporter runs alone. For the whole stack run",
            f"                {INSTALL_HINT}",
        ]
    if "alertmanager" in urls:
        lines.append(f"  alertmanager  {urls['alertmanager']}/")
    if "cluster" in urls:
        lines += [
            f"  SIMULATED k8s {urls['cluster']}/api/v1/nodes/{NODE}  (not a real cluster)",
            f"                {urls['cluster']}/metrics  (its kube-state-metrics pod labels)",
        ]
    if "tainter" in urls:
        lines.append(f"  tainter       {urls['tainter']}/metrics")
    lines += ["", *story(scenario, workdir)]
    lines += [f"Logs: {workdir}. Press Ctrl-C to stop.", ""]
    print("\n".join(lines), flush=True)


def story(scenario: Scenario, workdir: Path) -> list[str]:
    """What the scenario's pods and faults make happen, in time order, for the banner."""
    from fleetwatch.rules.config import load_config, parameters

    config = load_config()
    limit = float(parameters(config)["thresholds.gpu_temperature_celsius"])
    waits = {name: config.alerts[name].for_ for name in ("GPUStraggler", "GPUIdleInJob")}
    busiest = _busiest_throttled(scenario)
    lines = []
    for pod in scenario.pods:
        gpus = ", ".join(str(g) for g in pod.gpus)
        job = next(iter(pod.labels.values()), pod.name)
        lines.append(
            f"  Pod {pod.namespace}/{pod.name} (training job {job}) holds GPUs {gpus}: the "
            "per-job alerts compare them"
        )
    if not scenario.faults:
        return [*lines, "  No faults: every GPU, link and port stays healthy.", ""]
    lines.append("What happens (times from the exporter's start):")
    for fault in scenario.faults:
        text = _fault_story(fault, limit=limit, busiest=busiest, waits=waits)
        if fault.kind == "gpu_lost":
            text += (
                " The gpu-lost taint stays until a person runs\n"
                f"          fleetwatch untaint {NODE} --reason gpu-lost "
                f"--kubeconfig={workdir}/simulated-kubeconfig.yaml"
            )
        lines.append(f"  t={fault.at:g}s".ljust(10) + text)
    return [*lines, ""]


def _busiest_throttled(scenario: Scenario) -> set[int]:
    """GPUs that throttle while a tensor-activity fault makes them the busiest of their pod:
    the straggler their training job waits for."""
    top = {
        f.gpu
        for f in scenario.faults
        if f.kind == "tensor_active" and (f.value or 0) > scenario.baseline.tensor_active
    }
    held = {g for pod in scenario.pods for g in pod.gpus}
    throttled = {f.gpu for f in scenario.faults if f.kind == "throttle"}
    return {gpu for gpu in held if gpu in top and gpu in throttled}


def _fault_story(fault: Fault, *, limit: float, busiest: set[int], waits: dict[str, str]) -> str:
    """One line of the story for one fault; `waits` holds the per-job alerts' `for`."""
    gpu = f"GPU {fault.gpu}"
    lasting = f" for {fault.seconds:g}s" if fault.seconds else ""
    if fault.kind == "temperature":
        if fault.celsius is not None and fault.celsius > limit:
            # A ramp of minutes leaves GPUOverheatingSoon (trend over 10m, for 2m) time to warn.
            early = "GPUOverheatingSoon warns on the way, " if fault.ramp_seconds >= 180 else ""
            return (
                f"{gpu} heats to {fault.celsius:g} °C: {early}GPUOverheating fires above "
                f"{limit:g} °C and the node is tainted fleetwatch.io/gpu-overheat"
            )
        return (
            f"{gpu} cools to {fault.celsius:g} °C: the overheat taint goes after the "
            "tainter's hold time, once Prometheus shows the node cool"
        )
    if fault.kind == "throttle":
        text = f"{gpu} slows its clocks ({fault.reason}){lasting}"
        if fault.gpu in busiest:
            return (
                f"{text} while it is its training job's busiest GPU: the GPU the job waits "
                f"for, GPUStraggler (after {waits['GPUStraggler']})"
            )
        return text
    if fault.kind == "tensor_active":
        value = fault.value or 0.0
        if fault.gpu in busiest:
            return f"{gpu}'s tensor cores run at {value:.0%}, the busiest of its job"
        return (
            f"{gpu}'s tensor cores drop to {value:.0%}{lasting}: GPUIdleInJob "
            f"(after {waits['GPUIdleInJob']}) when its job trains on"
        )
    return _other_fault_story(fault, gpu=gpu, lasting=lasting)


def _other_fault_story(fault: Fault, *, gpu: str, lasting: str) -> str:
    """The story line of a fault that neither heats, throttles nor idles a GPU."""
    port = f"InfiniBand {fault.device}/{fault.port}"
    match fault.kind:
        case "nvlink_errors":
            return (
                f"NVLink {fault.link} of {gpu} counts {fault.per_second:g} {fault.error} "
                f"errors/s{lasting}: NVLinkErrorsRising"
            )
        case "nvlink_down":
            return f"NVLink {fault.link} of {gpu} goes down{lasting}: NVLinkDown"
        case "ib_port_down":
            return f"{port} goes down{lasting}" + (": a flap" if lasting else "")
        case "ib_errors":
            return f"{port} counts {fault.per_second:g} {fault.error} errors/s{lasting}"
        case "ib_rate":
            return f"{port} trains at {fault.value:g} Gb/s{lasting}: InfiniBandLinkDegraded"
        case "xid":
            return f"{gpu} reports Xid {fault.xid}"
        case "gpu_lost":
            return f"{gpu} falls off the bus: tainted fleetwatch.io/gpu-lost."
        case "hang":
            return (
                f"NVML call {fault.call} hangs for {fault.seconds:g}s: the collector reading "
                "it is reported down, nothing else is"
            )
        case "ecc_errors":
            return f"{gpu} counts {fault.per_second:g} {fault.error} ECC errors/s{lasting}"
        case "row_remap":
            return f"{gpu} has a {fault.error} row remap event"
    return f"{fault.kind} on {gpu}{lasting}"


def follow_story(urls: dict[str, str], *, deadline: float | None, stopping: Any) -> None:
    """Print what changes: hottest GPU, firing alerts, node taints."""
    start = time.monotonic()
    last: dict[str, str] = {}
    while not stopping() and (deadline is None or time.monotonic() < deadline):
        for key, value in observe(urls).items():
            if last.get(key) != value:
                print(f"[t={time.monotonic() - start:5.0f}s] {key}: {value}", flush=True)
                last[key] = value
        for _ in range(10):
            if stopping():
                return
            time.sleep(0.1)


def observe(urls: dict[str, str]) -> dict[str, str]:
    seen: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError, KeyError):
        if "prometheus" in urls:
            alerts = http_json(urls["prometheus"] + "/api/v1/alerts")["data"]["alerts"]
            firing = sorted({a["labels"]["alertname"] for a in alerts if a["state"] == "firing"})
            seen["firing alerts"] = ", ".join(firing) or "none"
    with contextlib.suppress(OSError, ValueError, KeyError):
        if "cluster" in urls:
            node = http_json(f"{urls['cluster']}/api/v1/nodes/{NODE}")
            taints = node.get("spec", {}).get("taints") or []
            seen["node taints"] = (
                ", ".join(f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in taints)
                or "none"
            )
    return seen


def _run_simulate(args: argparse.Namespace) -> int:
    """`fleetwatch simulate-cluster`: the demo's stand-in Kubernetes API, in its own process."""
    import asyncio

    from aiohttp import web

    from fleetwatch.collectors.sim.kubeapi import FakeCluster, make_app, write_kubeconfig
    from fleetwatch.collectors.sim.kubelet import kube_pod_labels, serve_kubelet

    nodes = [*args.nodes, *(node for node, _ in args.node_scenarios)]
    if not nodes:
        print("fleetwatch simulate-cluster: error: give --node or --node-scenario", file=sys.stderr)
        return 2
    # No token: a loopback-only simulation that people (and the demo) read with plain curl.
    cluster = FakeCluster(token=None)
    for name in nodes:
        cluster.add_node(name, labels={"nvidia.com/gpu.present": "true"})
    host, port = args.listen
    pod_labels = kube_pod_labels(scenario for _, scenario in args.node_scenarios)
    kubelet_dir: Path = args.kubelet_dir or args.kubeconfig_out.parent

    async def metrics(_request: web.Request) -> web.Response:
        """kube-state-metrics' kube_pod_labels for the scenarios' pods."""
        return web.Response(text=pod_labels, content_type="text/plain")

    async def serve() -> None:
        app = make_app(cluster)
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
        server = f"http://{host}:{bound}"
        write_kubeconfig(args.kubeconfig_out, server=server, token=None)
        log.warning(
            "SIMULATED Kubernetes cluster (not a real API server) serving nodes",
            extra={
                "server": server,
                "nodes": nodes,
                "kubeconfig": str(args.kubeconfig_out),
                "see_taints": f"{server}/api/v1/nodes/{nodes[0]}",
            },
        )
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.ExitStack() as kubelets:
        for node, scenario in args.node_scenarios:
            kubelets.enter_context(serve_kubelet(scenario, kubelet_dir / f"{node}.sock"))
        try:
            asyncio.run(serve())
        except KeyboardInterrupt:
            return 0
    return 0
