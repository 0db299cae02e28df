"""The seam between the tainter's policy core and an orchestrator: the backend interface.

The controller, the breaker, quarantine, leader election and delivery decide; a backend only
lists nodes, takes them out and puts them back, keeps their history and says who may act.
It is these protocols, and they name no orchestrator:

- `NodeApi`: read nodes as `NodeView`s (their holds as `Taint`s: fleetwatch's are those under
  `fleetwatch.io/`, every other one is carried as read), write a node's holds, labels and
  annotations in one write guarded by the version it was planned from (a stale one raises
  `Conflict`), and record what happened (an Event, or a log line where the orchestrator has
  no Events). Taking a node out is writing a fleetwatch hold, putting it back is removing
  the last one; the history (`tainter.quarantine`) and audit records ride in the same write.
- `LeaseApi`: the record leader election holds (who may act) and the breaker's state is
  kept on, read and replaced under the same version guard.
- `PodApi`: what removal from the run and the node condition need where the orchestrator runs
  pods.

Kubernetes (`tainter.kube`: taints, annotations, a coordination Lease) and Slurm
(`tainter.slurm_backend`: drains whose reason starts `fleetwatch:`, a state file beside
slurmctld's state) implement them; this module imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from fleetwatch.tainter.kube_objects import (
    ApiError,
    Lease,
    NodeCondition,
    NodeView,
    PodView,
    Taint,
)


class Unavailable(ApiError):
    """The backend is backing off after failures (a slow or failing scontrol): retrying now
    cannot help, so the caller gives up at once and the next reconcile tries again."""

    def __init__(self, reason: str) -> None:
        super().__init__(status=503, reason=reason)


class NodeApi(Protocol):
    """The node and event operations the controller needs."""

    async def get_node(self, name: str) -> NodeView: ...

    async def list_nodes(self, *, label_selector: str = "") -> list[NodeView]: ...

    async def patch_node(
        self,
        name: str,
        *,
        resource_version: str,
        taints: Sequence[Taint] | None,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> NodeView:
        """Merge-patch labels/annotations (None deletes) and replace `spec.taints` whole
        (None leaves it alone), only if the node is still at `resource_version`."""
        ...

    async def create_event(
        self,
        *,
        node: NodeView,
        reason: str,
        message: str,
        warning: bool,
    ) -> None: ...


class PodApi(Protocol):
    """The pod, eviction and node-status operations of removal from the run."""

    async def list_pods(
        self, *, node: str | None = None, namespace: str | None = None, label_selector: str = ""
    ) -> list[PodView]:
        """Pods bound to `node` (every namespace), or of `namespace`, matching the selector."""
        ...

    async def evict_pod(self, *, namespace: str, name: str) -> None:
        """Create a policy/v1 Eviction: the API server honours PodDisruptionBudgets (429)."""
        ...

    async def patch_node_conditions(
        self, name: str, *, resource_version: str, conditions: Sequence[NodeCondition]
    ) -> NodeView:
        """Strategic-merge `status.conditions` (merged by type: other conditions stay),
        only if the node is still at `resource_version` (else Conflict)."""
        ...

    async def create_pod_event(
        self, *, pod: PodView, reason: str, message: str, warning: bool
    ) -> None:
        """Record an Event on `pod`, in the pod's namespace."""
        ...


class RemediationApi(NodeApi, PodApi, Protocol):
    """Nodes and pods: what the node condition and removal from the run call (the real
    client; they check leadership and `--dry-run` themselves)."""


@dataclass(frozen=True, slots=True)
class RepairView:
    """What the repair engine needs of a taken-out node: whether jobs still run on it,
    whether the orchestrator is still carrying out a repair asked of it, whether the node
    answers it (a repair is neither asked of nor seen back from a node that does not),
    whether the repair ended without working (`failed`, with the orchestrator's `detail`),
    and who else holds the node out (`others_hold`: a person's cordon, drain or taint; such a
    node is never repaired)."""

    jobs_running: bool
    repairing: bool
    answering: bool = True
    failed: bool = False
    detail: str = ""
    others_hold: str = ""


@dataclass(frozen=True, slots=True)
class RepairTicket:
    """What a backend needs later to tell whether a repair it started is over, kept with the
    attempt on the node: the node's boot ID when a reboot started (Kubernetes: back when
    `status.nodeInfo.bootID` changes) or the GPU reset Job's name; empty where the
    orchestrator follows the repair itself (Slurm). `how` says, for the Event, how the
    repair is carried out."""

    boot_id: str = ""
    job: str = ""
    how: str = ""


@runtime_checkable
class RepairApi(Protocol):
    """A backend that can carry out repairs (`tainter.repair`): Slurm reboots through
    `scontrol reboot` and its RebootProgram; Kubernetes watches the node-repair controllers'
    reboot by the node's boot ID and runs a GPU reset as a Job (`tainter.kube_repair`). A
    wrapper (leader-only, dry run) is one too, and says through `can_repair` whether the
    backend it wraps is."""

    @property
    def can_repair(self) -> bool: ...

    async def repair_view(
        self, name: str, *, repair: str, ticket: RepairTicket | None
    ) -> RepairView:
        """The node's jobs and the `repair` as the orchestrator sees them now (`ticket`: the
        one `start_repair` gave for the repair in flight, None before one starts); ApiError."""
        ...

    async def start_repair(
        self, node: NodeView, *, repair: str, reason: str, alert: str
    ) -> RepairTicket:
        """Ask the orchestrator to carry out `repair` of a node fleetwatch took out for
        `reason` (alert `alert`) whose jobs are gone; ApiError when it refuses."""
        ...


def repair_backend(api: object) -> RepairApi | None:
    """`api` as a RepairApi when it (or the backend it wraps) carries out repairs."""
    return api if isinstance(api, RepairApi) and api.can_repair else None


async def view_of(
    api: object, name: str, *, repair: str, ticket: RepairTicket | None
) -> RepairView:
    """The wrapped backend's `repair_view`; ApiError 501 when it carries out no repair."""
    real = repair_backend(api)
    if real is None:
        raise ApiError(status=501, reason="this orchestrator carries out no repair")
    return await real.repair_view(name, repair=repair, ticket=ticket)


class LeaseApi(Protocol):
    """The Lease operations leader election and the breaker's state need."""

    async def get_lease(self, *, namespace: str, name: str) -> Lease:
        """The Lease; ApiError with status 404 when it does not exist."""
        ...

    async def create_lease(self, *, namespace: str, lease: Lease) -> Lease:
        """Create it; Conflict when another process created it first."""
        ...

    async def replace_lease(self, *, namespace: str, lease: Lease) -> Lease:
        """Replace it whole, only if still at `lease.resource_version` (else Conflict)."""
        ...

    async def patch_lease_annotations(
        self, *, namespace: str, name: str, resource_version: str, annotations: Mapping[str, str]
    ) -> Lease:
        """Merge-patch annotations, only if still at `resource_version` (else Conflict)."""
        ...


class ClusterApi(NodeApi, LeaseApi, Protocol):
    """A backend's nodes and its lease record: what the controller, leader election, the
    breaker's store and `fleetwatch untaint` are built on."""
