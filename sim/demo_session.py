"""What both demos share: their settings, a session that runs until Ctrl-C or `--duration`,
and the lines they print.

`fleetwatch demo` (`fleetwatch.sim.demo`, a simulated Kubernetes cluster) and its Slurm story
(`fleetwatch.sim.demo_slurm`, a real Slurm on this machine) each start their servers inside
`run_session`: a temporary folder, the servers on one ExitStack, what changes printed until
Ctrl-C or `--duration`, every process stopped by PID. Both import this module and neither
imports the other at module level.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fleetwatch.catalog.gpu import GPU_TEMPERATURE_CELSIUS
from fleetwatch.flags import bounded_duration, setting
from fleetwatch.sim.loopback_servers import MissingBinary, Server, ServerError, prom_alerts
from fleetwatch.tainter.settings import ORCHESTRATORS

NODE: Final = "demo-node"
DEFAULT_SCENARIO: Final = "demo"
INSTALL_HINT: Final = (
    "sudo apt-get install -y --no-install-recommends prometheus prometheus-alertmanager"
)
demo_duration = bounded_duration(1.0, 366 * 86400.0)
"""`--duration`: from a second (the stack must start) to the longest duration flag's bound."""


@dataclass(frozen=True, kw_only=True)
class DemoSettings:
    """`fleetwatch demo`: which orchestrator, which scenario, for how long."""

    orchestrator: str = setting(
        "kubernetes",
        choices=ORCHESTRATORS,
        help="a simulated Kubernetes cluster whose node is tainted, or a real local Slurm "
        "whose node is drained (as root, with Debian's slurm-wlm and munge)",
    )
    scenario: str | None = setting(
        None,
        metavar="SCENARIO",
        help=f"built-in scenario name or file (default: {DEFAULT_SCENARIO}); Kubernetes only, "
        "the Slurm demo tells its own story",
    )
    duration: float | None = setting(
        None,
        parse=demo_duration,
        metavar="DURATION",
        help="stop after this long, e.g. 90s or 10m (default: run until Ctrl-C)",
    )


def fail(message: str, *, code: int) -> int:
    """Say what went wrong, as the flag parser does, and return the exit status `code`."""
    print(f"fleetwatch demo: error: {message}", file=sys.stderr)
    return code


Start = Callable[[Path, contextlib.ExitStack], Callable[[], dict[str, str]]]
"""A demo's start: its servers onto the ExitStack (their files in the folder), its banner
printed; it returns what to watch (`observe`: one line per thing, by name)."""


def run_session(
    start: Start, settings: DemoSettings, *, errors: tuple[type[Exception], ...] = ()
) -> int:
    """Run a demo: `start` in a temporary folder, then print what changes until Ctrl-C (or
    SIGTERM) or `settings.duration`; stop every process, remove the folder. A server that
    does not start (or one of `errors`, the demo's own start failures) is one error line and
    exit status 1."""
    stopping = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    failures: tuple[type[Exception], ...] = (ServerError, MissingBinary, TimeoutError, *errors)
    workdir = Path(tempfile.mkdtemp(prefix="fleetwatch-demo-"))
    try:
        with contextlib.ExitStack() as servers:
            try:
                watch = start(workdir, servers)
                duration = settings.duration  # counted from when everything runs
                deadline = None if duration is None else time.monotonic() + duration
                follow(watch, deadline=deadline, stopping=lambda: stopping)
            finally:
                print("\nstopping every process the demo started ...", flush=True)
    except failures as exc:
        return fail(str(exc), code=1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def tainter_available() -> bool:
    """Whether the tainter's extra is installed (the base install has no Kubernetes client)."""
    return importlib.util.find_spec("kubernetes_asyncio") is not None


def server_lines(urls: Mapping[str, str]) -> list[str]:
    """The banner's lines of where to look: each server of `urls` that runs, by name."""
    lines = [f"  exporter      {urls['exporter']}/            (landing page, /metrics)"]
    if "prometheus" in urls:
        query = f"{GPU_TEMPERATURE_CELSIUS}%7Bsensor%3D%22gpu%22%7D"
        lines += [
            f"  prometheus    {urls['prometheus']}/graph?g0.expr={query}",
            f"                {urls['prometheus']}/alerts",
        ]
    else:
        lines += [
            "  prometheus    not installed: no alerts and no taints. For the whole stack run",
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
    return lines


def follow(
    watch: Callable[[], dict[str, str]], *, deadline: float | None, stopping: Callable[[], bool]
) -> None:
    """Print each line of `watch` when it changes, about once a second, with the time since
    the start."""
    start = time.monotonic()
    last: dict[str, str] = {}
    while not stopping() and (deadline is None or time.monotonic() < deadline):
        for key, value in watch().items():
            if last.get(key) != value:
                print(f"[t={time.monotonic() - start:5.0f}s] {key}: {value}", flush=True)
                last[key] = value
        for _ in range(10):
            if stopping():
                return
            time.sleep(0.1)


def firing_alerts(prometheus: Server | None) -> dict[str, str]:
    """`firing alerts`: the names of the alerts `prometheus` fires now, or nothing when it
    does not run or cannot be read now."""
    seen: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError, KeyError):
        if prometheus is not None:
            alerts = prom_alerts(prometheus)
            firing = sorted({a["labels"]["alertname"] for a in alerts if a["state"] == "firing"})
            seen["firing alerts"] = ", ".join(firing) or "none"
    return seen
