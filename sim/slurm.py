"""A real Slurm cluster on this one machine, for `fleetwatch demo --orchestrator=slurm` and the
tests: munged, slurmctld, one slurmd per node name.

Debian 12's `slurm-wlm` (`slurmctld`, `slurmd`, `slurm-client`) and `munge`, run as root with
no systemd: `slurm_cluster` writes a munge key and a slurm.conf/gres.conf into a temporary
folder, starts munged on its own socket, slurmctld, and `slurmd -D -N NAME` for each node
name (`NodeHostname=<this host> NodeAddr=127.0.0.1`, one free port each), waits until every
node answers in `scontrol show node`, and stops every process by PID on exit. GPUs are GRES
whose `File=` are character devices the harness creates (`mknod c 195 N`), so a job that asks
for `--gres=gpu:N` gets `SLURM_JOB_GPUS` in its prolog and `CUDA_VISIBLE_DEVICES` in its
steps as on a real GPU node. Prolog, Epilog and HealthCheckProgram are argv lists; the
harness writes each into an executable script with `PATH` and the given environment, because
Slurm runs them with almost none.

Client commands (`scontrol`, `srun`, `sbatch`, `sinfo`) find the cluster through
`SLURM_CONF`: `SlurmCluster.env` holds it, and `SlurmCluster.run` sets it.

slurmctld's StateSaveLocation is `state/` in the folder; with `state_disk_bytes` it is a tmpfs
of that size (mounted before slurmctld starts, unmounted after every daemon stopped), which a
test fills to see what slurmctld, and fleetwatch's state beside it, do on a full disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fleetwatch.sim.loopback_servers import free_port, process
from fleetwatch.sim.slurm_reboot import RebootStandIn, reboot_program
from fleetwatch.slurm.scontrol import Scontrol, parse_line

BINARIES = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "scontrol": "slurm-client",
    "srun": "slurm-client",
    "sbatch": "slurm-client",
    "sinfo": "slurm-client",
}
READY_TIMEOUT = 60.0  # seconds; about 1 s on a quiet machine
COMMAND_TIMEOUT = 30.0
NVIDIA_MAJOR = 195  # the character-device major of /dev/nvidiaN
SYSTEM_DIRECTORIES = "/usr/sbin:/sbin"  # Debian's daemons, absent from a plain user's PATH


def search_path() -> str:
    """Where the programs are looked for: PATH, then the system directories (a root shell
    entered with `su` keeps a user's PATH, which lacks them)."""
    return f"{os.environ.get('PATH', os.defpath)}{os.pathsep}{SYSTEM_DIRECTORIES}"


class MissingSlurm(FileNotFoundError):
    """What running the cluster needs and this machine lacks (a binary not on PATH, root);
    the message says what and how to get it."""


def missing_requirements() -> list[str]:
    """What this machine lacks to start the cluster, one sentence each saying how to get it:
    root, and every program of `BINARIES` absent from PATH with the Debian packages that hold
    them. Empty when nothing is missing."""
    problems = []
    if os.geteuid() != 0:
        problems.append("it runs as root (slurmd, and mknod for its GPU device files): run as root")
    missing = [program for program in BINARIES if shutil.which(program, path=search_path()) is None]
    if missing:
        packages = " ".join(dict.fromkeys(BINARIES[program] for program in missing))
        problems.append(
            f"{', '.join(missing)} not on PATH: apt-get install {packages} "
            "(Debian's Slurm and munge; ./dev.sh test installs them)"
        )
    return problems


def find_binaries() -> dict[str, Path]:
    """Each program of `BINARIES` on the search path by name, or MissingSlurm naming everything
    `missing_requirements` finds."""
    problems = missing_requirements()
    if problems:
        raise MissingSlurm("a local Slurm cannot start: " + "; ".join(problems))
    return {
        program: Path(shutil.which(program, path=search_path()) or program) for program in BINARIES
    }


@contextlib.contextmanager
def small_disk(where: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes mounted at `where` (made when missing), unmounted on exit;
    MissingSlurm naming why when it cannot be mounted (not root, or no mount here)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        raise MissingSlurm(f"cannot mount a {size}-byte tmpfs at {where}: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


class SlurmStartError(RuntimeError):
    """A daemon exited while the cluster started, or its nodes did not come up in time; the
    message holds the daemon's log tail or the nodes' last states."""


class SlurmCommandFailed(RuntimeError):
    """A client command of `SlurmCluster.run` exited non-zero; the message holds its output."""


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: its folder, slurm.conf, node names and their GPU device files."""

    workdir: Path
    conf: Path
    nodes: tuple[str, ...]
    gpu_devices: Mapping[str, tuple[Path, ...]]  # node -> its GPU device files, by index
    env: Mapping[str, str]  # the environment client commands need (SLURM_CONF, PATH)
    binaries: Mapping[str, Path]
    startup_seconds: float
    _pids: Mapping[str, int] = field(default_factory=dict)
    reboots: Sequence[str] = ()
    """The nodes the stand-in RebootProgram restarted, in order (`reboot=True`)."""

    def run(
        self, *argv: str, timeout: float = COMMAND_TIMEOUT, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """A client command (`scontrol`, `srun`, ...) against this cluster, its output as
        text; SlurmCommandFailed when `check` and it exits non-zero."""
        done = subprocess.run(
            list(argv),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise SlurmCommandFailed(
                f"{shlex.join(argv)} exited {done.returncode}: {done.stdout}{done.stderr}"
            )
        return done

    def node(self, name: str) -> dict[str, str]:
        """`scontrol show node -o NAME` as field -> value (State, Reason, Gres, ...)."""
        line = self.run("scontrol", "show", "node", "-o", name).stdout.strip()
        return parse_line(line)

    def state(self, name: str) -> str:
        """The node's `State` (`IDLE`, `IDLE+DRAIN`, `ALLOCATED`, ...)."""
        return self.node(name)["State"]

    def wait_for(
        self, name: str, predicate: str, *, timeout: float = READY_TIMEOUT
    ) -> dict[str, str]:
        """Poll the node until its State has every `+`-separated flag of `predicate` (e.g.
        `IDLE`, `DRAIN`, `IDLE+DRAIN`) and answers slurmctld's pings (a resumed node is
        `IDLE+NOT_RESPONDING` until the next one); its fields then, or TimeoutError."""
        wanted = set(predicate.split("+"))
        deadline = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            fields = self.node(name)
            state = set(fields.get("State", "").split("+"))
            if wanted <= state and not ({"NOT_RESPONDING"} - wanted) & state:
                return fields
            time.sleep(0.1)
        raise TimeoutError(f"node {name} not {predicate} after {timeout}s: {fields}")

    def scontrol(self, *, timeout: float = COMMAND_TIMEOUT) -> Scontrol:
        """fleetwatch's scontrol wrapper pointed at this cluster."""
        return Scontrol(timeout=timeout, env=dict(self.env))

    def drain(self, name: str, reason: str) -> None:
        """Drain the node as a person would (`scontrol update ... state=drain`)."""
        self.run("scontrol", "update", f"nodename={name}", "state=drain", f"reason={reason}")

    def resume(self, name: str) -> None:
        """Put the node back (`state=resume`) and wait until it is idle and responding."""
        self.run("scontrol", "update", f"nodename={name}", "state=resume")
        self.wait_for(name, "IDLE")

    def log(self, daemon: str) -> str:
        """A daemon's log: `slurmctld`, `munged` or a node name (its slurmd)."""
        return (self.workdir / "log" / f"{daemon}.log").read_text(errors="replace")

    def pid(self, daemon: str) -> int:
        """The PID of `munged`, `slurmctld` or a node's slurmd (by node name)."""
        return self._pids[daemon]


def _script(path: Path, argv: Sequence[str], environment: Mapping[str, str]) -> Path:
    """An executable shell script that runs `argv` with PATH and `environment` set (Slurm
    runs Prolog/Epilog/HealthCheckProgram with almost no environment)."""
    exports = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **environment}
    lines = ["#!/bin/sh"]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in exports.items()]
    lines.append(f'exec {shlex.join(argv)} "$@"')
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def _gpu_devices(folder: Path, nodes: Sequence[str], gpus: int) -> dict[str, tuple[Path, ...]]:
    """Character devices `folder/NODE/nvidiaN` (major 195, minor N), as the driver makes."""
    devices: dict[str, tuple[Path, ...]] = {}
    for node in nodes:
        (folder / node).mkdir(parents=True, exist_ok=True)
        paths = []
        for index in range(gpus):
            path = folder / node / f"nvidia{index}"
            if not path.exists():
                os.mknod(path, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, index))
            paths.append(path)
        devices[node] = tuple(paths)
    return devices


def _write_config(
    workdir: Path,
    *,
    nodes: Sequence[str],
    gpus: int,
    ports: Sequence[int],
    ctld_port: int,
    socket_path: Path,
    scripts: Mapping[str, Path],
    health_check_interval: int,
    extra_conf: Sequence[str],
    devices: Mapping[str, tuple[Path, ...]],
) -> Path:
    host = socket.gethostname()
    conf = workdir / "slurm.conf"
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    lines = [
        "ClusterName=fleetwatch-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={socket_path}",
        f"StateSaveLocation={workdir / 'state'}",
        f"SlurmdSpoolDir={workdir / 'spool'}/%n",
        f"SlurmctldPidFile={workdir / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={workdir / 'run'}/slurmd-%n.pid",
        f"SlurmctldLogFile={workdir / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={workdir / 'log'}/%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "ReturnToService=2",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=2",
        "MinJobAge=2",
        "GresTypes=gpu",
    ]
    if "prolog" in scripts:
        lines += [f"Prolog={scripts['prolog']}", "PrologFlags=Alloc"]
    if "epilog" in scripts:
        lines.append(f"Epilog={scripts['epilog']}")
    if "health_check" in scripts:
        lines += [
            f"HealthCheckProgram={scripts['health_check']}",
            f"HealthCheckInterval={health_check_interval}",
            "HealthCheckNodeState=ANY",
        ]
    lines += list(extra_conf)
    node_list = ",".join(nodes)
    port_list = ",".join(str(port) for port in ports)
    lines += [
        f"NodeName={node_list} NodeHostname={host} NodeAddr=127.0.0.1 Port={port_list} "
        f"CPUs=2 RealMemory=1000{gres} State=UNKNOWN",
        "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    conf.write_text("\n".join(lines) + "\n")
    gres_lines = [
        f"NodeName={node} Name=gpu File={path}" for node in nodes for path in devices.get(node, ())
    ]
    (workdir / "gres.conf").write_text("\n".join(gres_lines) + "\n")
    return conf


def _wait_ready(
    cluster: SlurmCluster, processes: Mapping[str, subprocess.Popen[bytes]], timeout: float
) -> None:
    """Poll until every node is up in slurmctld (State neither DOWN nor UNKNOWN nor
    NOT_RESPONDING), failing early with the log's tail when a daemon exits."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        for what, daemon in processes.items():
            if daemon.poll() is not None:
                tail = cluster.log(what)[-3000:] if what != "munged" else ""
                raise SlurmStartError(f"{what} exited with {daemon.returncode}:\n{tail}")
        done = cluster.run("scontrol", "show", "node", "-o", timeout=10, check=False)
        if done.returncode == 0:
            states = {
                fields.get("NodeName", "?"): fields.get("State", "")
                for fields in map(parse_line, done.stdout.splitlines())
            }
            last = repr(states)
            bad = {"DOWN", "UNKNOWN", "NOT_RESPONDING", "NO_RESPOND"}
            if set(states) == set(cluster.nodes) and not any(
                bad & {flag.rstrip("*") for flag in state.split("+")} or state.endswith("*")
                for state in states.values()
            ):
                return
        else:
            last = done.stderr.strip() or done.stdout.strip()
        time.sleep(0.1)
    raise SlurmStartError(f"Slurm nodes not up after {timeout}s (last: {last})")


@contextlib.contextmanager
def slurm_cluster(
    workdir: Path,
    *,
    nodes: Sequence[str] = ("gpu01", "gpu02"),
    gpus: int = 2,
    prolog: Sequence[str] | None = None,
    epilog: Sequence[str] | None = None,
    health_check: Sequence[str] | None = None,
    health_check_interval: int = 0,
    script_env: Mapping[str, str] | None = None,
    extra_conf: Sequence[str] = (),
    ready_timeout: float = READY_TIMEOUT,
    reboot: bool = False,
    state_disk_bytes: int | None = None,
) -> Iterator[SlurmCluster]:
    """munged, slurmctld and one slurmd per node name under `workdir`, every node up; each
    node has `gpus` GPUs (GRES on device files the harness creates). `prolog`, `epilog` and
    `health_check` are argv lists run with `script_env` (and PATH); with `prolog` set the
    prolog runs on every node of a job at allocation (`PrologFlags=Alloc`). A
    `health_check_interval` of 0 runs the health check only at slurmd start. Every daemon is
    stopped by PID on exit. With `reboot`, slurm.conf's RebootProgram stands in for a reboot
    (`fleetwatch.sim.slurm_reboot`: the node's slurmd restarted with `-b`). With
    `state_disk_bytes` the StateSaveLocation is a tmpfs of that size (`small_disk`).
    MissingSlurm when the packages are absent or this is not root (or that tmpfs cannot be
    mounted),
    SlurmStartError when a daemon fails to start."""
    binaries = find_binaries()
    started = time.monotonic()
    for sub in ("state", "spool", "run", "log", "munge", "scripts"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    (workdir / "munge").chmod(0o700)
    key = workdir / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket_path = workdir / "munge" / "munge.socket"
    # Slurm runs the scripts with almost no environment: scontrol in them finds this
    # cluster through SLURM_CONF (a real node's scontrol reads /etc/slurm/slurm.conf).
    environment = {"SLURM_CONF": str(workdir / "slurm.conf"), **(script_env or {})}
    scripts = {
        name: _script(workdir / "scripts" / name, argv, environment)
        for name, argv in (("prolog", prolog), ("epilog", epilog), ("health_check", health_check))
        if argv is not None
    }
    if reboot:
        program = reboot_program(workdir / "scripts", workdir / "reboots")
        extra_conf = [*extra_conf, f"RebootProgram={program}"]
    for node in nodes:
        (workdir / "spool" / node).mkdir(exist_ok=True)
    devices = _gpu_devices(workdir / "dev", nodes, gpus)
    ctld_port = free_port()
    ports = [free_port() for _ in nodes]
    while len({ctld_port, *ports}) != len(nodes) + 1:  # free_port may repeat
        ports = [free_port() for _ in nodes]
    conf = _write_config(
        workdir,
        nodes=nodes,
        gpus=gpus,
        ports=ports,
        ctld_port=ctld_port,
        socket_path=socket_path,
        scripts=scripts,
        health_check_interval=health_check_interval,
        extra_conf=extra_conf,
        devices=devices,
    )
    env = {"SLURM_CONF": str(conf), "PATH": search_path()}
    log = workdir / "log"
    with contextlib.ExitStack() as stack:
        if state_disk_bytes is not None:  # entered first: unmounted after the daemons stop
            stack.enter_context(small_disk(workdir / "state", state_disk_bytes))
        munged = stack.enter_context(
            process(
                [
                    str(binaries["munged"]),
                    "-F",
                    "--force",
                    f"--socket={socket_path}",
                    f"--key-file={key}",
                    f"--pid-file={workdir / 'run' / 'munged.pid'}",
                    f"--log-file={log / 'munged.log'}",
                    f"--seed-file={workdir / 'munge' / 'seed'}",
                ],
                log / "munged.out",
                env=env,
            )
        )
        deadline = time.monotonic() + ready_timeout
        while not socket_path.exists():
            if munged.poll() is not None or time.monotonic() > deadline:
                raise SlurmStartError(
                    f"munged did not start: {(log / 'munged.out').read_text(errors='replace')}"
                )
            time.sleep(0.05)
        processes: dict[str, subprocess.Popen[bytes]] = {"munged": munged}
        processes["slurmctld"] = stack.enter_context(
            process(
                [str(binaries["slurmctld"]), "-D", "-i", "-f", str(conf)],
                log / "slurmctld.out",
                env=env,
            )
        )
        slurmd = {
            node: [str(binaries["slurmd"]), "-D", "-N", node, "-f", str(conf)] for node in nodes
        }
        for node in nodes:
            processes[node] = stack.enter_context(
                process(slurmd[node], log / f"{node}.out", env=env)
            )
        reboots: Sequence[str] = ()
        if reboot:
            stand_in = stack.enter_context(
                RebootStandIn(
                    requests=workdir / "reboots",
                    daemons={node: processes[node] for node in nodes},
                    argv=slurmd,
                    log=log,
                    env=env,
                )
            )
            reboots = stand_in.reboots
        cluster = SlurmCluster(
            workdir=workdir,
            conf=conf,
            nodes=tuple(nodes),
            gpu_devices=devices,
            env=env,
            binaries=binaries,
            startup_seconds=0.0,
            _pids={name: daemon.pid for name, daemon in processes.items()},
            reboots=reboots,
        )
        _wait_ready(cluster, processes, ready_timeout)
        yield dataclasses.replace(cluster, startup_seconds=time.monotonic() - started)
