"""A RebootProgram that stands in for a node's reboot on the one-host test cluster.

slurm.conf's `RebootProgram` is what `scontrol reboot` runs on the node; slurmd runs it with
no arguments and without `SLURMD_NODENAME`. Here every node is a slurmd on one host, so the
program cannot reboot anything: it drops a request naming its parent (the slurmd that runs
it) into a folder, and a watcher thread of the harness stops that node's slurmd and starts
it again with `-b` ("report node rebooted when daemon restarted"), which is how Slurm's own
tests stand in for a reboot: slurmctld then sees the node back and, with
`nextstate=RESUME`, returns it to service. The restarted slurmd is stopped by PID with the
rest of the cluster.

Between the stop and the start the node is down as a rebooting node is: the new slurmd starts
only once slurmctld has marked the node NOT_RESPONDING (its ping every SlurmdTimeout/3 failed),
or after `DOWNTIME_DEADLINE` seconds (longer than its ping interval). An instant restart
raced slurmctld 22.05 under load: a ping of the stopped slurmd failed after the new one had
registered, so the node was marked not responding after it was back, and the next reboot's
own answer cleared that mark in a way that left the reboot never ended
(`IDLE+DRAIN+REBOOT_ISSUED`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from fleetwatch.sim.loopback_servers import process, stop

POLL_SECONDS = 0.1
DOWNTIME_DEADLINE = 15.0
"""The longest a stand-in reboot keeps its node down waiting for slurmctld to see it gone:
longer than slurmctld's ping interval (SlurmdTimeout=30 pings every 10 s), so a ping of the
stopped slurmd has failed before the new one starts even where slurmctld does not mark a
rebooting node NOT_RESPONDING."""
SETTLE_SECONDS = 1.5
"""How long after the request the node "boots": slurmctld takes a registration as the
reboot's only when the boot time it reports (`-b`: the restart) is later than the second in
which it issued the reboot, or the node stays `REBOOT_ISSUED`."""


def reboot_program(folder: Path, requests: Path) -> Path:
    """The RebootProgram script: it writes the PIDs of its parent and their parents (slurmd
    may run it through a child of its own, gone by the time the harness reads) to a new
    file in `requests`."""
    requests.mkdir(parents=True, exist_ok=True)
    script = folder / "reboot"
    script.write_text(
        "#!/bin/sh\n"
        "# Stands in for a reboot: the harness restarts the slurmd that runs this.\n"
        'p=$PPID; chain=""\n'
        'while [ "$p" -gt 1 ]; do chain="$chain $p"; '
        "p=$(cut -d' ' -f4 /proc/$p/stat) || break; done\n"
        f'echo $chain > "{requests}/.$$" && mv "{requests}/.$$" "{requests}/$$.request"\n'
    )
    script.chmod(0o755)
    return script


class RebootStandIn:
    """Watches `requests` and restarts the slurmd whose RebootProgram asked, with `-b`.

    `daemons` maps each node name to its running slurmd; `argv(node)` is the command that
    starts a node's slurmd. `reboots` lists the nodes restarted, in order."""

    def __init__(
        self,
        *,
        requests: Path,
        daemons: Mapping[str, subprocess.Popen[bytes]],
        argv: Mapping[str, Sequence[str]],
        log: Path,
        env: Mapping[str, str],
    ) -> None:
        self._requests = requests
        self._daemons = dict(daemons)
        self._argv = argv
        self._log = log
        self._env = env
        self._stack = contextlib.ExitStack()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="reboot-stand-in", daemon=True)
        self.reboots: list[str] = []
        self.pids: dict[str, int] = {node: daemon.pid for node, daemon in daemons.items()}

    def _node_of(self, chain: Sequence[int]) -> str | None:
        """The node whose slurmd is among the program's ancestors."""
        for ancestor in chain:
            for node, daemon in self._daemons.items():
                if daemon.pid == ancestor:
                    return node
        return None

    def _down(self, node: str) -> None:
        """Wait, with a deadline, until slurmctld marks `node` NOT_RESPONDING."""
        deadline = time.monotonic() + DOWNTIME_DEADLINE
        while time.monotonic() < deadline and not self._done.is_set():
            shown = subprocess.run(
                ["scontrol", "show", "node", "-o", node],
                env={**os.environ, **self._env},
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            state = next(
                (f.partition("=")[2] for f in shown.stdout.split() if f.startswith("State=")), ""
            )
            if "NOT_RESPONDING" in state.split("+"):
                return
            time.sleep(0.5)

    def _restart(self, node: str) -> None:
        stop(self._daemons[node])
        self._down(node)
        started = self._stack.enter_context(
            process([*self._argv[node], "-b"], self._log / f"{node}.out", env=self._env)
        )
        self._daemons[node] = started
        self.pids[node] = started.pid
        self.reboots.append(node)

    def _watch(self) -> None:
        while not self._done.wait(POLL_SECONDS):
            for request in sorted(self._requests.glob("*.request")):
                if time.time() - request.stat().st_mtime < SETTLE_SECONDS:
                    continue
                chain = [int(p) for p in request.read_text().split() if p.isdigit()]
                request.unlink()
                node = self._node_of(chain)
                if node is not None:
                    self._restart(node)

    def __enter__(self) -> RebootStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self._stack.close()
