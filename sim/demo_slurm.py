"""`fleetwatch demo --orchestrator=slurm`: the overheat story on a real Slurm on this machine.

Starts Debian's Slurm as root (`fleetwatch.sim.slurm`: munged, slurmctld and one slurmd for
each of the nodes gpu01 and gpu02, two GPUs each as GRES) and the alerting path of the
end-to-end tests (`fleetwatch.sim.overheat`, with its shortened timings): the simulated
exporter of gpu01, whose GPU 3 heats past the shipped GPUOverheating threshold and cools
again, a real Prometheus with the shipped rules, a real Alertmanager with the shipped route,
and `fleetwatch taint --orchestrator=slurm` on this Slurm. An admin drains gpu02 first. It
prints the story, then follows it: the firing alerts, each node's state and drain reason,
whether `srun -w gpu01` runs whenever gpu01 is drained or put back, and, once gpu01 is drained,
an overheat alert for gpu02 posted to Alertmanager, which the controller must leave alone
because gpu02's drain is the admin's. Without root, Slurm, munge, Prometheus, Alertmanager
or the tainter's extra it says what is missing and how to get it, and starts nothing.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Final

from fleetwatch.rules.config import load_config, parameters
from fleetwatch.sim.demo_session import (
    INSTALL_HINT,
    DemoSettings,
    fail,
    firing_alerts,
    run_session,
    server_lines,
    tainter_available,
)
from fleetwatch.sim.loopback_servers import ALERTMANAGER, PROMETHEUS, post_alert
from fleetwatch.sim.overheat import (
    ALERT,
    COOL_AT,
    COOL_CELSIUS,
    FAST_HOLD_DOWN,
    FAST_KEEP_FIRING,
    HEAT_AT,
    HOLD_DOWN_PARAMETER,
    HOT_CELSIUS,
    HOT_GPU,
    OVERHEAT_CELSIUS,
    overheat_alert,
    start_overheat_stack,
)
from fleetwatch.sim.slurm import (
    MissingSlurm,
    SlurmCluster,
    SlurmCommandFailed,
    SlurmStartError,
    missing_requirements,
    slurm_cluster,
)
from fleetwatch.sim.stack import Stack

HOT: Final = "gpu01"  # the node whose GPU overheats
SPARE: Final = "gpu02"  # the node an admin drains
ADMIN_REASON: Final = "admin: fan check"
HOLD: Final = "3s"  # the controller's --untaint.hold
SRUN_WAIT: Final = 5  # seconds srun waits for its allocation (--immediate)


def missing() -> list[str]:
    """What this machine lacks for the Slurm demo, one sentence each saying how to get it."""
    problems = missing_requirements()
    problems += [
        f"{binary} is missing: {INSTALL_HINT}"
        for binary in (PROMETHEUS, ALERTMANAGER)
        if not Path(binary).exists()
    ]
    if not tainter_available():
        problems.append(
            "the controller's extra is not installed: pip install 'fleetwatch[tainter]'"
        )
    return problems


def run_slurm_demo(settings: DemoSettings) -> int:
    """`fleetwatch demo --orchestrator=slurm`: exit status 2 for a flag it cannot take, 1
    (and every missing piece named) when this machine cannot run it."""
    if settings.scenario is not None:
        return fail(
            "--scenario is for --orchestrator=kubernetes: the Slurm demo tells its own story",
            code=2,
        )
    problems = missing()
    if problems:
        return fail(
            "the Slurm demo needs what this machine lacks:\n"
            + "\n".join(f"  - {problem}" for problem in problems),
            code=1,
        )
    return run_session(start, settings, errors=(MissingSlurm, SlurmStartError, SlurmCommandFailed))


def start(workdir: Path, servers: contextlib.ExitStack) -> Callable[[], dict[str, str]]:
    """Slurm, the admin's drain on gpu02, then the alerting path with its controller on this
    Slurm; the banner printed. Returns what to watch."""
    print("starting Slurm (munged, slurmctld, slurmd for gpu01 and gpu02) ...", flush=True)
    cluster = servers.enter_context(slurm_cluster(workdir / "slurm", nodes=(HOT, SPARE)))
    cluster.drain(SPARE, ADMIN_REASON)
    print("starting the exporter, Prometheus, Alertmanager and the controller ...", flush=True)
    stack = start_overheat_stack(
        workdir / "stack",
        servers,
        interval="1s",
        hold=HOLD,
        node=HOT,
        tainter_args=("--orchestrator=slurm", f"--slurm.conf={cluster.conf}"),
    )
    watched = SlurmStory(cluster, stack)
    lines = [
        "",
        f"fleetwatch demo: a real Slurm on this machine, nodes {HOT} and {SPARE} (2 GPUs each), "
        f"and a simulated GPU node exporting as {HOT}",
        *server_lines({k: v for k, v in stack.urls().items() if k != "cluster"}),
        f"  slurm         SLURM_CONF={cluster.conf} sinfo -R",
        "",
        *story(keep_firing=FAST_KEEP_FIRING, hold_down=FAST_HOLD_DOWN),
        f"Logs: {workdir}. Press Ctrl-C to stop.",
        "",
    ]
    print("\n".join(lines), flush=True)
    return watched.observe


def story(*, keep_firing: str, hold_down: str) -> list[str]:
    """What happens, in time order, with the timings the demo shortens."""
    # The controller's modules: `missing()` has checked that its extra is installed.
    from fleetwatch.tainter.payload import TAINT_LABEL
    from fleetwatch.tainter.slurm_backend import REASON_PREFIX

    config = load_config()
    shipped_hold_down = parameters(config)[HOLD_DOWN_PARAMETER]
    reason = f"{REASON_PREFIX}{overheat_alert(HOT)[TAINT_LABEL]} {ALERT}"
    return [
        f"What happens (times from the exporter's start; shortened for the demo: {ALERT} keeps "
        f"firing {keep_firing}, not {config.alerts[ALERT].keep_firing_for}, and {HOT} must read "
        f"cool for {hold_down}, not {shipped_hold_down}, then {HOLD} in the controller):",
        f"  now     an admin drains {SPARE} ({ADMIN_REASON!r}): fleetwatch never touches a drain "
        "it did not make",
        f"  t={HEAT_AT}s".ljust(10)
        + f"GPU {HOT_GPU} of {HOT} heats to {HOT_CELSIUS:g} °C: {ALERT} fires above "
        f"{OVERHEAT_CELSIUS:g} °C, Alertmanager sends it to the controller, which drains {HOT} "
        f"with reason {reason!r}; srun -w {HOT} is refused",
        " " * 10 + f"then the demo posts {ALERT} for {SPARE} to Alertmanager: its drain is the "
        "admin's, so it stays exactly as it is",
        f"  t={COOL_AT}s".ljust(10)
        + f"GPU {HOT_GPU} cools to {COOL_CELSIUS} °C: once Prometheus shows {HOT} cool, the "
        f"controller resumes it and srun -w {HOT} runs",
        "",
    ]


class SlurmStory:
    """What the demo watches on Slurm, and the two things it does as the story unfolds: try
    `srun -w gpu01` whenever gpu01 is drained or put back, and post an overheat alert for
    gpu02 once gpu01 is drained."""

    def __init__(self, cluster: SlurmCluster, stack: Stack) -> None:
        if stack.alertmanager is None:  # the overheat stack always runs it
            raise SlurmStartError("Alertmanager did not start")
        self._cluster = cluster
        self._prometheus = stack.prometheus
        self._alertmanager_url = stack.alertmanager.url
        self._admins = cluster.node(SPARE).get("Reason", "")
        self._hot_drained: bool | None = None
        self._srun = ""
        self._posted = False
        self._resumed = False

    def observe(self) -> dict[str, str]:
        """The firing alerts, each node's state and reason, srun's last answer on gpu01 and,
        once gpu01 is back, whether the admin's drain on gpu02 is as the admin wrote it;
        what cannot be read now is left out until the next look."""
        seen = firing_alerts(self._prometheus)
        nodes: dict[str, tuple[str, str]] = {}  # name -> (State, Reason)
        for name in (HOT, SPARE):
            with contextlib.suppress(SlurmCommandFailed, subprocess.TimeoutExpired, KeyError):
                fields = self._cluster.node(name)
                nodes[name] = (fields["State"], fields.get("Reason", ""))
        for name, (state, reason) in nodes.items():
            seen[name] = state + (f", reason {reason!r}" if reason else "")
        if HOT in nodes:
            self._follow_hot("DRAIN" in nodes[HOT][0].split("+"))
        if self._srun:
            seen[f"srun -w {HOT} true"] = self._srun
        if self._posted:
            seen[f"{ALERT} for {SPARE}"] = "posted to Alertmanager; its drain is the admin's"
        if self._resumed and SPARE in nodes:
            now = nodes[SPARE][1]
            seen[f"the admin's drain on {SPARE}"] = (
                "untouched, its reason as the admin wrote it"
                if now == self._admins
                else f"CHANGED from {self._admins!r} to {now!r}"
            )
        return seen

    def _follow_hot(self, drained: bool) -> None:
        """On each change of gpu01's drain, try srun on it; while it is drained, post the
        overheat alert for gpu02 until Alertmanager has taken it once."""
        if drained != self._hot_drained:
            self._hot_drained = drained
            self._srun = self._try_srun()
            self._resumed = self._resumed or (not drained and self._posted)
        if drained and not self._posted:
            with contextlib.suppress(OSError):  # Alertmanager busy: the next look posts it
                post_alert(self._alertmanager_url, overheat_alert(SPARE))
                self._posted = True

    def _try_srun(self) -> str:
        """`srun -w gpu01 true`, waiting at most SRUN_WAIT seconds for the node: `ran` or
        `refused` with Slurm's own last words."""
        try:
            done = self._cluster.run(
                "srun", "-w", HOT, f"--immediate={SRUN_WAIT}", "true", check=False, timeout=60
            )
        except subprocess.TimeoutExpired:
            return "no answer in 60s"
        if done.returncode == 0:
            return "ran"
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return f"refused ({said[-1] if said else f'exit {done.returncode}'})"
