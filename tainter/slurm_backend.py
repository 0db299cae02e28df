"""Slurm as the tainter's backend: drains instead of taints, a state file instead of annotations.

`fleetwatch taint --orchestrator=slurm` runs the same controller (policy, breaker, quarantine,
positive-evidence release, dry run, leader election) on `SlurmNodeApi`, which implements the
backend seam (`tainter.backend`) with `scontrol` and one JSON state file:

- A node's fleetwatch holds are its drain when the drain's reason starts with `fleetwatch:`:
  `fleetwatch:gpu-overheat GPUOverheating` holds `fleetwatch.io/gpu-overheat` for the alert
  GPUOverheating (several holds: `fleetwatch:a AlertA; b AlertB`). Taking a node out is
  `scontrol update nodename=N state=drain reason="fleetwatch:..."`, putting it back is
  `state=resume`, done only while the drain's reason is still fleetwatch's.
- A node drained, downed or failed by anyone else (a person, NHC, slurmctld) carries a hold
  that is not fleetwatch's (`slurm.schedmd.com/unavailable`, its state and reason as value):
  a write that would change such a node's holds raises `HeldByOthers` and runs no scontrol
  command, so its reason is never changed, not even rewritten with the same text.
- A node whose `Gres` names GPUs carries the label `nvidia.com/gpu.present=true`, as GPU
  feature discovery labels a Kubernetes GPU node, so `--breaker.node-selector` picks the GPU nodes
  whose share the breaker counts, on either orchestrator.
- Labels and annotations (the taint history and quarantine, the audit records, a person's
  untaint request) and the record leader election and the breaker live on (`LeaseApi`) are
  kept in `fleetwatch-tainter.json` in the state directory: by default `fleetwatch/` inside
  slurmctld's StateSaveLocation, which Slurm already requires every SlurmctldHost to share,
  so the history survives a restart and a move of the controller to the backup host. Every
  change is made under an exclusive `fcntl` lock on `fleetwatch-tainter.lock` and written
  atomically (a temporary file, fsync, rename), versioned per node and per lease, so two
  controllers' leases compare-and-swap exactly as a Kubernetes Lease does.
- Every scontrol call goes through `fleetwatch.slurm.scontrol` (a deadline, the process
  killed after it, failures counted by kind) in a thread; a failure is raised as an
  unreachable-API error (status 0, counted and retried by the controller), and after one
  `GuardedScontrol` answers `Unavailable` at once for a backoff that doubles with each
  failure in a row, so a slow or failing scontrol never holds a webhook longer than one
  deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from fleetwatch.slurm.scontrol import Node, Scontrol, ScontrolError, state_save_location
from fleetwatch.tainter.backend import RepairTicket, RepairView, Unavailable
from fleetwatch.tainter.kube_objects import (
    ApiError,
    Conflict,
    Lease,
    NodeView,
    Taint,
    lease_from_api,
)
from fleetwatch.tainter.payload import KEY_PREFIX
from fleetwatch.tainter.settings import SlurmAccess
from fleetwatch.tainter.writes import TAINTED_LABEL, LeftAlone

log = logging.getLogger(__name__)

REASON_PREFIX: Final = "fleetwatch:"
HOLD_SEPARATOR: Final = "; "
DRAIN_EFFECT: Final = "NoSchedule"
"""A drain lets the running jobs finish and starts no new one: Kubernetes' NoSchedule."""
GPU_PRESENT_LABEL: Final = "nvidia.com/gpu.present"
"""Set to `true` on a node whose GRES names GPUs, as GPU feature discovery labels a Kubernetes
GPU node: `--breaker.node-selector=nvidia.com/gpu.present=true` makes the breaker's share count GPU
nodes on either orchestrator."""
OTHERS_KEY: Final = "slurm.schedmd.com/unavailable"
"""The hold a node drained, downed or failed by anyone but fleetwatch carries."""
UNAVAILABLE_FLAGS: Final = frozenset(
    {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "MAINT", "INVALID_REG"}
    | {"REBOOT_REQUESTED", "REBOOT_ISSUED"}
)
REBOOT_FLAGS: Final = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
OWN_REBOOT_FLAGS: Final = REBOOT_FLAGS | {"DOWN", "NOT_RESPONDING", "POWERING_UP", "POWER_UP"}
"""What a node fleetwatch asked to reboot shows until it is back: Slurm downs it while the
RebootProgram runs."""
JOB_FLAGS: Final = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
"""A node whose state has one of these still runs (or cleans up after) a job."""
REASON_SUFFIX: Final = " : "
"""Slurm appends ` : reboot issued` to the reason of a node it reboots."""
STATE_FILE: Final = "fleetwatch-tainter.json"
LOCK_FILE: Final = "fleetwatch-tainter.lock"


class HeldByOthers(LeftAlone):
    """A write would change the holds of a node someone else took out: left alone, nothing
    run, so the other's reason stays exactly as it is (the webhook answers it with success:
    a retry would change nothing)."""

    def __init__(self, node: str, state: str, reason: str) -> None:
        super().__init__(
            why="held_by_others",
            reason=f"Slurm node {node} is {state} by someone else (reason {reason!r}); "
            "fleetwatch leaves it alone",
        )


# -- scontrol ------------------------------------------------------------------------------


class GuardedScontrol:
    """`fleetwatch.slurm.scontrol.Scontrol` (a deadline per call, its process killed after
    it, failures counted by kind) run off the event loop, with a backoff after failures.

    `command` is found on PATH unless it is a path; `conf` is passed as SLURM_CONF (None:
    the environment's, else Slurm's default)."""

    def __init__(
        self,
        *,
        command: str = "scontrol",
        conf: Path | None = None,
        timeout: float = 5.0,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scontrol = Scontrol(
            binary=command, timeout=timeout, env={"SLURM_CONF": str(conf)} if conf else {}
        )
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._clock = clock
        self._failures = 0  # in a row
        self._closed_until = 0.0

    async def run(self, *args: str) -> str:
        """scontrol's standard output. Raises `Unavailable` at once while backing off,
        ApiError 404 for a node Slurm does not know, status 0 for any other failure (no
        answer within the deadline, cannot run, an error exit, unreadable output)."""
        now = self._clock()
        if now < self._closed_until:
            raise Unavailable(
                f"scontrol failed {self._failures} time(s) in a row; backing off for "
                f"{self._closed_until - now:.1f}s more"
            )
        try:
            out = await asyncio.to_thread(self.scontrol.run, *args)
        except ScontrolError as exc:
            if exc.kind == "unknown_node":  # scontrol answered: the node is not Slurm's
                self._failures, self._closed_until = 0, 0.0
                raise ApiError(status=404, reason=str(exc)) from exc
            self._failures += 1
            pause = min(self._max_backoff, self._backoff * 2.0 ** (self._failures - 1))
            self._closed_until = self._clock() + pause
            log.warning(
                "scontrol failed; backing off",
                extra={
                    "kind": exc.kind,
                    "error": str(exc),
                    "in_a_row": self._failures,
                    "backoff_seconds": pause,
                },
            )
            raise ApiError(status=0, reason=str(exc)) from exc
        self._failures, self._closed_until = 0, 0.0
        return out

    async def nodes(self, name: str | None = None) -> list[Node]:
        """Every node, or the one named; ApiError as `run` says, status 0 for a line that
        cannot be read."""
        text = await self.run("show", "node", "-o", *([name] if name else []))
        try:
            return [Node.parse(line) for line in text.splitlines() if line.strip()]
        except ScontrolError as exc:
            raise ApiError(status=0, reason=str(exc)) from exc


def drained_by_us(node: Node) -> bool:
    """Drained with a reason fleetwatch wrote."""
    return node.drained and node.reason.startswith(REASON_PREFIX)


def _flags(node: Node) -> frozenset[str]:
    return frozenset(flag.strip("~#!%$@^-") for flag in node.flags)


def rebooting_for_us(node: Node) -> bool:
    """Drained by fleetwatch and rebooting: asked with `scontrol reboot` (its reason is
    fleetwatch's, with Slurm's ` : reboot issued` after it) and not back yet."""
    return drained_by_us(node) and bool(_flags(node) & REBOOT_FLAGS)


def answering(node: Node) -> bool:
    """slurmctld hears from the node's slurmd: no NOT_RESPONDING flag (`*` in short form).
    A reboot asked of a node that does not answer yet (its slurmd just restarted) can be
    lost: slurmctld 22.05 then never takes the next registration as the reboot's end."""
    return "NOT_RESPONDING" not in _flags(node) and "*" not in node.state


def booted_this_second(node: Node, *, now: float | None = None) -> bool:
    """The node's slurmd registered in this very second (`BootTime`, local time, as `now`).
    A reboot issued in that second is lost too: slurmctld 22.05 waits for a reboot only
    while the node's boot time is before the reboot's request time, in whole seconds, so it
    takes the reboot's own answer for the node's return and leaves it
    `IDLE+DRAIN+REBOOT_ISSUED` for good (tried on a real 22.05: every time)."""
    try:
        booted = datetime.fromisoformat(node.fields.get("BootTime", "")).timestamp()
    except ValueError:  # None, Unknown: no registration to wait out
        return False
    return int(time.time() if now is None else now) <= int(booted)


def held_by_others(node: Node) -> bool:
    """Drained, down or failed other than by fleetwatch's own drain alone (or the reboot
    fleetwatch asked of its own drain)."""
    unavailable = _flags(node) & UNAVAILABLE_FLAGS
    ours = {"DRAIN", "DRAINING", "DRAINED"} | (
        OWN_REBOOT_FLAGS if rebooting_for_us(node) else set()
    )
    return bool(unavailable - ours) or (node.drained and not drained_by_us(node))


def drain_reason(holds: Sequence[Taint]) -> str:
    """The drain reason for fleetwatch's holds: `fleetwatch:<reason> <alert>[; ...]`."""
    parts = [f"{t.key.removeprefix(KEY_PREFIX)} {t.value}".strip() for t in holds]
    return REASON_PREFIX + HOLD_SEPARATOR.join(sorted(parts))


def holds_of(reason: str) -> tuple[Taint, ...]:
    """fleetwatch's holds in a drain reason it wrote (`drain_reason`'s inverse)."""
    holds = []
    ours = reason.removeprefix(REASON_PREFIX).partition(REASON_SUFFIX)[0]
    for part in ours.split(HOLD_SEPARATOR):
        name, _, alert = part.strip().partition(" ")
        if name:
            holds.append(Taint(key=KEY_PREFIX + name, value=alert.strip(), effect=DRAIN_EFFECT))
    return tuple(holds)


# -- the state file ------------------------------------------------------------------------


class StateFile:
    """`fleetwatch-tainter.json` in the state directory, read and changed under a `fcntl`
    lock and replaced atomically. Blocking: call it through `asyncio.to_thread`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE

    @contextlib.contextmanager
    def _locked(self, kind: int) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / LOCK_FILE, "a+b") as lock:
            fcntl.flock(lock, kind)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"nodes": {}, "leases": {}}
        except ValueError as exc:
            raise ApiError(status=500, reason=f"{self.path} is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ApiError(status=500, reason=f"{self.path}: expected a JSON object")
        return {"nodes": data.get("nodes") or {}, "leases": data.get("leases") or {}}

    def read(self) -> dict[str, Any]:
        """The whole state (`nodes` and `leases`)."""
        with self._locked(fcntl.LOCK_SH):
            return self._load()

    def update(self, change: Callable[[dict[str, Any]], Any]) -> Any:
        """Apply `change` to the state under the exclusive lock and write it atomically;
        returns what `change` returned. An exception from `change` writes nothing."""
        with self._locked(fcntl.LOCK_EX):
            data = self._load()
            result = change(data)
            temporary = self.path.with_suffix(".tmp")
            try:
                with open(temporary, "w") as out:
                    json.dump(data, out, sort_keys=True, indent=1)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temporary, self.path)
                directory = os.open(self.directory, os.O_RDONLY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
            except OSError as exc:
                # A full disk, a read-only remount: the old file stands, whole; a retry
                # (Alertmanager's, the reconcile loop's) writes it once there is room.
                temporary.unlink(missing_ok=True)
                raise ApiError(
                    status=0, reason=f"cannot write {self.path}: {exc.strerror or exc}"
                ) from exc
            return result


# -- the backend ---------------------------------------------------------------------------


def _selects(labels: Mapping[str, str], selector: str) -> bool:
    """Equality selectors (`k=v,k2=v2`; empty: every node) on a node's labels."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, sep, value = term.partition("=")
        if not sep or key.endswith("!"):
            raise ApiError(
                status=400,
                reason=f"unsupported node selector {selector!r}: on Slurm only key=value terms",
            )
        if labels.get(key.strip()) != value.strip().lstrip("="):
            return False
    return True


def _merged(current: Mapping[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in {**current, **changes}.items() if v is not None}


class SlurmNodeApi:
    """`NodeApi` and `LeaseApi` over scontrol and the state file (the module says how)."""

    def __init__(self, *, scontrol: GuardedScontrol, state: StateFile) -> None:
        self._scontrol = scontrol
        self._state = state

    @property
    def where(self) -> Path:
        """The state file, for messages."""
        return self._state.path

    # -- nodes --------------------------------------------------------------------------

    def _view(self, node: Node, record: Mapping[str, Any]) -> NodeView:
        taints = list(holds_of(node.reason)) if drained_by_us(node) else []
        if held_by_others(node):
            taints.append(
                Taint(
                    key=OTHERS_KEY, value=f"{node.state} {node.reason}".strip(), effect=DRAIN_EFFECT
                )
            )
        labels = dict(record.get("labels") or {})
        labels.pop(TAINTED_LABEL, None)
        labels.pop(GPU_PRESENT_LABEL, None)
        if drained_by_us(node):
            labels[TAINTED_LABEL] = "true"
        if node.has_gpus:
            labels[GPU_PRESENT_LABEL] = "true"
        annotations = dict(record.get("annotations") or {})
        version = hashlib.sha256(
            json.dumps([node.state, node.reason, record.get("version", 0)]).encode()
        ).hexdigest()[:16]
        return NodeView(
            name=node.name,
            uid=node.name,
            resource_version=version,
            taints=tuple(taints),
            labels=labels,
            annotations=annotations,
        )

    async def _nodes(self, name: str | None) -> list[tuple[Node, NodeView]]:
        nodes = await self._scontrol.nodes(name)
        records = (await asyncio.to_thread(self._state.read))["nodes"]
        return [(n, self._view(n, records.get(n.name) or {})) for n in nodes]

    async def get_node(self, name: str) -> NodeView:
        for node, view in await self._nodes(name):
            if node.name == name:
                return view
        raise ApiError(status=404, reason=f"Slurm has no node {name!r}")

    async def list_nodes(self, *, label_selector: str = "") -> list[NodeView]:
        return [
            view for _, view in await self._nodes(None) if _selects(view.labels, label_selector)
        ]

    async def patch_node(
        self,
        name: str,
        *,
        resource_version: str,
        taints: Sequence[Taint] | None,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> NodeView:
        """Drain or resume (only when fleetwatch's holds change, and only a node no one
        else holds), then store labels and annotations; Conflict when the node changed
        since `resource_version` was read."""
        found = [(n, v) for n, v in await self._nodes(name) if n.name == name]
        if not found:
            raise ApiError(status=404, reason=f"Slurm has no node {name!r}")
        node, view = found[0]
        if view.resource_version != resource_version:
            raise Conflict(status=409, reason=f"{name} changed since it was read")
        if taints is not None:
            wanted = sorted((t.key, t.value) for t in taints if t.key.startswith(KEY_PREFIX))
            held = sorted((t.key, t.value) for t in view.taints if t.key.startswith(KEY_PREFIX))
            if wanted != held:
                if held_by_others(node):
                    raise HeldByOthers(name, node.state, node.reason)
                ours = [t for t in taints if t.key.startswith(KEY_PREFIX)]
                if ours:
                    reason = drain_reason(ours)
                    await self._scontrol.run(
                        "update", f"nodename={name}", "state=drain", f"reason={reason}"
                    )
                else:
                    await self._scontrol.run("update", f"nodename={name}", "state=resume")
        changes = {k: v for k, v in labels.items() if k not in (TAINTED_LABEL, GPU_PRESENT_LABEL)}
        if changes or annotations:

            def store(data: dict[str, Any]) -> None:
                record = data["nodes"].get(name) or {}
                new = {
                    "labels": _merged(record.get("labels") or {}, changes),
                    "annotations": _merged(record.get("annotations") or {}, annotations),
                    "version": int(record.get("version", 0)) + 1,
                }
                if new["labels"] or new["annotations"]:
                    data["nodes"][name] = new
                else:
                    data["nodes"].pop(name, None)

            await asyncio.to_thread(self._state.update, store)
        return await self.get_node(name)

    # -- repairs ------------------------------------------------------------------------

    @property
    def can_repair(self) -> bool:
        """Slurm reboots through `scontrol reboot` and the site's RebootProgram."""
        return True

    async def repair_view(
        self, name: str, *, repair: str, ticket: RepairTicket | None
    ) -> RepairView:
        """Jobs on the node (allocated, mixed or completing), whether the reboot fleetwatch
        asked for is still under way (Slurm's reboot flags, or down with fleetwatch's
        reason), and whether slurmctld hears from the node: for a reboot about to be asked
        (no ticket), not in the second its slurmd registered (`booted_this_second`)."""
        found = [n for n in await self._scontrol.nodes(name) if n.name == name]
        if not found:
            raise ApiError(status=404, reason=f"Slurm has no node {name!r}")
        node = found[0]
        return RepairView(
            jobs_running=bool(_flags(node) & JOB_FLAGS),
            repairing=rebooting_for_us(node),
            answering=answering(node) and (ticket is not None or not booted_this_second(node)),
            others_hold=f"{node.state}: {node.reason}" if held_by_others(node) else "",
        )

    async def start_repair(
        self, node: NodeView, *, repair: str, reason: str, alert: str
    ) -> RepairTicket:
        """`scontrol reboot ASAP nextstate=RESUME reason="fleetwatch:<reason> <alert>" N`:
        the RebootProgram reboots the node and slurmctld resumes it when slurmd registers
        again. Only a node fleetwatch alone drained; a reboot is the only repair Slurm
        carries out (a GPU reset comes as one, `--repair.reset-by-reboot`)."""
        if repair != "reboot":
            raise ApiError(status=501, reason=f"Slurm carries out no {repair} but as a reboot")
        found = [n for n in await self._scontrol.nodes(node.name) if n.name == node.name]
        if not found:
            raise ApiError(status=404, reason=f"Slurm has no node {node.name!r}")
        current = found[0]
        if held_by_others(current) or not drained_by_us(current):
            raise HeldByOthers(node.name, current.state, current.reason)
        text = current.reason.partition(REASON_SUFFIX)[0]
        await self._scontrol.run("reboot", "ASAP", "nextstate=RESUME", f"reason={text}", node.name)
        log.warning(
            "reboot asked of Slurm",
            extra={"node": node.name, "reason": reason, "alert": alert, "drain_reason": text},
        )
        return RepairTicket(how="scontrol reboot ASAP nextstate=RESUME")

    async def create_event(
        self, *, node: NodeView, reason: str, message: str, warning: bool
    ) -> None:
        """Slurm has no Events: the tainter's log carries them."""
        log.log(
            logging.WARNING if warning else logging.INFO,
            "event",
            extra={"node": node.name, "event": reason, "detail": message},
        )

    # -- leases -------------------------------------------------------------------------

    async def get_lease(self, *, namespace: str, name: str) -> Lease:
        data = (await asyncio.to_thread(self._state.read))["leases"].get(f"{namespace}/{name}")
        if data is None:
            raise ApiError(status=404, reason=f"no lease {namespace}/{name} in {self.where}")
        return lease_from_api(data)

    async def _write_lease(
        self, namespace: str, lease: Lease, *, create: bool, annotations_only: bool = False
    ) -> Lease:
        key = f"{namespace}/{lease.name}"

        def write(data: dict[str, Any]) -> dict[str, Any]:
            current = data["leases"].get(key)
            if create and current is not None:
                raise Conflict(status=409, reason=f"lease {key} exists")
            if not create:
                if current is None:
                    raise ApiError(status=404, reason=f"no lease {key} in {self.where}")
                if current["metadata"].get("resourceVersion") != lease.resource_version:
                    raise Conflict(status=409, reason=f"lease {key} changed since it was read")
            version = int((current or {}).get("metadata", {}).get("resourceVersion") or 0) + 1
            body = lease.to_api(namespace=namespace)
            if annotations_only and current is not None:
                body = {**current, "metadata": {**current["metadata"]}}
                body["metadata"]["annotations"] = {
                    **(current["metadata"].get("annotations") or {}),
                    **lease.annotations,
                }
            body["metadata"]["resourceVersion"] = str(version)
            data["leases"][key] = body
            return body

        return lease_from_api(await asyncio.to_thread(self._state.update, write))

    async def create_lease(self, *, namespace: str, lease: Lease) -> Lease:
        return await self._write_lease(namespace, lease, create=True)

    async def replace_lease(self, *, namespace: str, lease: Lease) -> Lease:
        return await self._write_lease(namespace, lease, create=False)

    async def patch_lease_annotations(
        self, *, namespace: str, name: str, resource_version: str, annotations: Mapping[str, str]
    ) -> Lease:
        patch = Lease(
            name=name,
            resource_version=resource_version,
            holder="",
            duration_seconds=0,
            acquire_time=None,
            renew_time=None,
            transitions=0,
            annotations=annotations,
        )
        return await self._write_lease(namespace, patch, create=False, annotations_only=True)


async def state_directory(scontrol: GuardedScontrol) -> Path:
    """`fleetwatch/` inside slurmctld's StateSaveLocation (`scontrol show config`), which
    every SlurmctldHost shares; ApiError when scontrol does not say."""
    text = await scontrol.run("show", "config")
    try:
        return Path(state_save_location(text)) / "fleetwatch"
    except ScontrolError as exc:
        raise ApiError(status=0, reason=str(exc)) from exc


async def connect_slurm(access: SlurmAccess) -> SlurmNodeApi:
    """The Slurm backend for `access`: scontrol from PATH (or `--slurm.scontrol`), the state
    directory from `--slurm.state-dir` or slurmctld's StateSaveLocation. Raises ApiError
    when scontrol cannot say where that is."""
    scontrol = GuardedScontrol(command=access.scontrol, conf=access.conf, timeout=access.timeout)
    directory = access.state_dir
    if directory is None:
        try:
            directory = await state_directory(scontrol)
        except ApiError as exc:
            raise ApiError(
                status=exc.status,
                reason=f"cannot find slurmctld's StateSaveLocation ({exc}); pass --slurm.state-dir",
            ) from exc
    log.info("Slurm backend", extra={"scontrol": access.scontrol, "state_dir": str(directory)})
    return SlurmNodeApi(scontrol=scontrol, state=StateFile(directory))
