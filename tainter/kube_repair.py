"""Repairs on Kubernetes: what `tainter.repair` asks of the Kubernetes backend.

fleetwatch reboots nothing itself. A **reboot** is the node-repair controllers' (medik8s
NodeHealthCheck, Cluster API MachineHealthCheck), which act on the `GPUHealthy=False`
condition that names the repair (`tainter.condition`): starting one records the node's
`status.nodeInfo.bootID`, and the node is back when the kubelet reports another one and the
node is Ready. It starts at once, pods or not: the controller chooses when to reboot, and a
boot ID recorded after its reboot would wait for a second one.

Never a node someone else holds out (`others_hold`: cordoned, or a taint of theirs).

A **GPU reset** (opt-in: `--repair.kinds=gpu-reset`, `--repair.reset-by-reboot=false` and
the Job's image in `--repair.reset-image`) waits until no pod bound to the node that asks for
`nvidia.com/gpu` is left (terminating ones count), then creates the Job of
`tainter.reset_job` in `--repair.reset-namespace`, pinned to the node; its outcome is the
Job's (`Complete` or `Failed`, or its succeeded/failed counts), which the repair engine turns
into an Event, `fleetwatch_tainter_repairs_total` and, for a failure, quarantine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Protocol

from fleetwatch.tainter.backend import RepairTicket, RepairView
from fleetwatch.tainter.kube_objects import ApiError, Conflict, NodeView, PodView
from fleetwatch.tainter.payload import KEY_PREFIX
from fleetwatch.tainter.repair_settings import RepairSettings
from fleetwatch.tainter.reset_job import job_name, reset_job
from fleetwatch.tainter.writes import records

REBOOT_HOW = (
    "left to the node-repair controller that watches the node condition; back when "
    "status.nodeInfo.bootID changes"
)


class JobClient(Protocol):
    """The calls the Kubernetes repairs make (`tainter.kube.KubeNodeApi` has them)."""

    async def get_node(self, name: str) -> NodeView: ...

    async def list_pods(
        self, *, node: str | None = None, namespace: str | None = None, label_selector: str = ""
    ) -> list[PodView]: ...

    async def create_job(self, *, namespace: str, body: Mapping[str, Any]) -> None: ...

    async def get_job(self, *, namespace: str, name: str) -> Mapping[str, Any]: ...


def holds_gpu(pod: PodView) -> bool:
    """A pod that still holds (or may still hold) a GPU of its node."""
    return pod.gpu_request and pod.phase not in ("Succeeded", "Failed")


def ready(node: NodeView) -> bool:
    """The kubelet reports the node Ready (a node without a Ready condition counts as
    ready: the API server here may have no kubelet)."""
    return all(c.status == "True" for c in node.conditions if c.type == "Ready")


def job_outcome(job: Mapping[str, Any]) -> tuple[bool, bool, str]:
    """(finished, failed, detail) of a Job's status: its Complete or Failed condition, else
    its succeeded and failed counts (backoffLimit 0: one pod)."""
    status = job.get("status")
    status = status if isinstance(status, dict) else {}
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if not isinstance(condition, dict) or condition.get("status") != "True":
            continue
        kind = condition.get("type")
        if kind in ("Complete", "Failed"):
            why = " ".join(str(condition.get(k) or "") for k in ("reason", "message")).strip()
            return True, kind == "Failed", why or kind
    if int(status.get("failed") or 0) > 0:
        return True, True, "its pod failed"
    if int(status.get("succeeded") or 0) > 0:
        return True, False, "its pod succeeded"
    return False, False, ""


SYSTEM_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
"""Taints Kubernetes itself sets for a node's state (not-ready, unreachable, ...): not a
person's hold."""


def others_hold(node: NodeView) -> str:
    """Who else holds `node` out: a cordon, or a NoSchedule/NoExecute taint that is neither
    fleetwatch's nor one Kubernetes sets for the node's state; "" when none."""
    if node.unschedulable:
        return "cordoned (spec.unschedulable)"
    foreign = sorted(
        t.key
        for t in node.taints
        if not t.key.startswith((KEY_PREFIX, *SYSTEM_TAINT_PREFIXES))
        and t.effect in ("NoSchedule", "NoExecute")
    )
    return f"tainted {', '.join(foreign)}" if foreign else ""


class KubeRepairs:
    """`backend.RepairApi` for Kubernetes, over the backend's client."""

    def __init__(self, *, api: JobClient, settings: RepairSettings) -> None:
        self._api = api
        self._settings = settings

    async def repair_view(
        self, name: str, *, repair: str, ticket: RepairTicket | None
    ) -> RepairView:
        """Before a repair: a reset waits for the node's GPU pods; a reboot waits for
        nothing. In flight: a reboot by the boot ID, a reset by its Job."""
        if ticket is None:
            held = others_hold(await self._api.get_node(name))
            if held or repair != "gpu-reset":
                return RepairView(jobs_running=False, repairing=False, others_hold=held)
            pods = await self._api.list_pods(node=name)
            return RepairView(jobs_running=any(holds_gpu(p) for p in pods), repairing=False)
        if ticket.job:
            return await self._job_view(ticket.job)
        node = await self._api.get_node(name)
        back = bool(node.boot_id) and node.boot_id != ticket.boot_id
        return RepairView(
            jobs_running=False,
            repairing=not back,
            answering=ready(node),
            detail=f"boot ID {ticket.boot_id} → {node.boot_id}" if back else "",
        )

    async def _job_view(self, name: str) -> RepairView:
        namespace = self._settings.reset_namespace
        try:
            job = await self._api.get_job(namespace=namespace, name=name)
        except ApiError as exc:
            if exc.status != 404:
                raise
            return RepairView(
                jobs_running=False,
                repairing=False,
                failed=True,
                detail=f"its Job {namespace}/{name} is gone",
            )
        finished, failed, why = job_outcome(job)
        return RepairView(
            jobs_running=False,
            repairing=not finished,
            failed=failed,
            detail=f"Job {namespace}/{name}: {why}" if finished else "",
        )

    async def start_repair(
        self, node: NodeView, *, repair: str, reason: str, alert: str
    ) -> RepairTicket:
        """A reboot: record the boot ID. A reset: create its Job (one per take-out: a Job of
        that name already there is this take-out's, created before an answer was lost)."""
        if repair == "reboot":
            fresh = await self._api.get_node(node.name)
            if not fresh.boot_id:
                raise ApiError(
                    status=422,
                    reason=f"node {node.name} reports no status.nodeInfo.bootID: its reboot "
                    "could not be seen",
                )
            return RepairTicket(boot_id=fresh.boot_id, how=REBOOT_HOW)
        if repair != "gpu-reset" or not self._settings.reset_image:
            raise ApiError(status=501, reason=f"Kubernetes carries out no {repair} here")
        record = records(node).get(KEY_PREFIX + reason) or {}
        take_out = f"{record.get('time', '')} {record.get('fingerprints', [])}"
        name = job_name(node.name, reason, take_out)
        namespace = self._settings.reset_namespace
        body = reset_job(
            name=name,
            namespace=namespace,
            node=node.name,
            reason=reason,
            image=self._settings.reset_image,
            deadline_seconds=int(self._settings.timeout),
        )
        # A Conflict: this take-out's Job exists already; follow it rather than reset twice.
        with contextlib.suppress(Conflict):
            await self._api.create_job(namespace=namespace, body=body)
        return RepairTicket(job=name, how=f"Job {namespace}/{name} resets the node's GPUs")
