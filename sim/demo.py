"""`fleetwatch demo`: the whole stack on this machine, with simulated hardware.

Starts, through the same harness as the integration tests (`fleetwatch.sim.stack`), a
simulated Kubernetes cluster (clearly labelled: the node, its kubelet's pod-to-GPU
allocations and kube-state-metrics' pod labels, from the scenario's `pods:`) and the
exporter on the `demo` scenario (or `--scenario`); when installed, a real Prometheus
scraping them (with a `node` label, loading the shipped rules) and a real Alertmanager
routing taint alerts; when the tainter's extra is installed, the tainter against the
simulated cluster, which Prometheus scrapes too. Every scrape job has the name the shipped
rules select, so no self-health alert fires while everything runs. It prints the story of
the scenario it runs (from its faults and pods:
with the built-in `demo`, a GPU heats past 78 °C and the node is tainted, and a training
job waits for its thermally throttled GPU while another GPU idles, then its checkpoint mount
hangs and CheckpointMountHung takes the node out), follows it as it
happens (firing alerts, node taints) and stops every process it started on Ctrl-C.

`--orchestrator=slurm` runs the Slurm story instead (`fleetwatch.sim.demo_slurm`, imported
only then): a real Slurm on this machine, a GPU that overheats and cools, the controller
draining and resuming the node through scontrol. What both demos share (settings, the session
that runs until Ctrl-C or `--duration`, the banner's server lines) is
`fleetwatch.sim.demo_session`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fleetwatch.flags import (
    REQUIRED,
    Flags,
    Subcommand,
    existing_dir,
    listen_address,
    setting,
    shown_address,
)
from fleetwatch.sim.demo_session import (
    DEFAULT_SCENARIO,
    NODE,
    DemoSettings,
    fail,
    firing_alerts,
    run_session,
    server_lines,
    tainter_available,
)
from fleetwatch.sim.fabric_faults import IbErrors, IbPortDown, IbRate, NvlinkDown, NvlinkErrors
from fleetwatch.sim.fault_base import Fault
from fleetwatch.sim.gpu_faults import (
    EccErrors,
    GpuLost,
    GpuOffBus,
    Hang,
    RowRemap,
    Temperature,
    TensorActive,
    Throttle,
    Xid,
)
from fleetwatch.sim.loopback_servers import (
    ALERTMANAGER,
    PROMETHEUS,
)
from fleetwatch.sim.mount_faults import MountFilling, MountHung, MountReadOnly, MountSlow
from fleetwatch.sim.scenario import Scenario, ScenarioError, load_scenario
from fleetwatch.sim.stack import KUBECONFIG, Plan, Stack, start_stack

log = logging.getLogger(__name__)

DEFAULT_PORTS: Final = {
    "exporter": 9842,
    "prometheus": 9090,
    "alertmanager": 9093,
    "tainter": 9843,
    "cluster": 18443,
}


def node_scenario(text: str) -> tuple[str, Scenario]:
    """`NODE=SCENARIO` (a built-in name or a file) for `simulate-cluster --kubelet.scenario`."""
    node, sep, spec = text.partition("=")
    if not sep or not node or not spec:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NODE=SCENARIO")
    try:
        return node, load_scenario(spec)
    except ScenarioError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


@dataclass(frozen=True, kw_only=True)
class SimulateClusterSettings:
    """The hidden `fleetwatch simulate-cluster` (the demo starts it): the simulated cluster's
    address, nodes and kubelets, and where it writes the kubeconfig that reaches it."""

    listen_address: tuple[str, int] = setting(
        listen_address("127.0.0.1:0"),
        parse=listen_address,
        shown=shown_address,
        metavar="HOST:PORT",
        flag="web.listen-address",
        help="address the simulated API serves on",
    )
    node: tuple[str, ...] = setting(
        (), repeatable=True, metavar="NODE", help="a node of the cluster (repeatable)"
    )
    node_scenario: tuple[tuple[str, Scenario], ...] = setting(
        (),
        parse=node_scenario,
        flag="kubelet.scenario",
        deprecated=("node-scenario",),
        repeatable=True,
        metavar="NODE=SCENARIO",
        help="a node whose scenario's pods the cluster shows: its kubelet's PodResources "
        "socket KUBELET_DIR/NODE.sock and kube_pod_labels at /metrics",
    )
    kubelet_dir: Path | None = setting(
        None,
        parse=existing_dir,
        metavar="KUBELET_DIR",
        flag="kubelet.socket-dir",
        deprecated=("kubelet-dir",),
        help="where the kubelets' sockets go (default: beside --out.kubeconfig)",
    )
    kubeconfig_out: Path = setting(
        REQUIRED,
        parse=Path,
        metavar="FILE",
        flag="out.kubeconfig",
        deprecated=("kubeconfig-out",),
        help="the kubeconfig written for the cluster",
    )


DEMO_FLAGS: Final = Flags(settings=DemoSettings)
SIMULATE_FLAGS: Final = Flags(settings=SimulateClusterSettings)


def subcommands() -> tuple[Subcommand, ...]:
    """`fleetwatch demo` and the hidden `fleetwatch simulate-cluster`."""
    return (
        Subcommand(
            name="demo",
            help="run the whole stack locally on simulated hardware",
            description="Exporter, Prometheus, Alertmanager and the tainter on a simulated node, "
            "which a simulated Kubernetes cluster taints or a real local Slurm drains.",
            flags=(DEMO_FLAGS,),
            run=run_demo,
        ),
        Subcommand(name="simulate-cluster", flags=(SIMULATE_FLAGS,), run=_run_simulate),
    )


def run_demo(args: argparse.Namespace) -> int:
    """Entry point of `fleetwatch demo`."""
    settings: DemoSettings = DEMO_FLAGS.read(args)
    if settings.orchestrator == "slurm":
        from fleetwatch.sim.demo_slurm import run_slurm_demo

        return run_slurm_demo(settings)
    spec = settings.scenario or DEFAULT_SCENARIO
    try:
        scenario = load_scenario(spec)
    except ScenarioError as exc:
        return fail(str(exc), code=2)

    def start(workdir: Path, servers: contextlib.ExitStack) -> Callable[[], dict[str, str]]:
        stack = start_stack(workdir, servers, demo_plan(spec))
        print_banner(stack.urls(), workdir, scenario)
        return lambda: observe(stack)

    return run_session(start, settings)


def demo_plan(scenario: str) -> Plan:
    """The shipped stack on `scenario`, with what this machine has installed."""
    return Plan(
        scenario=scenario,
        node=NODE,
        tainter_args=("--untaint.hold=30s",),
        with_prometheus=Path(PROMETHEUS).exists(),
        with_alertmanager=Path(ALERTMANAGER).exists(),
        with_tainter=tainter_available(),
        ports=DEFAULT_PORTS,
    )


def print_banner(urls: Mapping[str, str], workdir: Path, scenario: Scenario) -> None:
    """Where to look (`urls` of the servers that run, by name), and the story of the
    scenario being run."""
    lines = [
        "",
        f"fleetwatch demo: scenario {scenario.name}, a simulated node named {NODE} with "
        f"{scenario.gpus} x {scenario.gpu_model}",
    ]
    if scenario.description:
        lines.append(f"  ({scenario.description})")
    lines += server_lines(urls)
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
    for mount in scenario.mounts:
        lines.append(
            f"  Mount {mount.mountpoint} ({mount.fstype} from {mount.server}): a checkpoint save "
            f"every {mount.checkpoint_every_seconds:g}s for {mount.checkpoint_seconds:g}s"
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
                f"--kubeconfig={workdir / KUBECONFIG}"
            )
        lines.append(f"  t={fault.at:g}s".ljust(10) + text)
    return [*lines, ""]


def _busiest_throttled(scenario: Scenario) -> set[int]:
    """GPUs that throttle while a tensor-activity fault makes them the busiest of their pod:
    the straggler their training job waits for."""
    top = {
        f.gpu
        for f in scenario.faults
        if isinstance(f, TensorActive) and f.value > scenario.baseline.tensor_active
    }
    held = {g for pod in scenario.pods for g in pod.gpus}
    throttled = {f.gpu for f in scenario.faults if isinstance(f, Throttle)}
    return {gpu for gpu in held if gpu in top and gpu in throttled}


def _fault_story(fault: Fault, *, limit: float, busiest: set[int], waits: dict[str, str]) -> str:
    """One line of the story for one fault; `waits` holds the per-job alerts' `for`."""
    gpu = f"GPU {getattr(fault, 'gpu', None)}"
    lasting = f" for {fault.seconds:g}s" if fault.seconds else ""
    match fault:
        case Temperature() if fault.celsius > limit:
            # A ramp of minutes leaves GPUOverheatingSoon (trend over 10m, for 2m) time to warn.
            early = "GPUOverheatingSoon warns on the way, " if fault.ramp_seconds >= 180 else ""
            return (
                f"{gpu} heats to {fault.celsius:g} °C: {early}GPUOverheating fires above "
                f"{limit:g} °C and the node is tainted fleetwatch.io/gpu-overheat"
            )
        case Temperature():
            return (
                f"{gpu} cools to {fault.celsius:g} °C: the overheat taint goes after the "
                "tainter's hold time, once Prometheus shows the node cool"
            )
        case Throttle():
            text = f"{gpu} slows its clocks ({fault.reason}){lasting}"
            if fault.gpu in busiest:
                return (
                    f"{text} while it is its training job's busiest GPU: the GPU the job waits "
                    f"for, GPUStraggler (after {waits['GPUStraggler']})"
                )
            return text
        case TensorActive() if fault.gpu in busiest:
            return f"{gpu}'s tensor cores run at {fault.value:.0%}, the busiest of its job"
        case TensorActive():
            return (
                f"{gpu}'s tensor cores drop to {fault.value:.0%}{lasting}: GPUIdleInJob "
                f"(after {waits['GPUIdleInJob']}) when its job trains on"
            )
    return _other_fault_story(fault, gpu=gpu, lasting=lasting)


def _other_fault_story(fault: Fault, *, gpu: str, lasting: str) -> str:
    """The story line of a fault that neither heats, throttles nor idles a GPU."""
    match fault:
        case NvlinkErrors():
            return (
                f"NVLink {fault.link} of {gpu} counts {fault.per_second:g} {fault.error} "
                f"errors/s{lasting}: NVLinkErrorsRising"
            )
        case NvlinkDown():
            return f"NVLink {fault.link} of {gpu} goes down{lasting}: NVLinkDown"
        case IbPortDown():
            port = f"InfiniBand {fault.device}/{fault.port}"
            return f"{port} goes down{lasting}" + (": a flap" if lasting else "")
        case IbErrors():
            port = f"InfiniBand {fault.device}/{fault.port}"
            return f"{port} counts {fault.per_second:g} {fault.error} errors/s{lasting}"
        case IbRate():
            port = f"InfiniBand {fault.device}/{fault.port}"
            return f"{port} trains at {fault.value:g} Gb/s{lasting}: InfiniBandLinkDegraded"
        case Xid():
            return f"{gpu} reports Xid {fault.xid}"
        case GpuLost():
            return f"{gpu} falls off the bus: tainted fleetwatch.io/gpu-lost."
        case GpuOffBus():
            return f"{gpu} falls off the PCI bus: gone from NVML and from sysfs"
        case Hang():
            return (
                f"NVML call {fault.call} hangs for {fault.seconds:g}s: the collector reading "
                "it is reported down, nothing else is"
            )
        case EccErrors():
            return f"{gpu} counts {fault.per_second:g} {fault.error} ECC errors/s{lasting}"
        case RowRemap():
            return f"{gpu} has a {fault.error} row remap event"
    return _mount_fault_story(fault, gpu=gpu, lasting=lasting)


def _mount_fault_story(fault: Fault, *, gpu: str, lasting: str) -> str:
    """The story line of a fault of a checkpoint mount."""
    match fault:
        case MountHung():
            return (
                f"checkpoint mount hung on {NODE}: CheckpointMountHung → the tainter takes the "
                f"node out ({fault.mountpoint} blocks every call{lasting}; the taint lifts "
                "once it has answered for the hold time)"
            )
        case MountReadOnly():
            return (
                f"checkpoint mount {fault.mountpoint} turns read-only{lasting}: "
                "CheckpointMountReadOnly → the tainter takes the node out"
            )
        case MountSlow():
            return (
                f"checkpoint mount {fault.mountpoint} writes {fault.factor:g} times slower"
                f"{lasting}: this node is its job's CheckpointStraggler"
            )
        case MountFilling():
            return (
                f"checkpoint mount {fault.mountpoint} fills by "
                f"{fault.bytes_per_second / 1e6:g} MB/s{lasting}: CheckpointStorageFillingUp"
            )
    return f"{fault.kind} on {gpu}{lasting}"


def observe(stack: Stack) -> dict[str, str]:
    """The firing alerts and the node's taints, as one line each; what cannot be read now
    (a server still starting or busy) is left out until the next look."""
    seen = firing_alerts(stack.prometheus)
    with contextlib.suppress(OSError, ValueError, KeyError):
        taints = stack.taints()
        seen["node taints"] = (
            ", ".join(f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in taints) or "none"
        )
    return seen


def _run_simulate(args: argparse.Namespace) -> int:
    """`fleetwatch simulate-cluster`: the demo's stand-in Kubernetes API, in its own process."""
    import asyncio

    from aiohttp import web

    from fleetwatch.sim.kubeapi import FakeCluster, make_app, write_kubeconfig
    from fleetwatch.sim.kubelet import kube_pod_labels, kube_pod_series, serve_kubelet

    settings: SimulateClusterSettings = SIMULATE_FLAGS.read(args)
    nodes = [*settings.node, *(node for node, _ in settings.node_scenario)]
    if not nodes:
        print(
            "fleetwatch simulate-cluster: error: give --node or --kubelet.scenario",
            file=sys.stderr,
        )
        return 2
    # No token: a loopback-only simulation that people (and the demo) read with plain curl.
    cluster = FakeCluster(token=None)
    for name in nodes:
        cluster.add_node(name, labels={"nvidia.com/gpu.present": "true"})
    host, port = settings.listen_address
    pod_labels = kube_pod_labels(
        scenario for _, scenario in settings.node_scenario
    ) + kube_pod_series(settings.node_scenario, created=time.time())
    kubelet_dir: Path = settings.kubelet_dir or settings.kubeconfig_out.parent

    async def metrics(_request: web.Request) -> web.Response:
        """kube-state-metrics' kube_pod_labels, kube_pod_info and kube_pod_created for the
        scenarios' pods."""
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
        write_kubeconfig(settings.kubeconfig_out, server=server, token=None)
        log.warning(
            "SIMULATED Kubernetes cluster (not a real API server) serving nodes",
            extra={
                "server": server,
                "nodes": nodes,
                "kubeconfig": str(settings.kubeconfig_out),
                "see_taints": f"{server}/api/v1/nodes/{nodes[0]}",
            },
        )
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.ExitStack() as kubelets:
        for node, scenario in settings.node_scenario:
            kubelets.enter_context(serve_kubelet(scenario, kubelet_dir / f"{node}.sock", node=node))
        try:
            asyncio.run(serve())
        except KeyboardInterrupt:
            return 0
    return 0
