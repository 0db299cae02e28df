"""Removal from the run: evict the opted-in GPU pods of a node tainted for a listed reason.

A NoSchedule taint keeps new pods off a hot GPU; the job already on it keeps running. For
the reasons an operator lists (`--evict.reasons`, none by default), after each sync of a
node that carries such a fleetwatch taint, the pods bound to it that request
`nvidia.com/gpu` and carry `fleetwatch.io/evict-on-taint: "true"` are evicted through the
policy/v1 Eviction subresource, so PodDisruptionBudgets are honoured: a 429 is retried with
doubling waits (`--evict.pdb-attempts`), then reported, never forced. Never a plain delete,
never a grace period of 0. DaemonSet and mirror pods, and pods already terminating or
finished, are never evicted.

At most one node of the same training job is taken out at a time: while a pod of the job
is terminating on another node (or another node's pass holds the job's turn), the job's
pods here wait for the next sync. Job identity is the rules' (`rules/definitions.py`
`pod_training_job`): the first present pod label of the config's
`training_jobs.job_label_keys`, else the pod's own name. The state lives in the cluster
(terminating pods), so a new leader inherits it. Evictions are rate-limited (a token
bucket of `--evict.max-per-minute`); `--dry-run` evicts nothing and says what it would do.
Each outcome is logged, counted (`fleetwatch_tainter_evictions_total{reason,result}`) and,
for evictions and refusals, recorded as an Event on the pod and on the node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from fleetwatch.rules.definitions import job_of_pod
from fleetwatch.tainter.backend import RemediationApi
from fleetwatch.tainter.election import Leadership
from fleetwatch.tainter.kube_objects import ApiError, NodeView, PodView
from fleetwatch.tainter.metrics import TainterMetrics
from fleetwatch.tainter.payload import KEY_PREFIX
from fleetwatch.tainter.settings import EvictionSettings, RetryPolicy
from fleetwatch.tainter.writes import our_taints, with_retries

log = logging.getLogger(__name__)

EVICT_LABEL: Final = "fleetwatch.io/evict-on-taint"
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
REPORTED_MEMORY: Final = 100_000  # pod outcomes reported once, remembered this many


class Job(NamedTuple):
    """A training job: its namespace and the label that names it (`key` None: the job is
    the pod itself, named `value`)."""

    namespace: str
    key: str | None
    value: str


def training_job(pod: PodView, job_label_keys: Sequence[str]) -> Job:
    """The pod's training job, as the rules define it: the first of `job_label_keys` the
    pod carries (non-empty), else its own name."""
    key, name = job_of_pod(pod.labels, pod.name, job_label_keys)
    return Job(pod.namespace, key, name)


def skip_reason(pod: PodView) -> str | None:
    """Why an eviction candidate (a running GPU pod) is not evicted, as a metric result;
    None when it may be."""
    if "DaemonSet" in pod.owner_kinds:
        return "skipped_daemonset"
    if MIRROR_ANNOTATION in pod.annotations:
        return "skipped_mirror"
    if pod.labels.get(EVICT_LABEL) != "true":
        return "skipped_no_label"
    return None


def running_gpu_pod(pod: PodView) -> bool:
    """A pod this feature considers at all: requests a GPU, neither terminating nor done."""
    return pod.gpu_request and not pod.terminating and pod.phase not in ("Succeeded", "Failed")


class TokenBucket:
    """At most `per_minute` takes per minute, in bursts of up to `per_minute`."""

    def __init__(self, *, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._capacity = float(per_minute)
        self._rate = per_minute / 60.0
        self._clock = clock
        self._tokens = self._capacity
        self._at = clock()

    def take(self) -> bool:
        """Take one token if there is one."""
        now = self._clock()
        self._tokens = min(self._capacity, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class Evictor:
    """Evicts the opted-in GPU pods of nodes tainted for one of the listed reasons."""

    def __init__(
        self,
        *,
        api: RemediationApi,
        leadership: Leadership,
        metrics: TainterMetrics,
        settings: EvictionSettings,
        job_label_keys: Sequence[str],
        retry: RetryPolicy,
        dry_run: bool,
        owner: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._leadership = leadership
        self._metrics = metrics
        self._settings = settings
        self._reasons = settings.reasons
        self._job_label_keys = tuple(job_label_keys)
        self._retry = retry
        self._dry_run = dry_run
        self._owner = owner
        self._bucket = TokenBucket(per_minute=settings.max_per_minute, clock=clock)
        self._turns_lock = asyncio.Lock()
        self._turns: dict[Job, str] = {}  # job → the node whose pass holds its turn now
        self._reported: OrderedDict[tuple[str, str], None] = OrderedDict()

    async def node_synced(self, node: NodeView) -> None:
        """Evict what the node's fleetwatch taints ask for. An API failure is logged and
        counted; the next sync of the node (the periodic reconcile) tries again."""
        if not self._reasons or not self._leadership.is_leader:
            return
        reasons = sorted(
            r for key in our_taints(node) if (r := key.removeprefix(KEY_PREFIX)) in self._reasons
        )
        if not reasons:
            return
        reason = reasons[0]
        try:
            pods = await self._list(node=node.name)
        except ApiError as exc:
            log.error(
                "cannot list the pods of a tainted node; the next reconcile retries",
                extra={"node": node.name, "error": str(exc)},
            )
            return
        candidates = []
        for pod in filter(running_gpu_pod, pods):
            skip = skip_reason(pod)
            if skip is None:
                candidates.append(pod)
            elif self._first_report(pod, skip):
                self._metrics.evictions.labels(reason=reason, result=skip).inc()
                log.info(
                    "GPU pod on a tainted node not evicted",
                    extra={"node": node.name, "pod": _name(pod), "why": skip},
                )
        if not candidates:
            return
        try:
            chosen = await self._take_turns(node.name, candidates, reason)
        except ApiError as exc:
            log.error(
                "cannot list the pods of a training job; the next reconcile retries",
                extra={"node": node.name, "error": str(exc)},
            )
            return
        try:
            await asyncio.gather(*(self._evict(pod, node, reason) for pod in chosen))
        finally:
            for job in [j for j, n in self._turns.items() if n == node.name]:
                del self._turns[job]

    async def _list(
        self, *, node: str | None = None, namespace: str | None = None, selector: str = ""
    ) -> list[PodView]:
        return await with_retries(
            lambda: self._api.list_pods(node=node, namespace=namespace, label_selector=selector),
            retry=self._retry,
            metrics=self._metrics,
            what=f"list pods node={node} namespace={namespace} selector={selector!r}",
        )

    async def _take_turns(self, node: str, pods: list[PodView], reason: str) -> list[PodView]:
        """The pods whose job may lose this node now; the job's turn is held by this node
        until its pass ends. The others are counted as deferred."""
        chosen = []
        async with self._turns_lock:
            free: dict[Job, bool] = {}
            for pod in pods:
                job = training_job(pod, self._job_label_keys)
                if job not in free:
                    free[job] = await self._job_free(job, node)
                if free[job]:
                    chosen.append(pod)
                    continue
                self._metrics.evictions.labels(reason=reason, result="deferred_same_job").inc()
                log.info(
                    "eviction deferred: another node of the same training job is being taken out",
                    extra={"node": node, "pod": _name(pod), "job": job.value},
                )
            for job, ok in free.items():
                if ok:
                    self._turns[job] = node
        return chosen

    async def _job_free(self, job: Job, node: str) -> bool:
        """No other node's pass holds the job's turn and no pod of the job is terminating
        on another node."""
        if self._turns.get(job, node) != node:
            return False
        if job.key is None:
            return True  # a job of one pod lives on one node
        members = await self._list(namespace=job.namespace, selector=f"{job.key}={job.value}")
        return not any(
            p.terminating and p.node_name != node and training_job(p, self._job_label_keys) == job
            for p in members
        )

    async def _evict(self, pod: PodView, node: NodeView, reason: str) -> None:
        """Evict one pod: rate-limited, retrying PDB refusals, never forced."""
        if self._dry_run:
            if self._first_report(pod, "dry_run"):
                self._metrics.evictions.labels(reason=reason, result="dry_run").inc()
                log.warning(
                    "pod would be evicted (dry run)", extra={"node": node.name, "pod": _name(pod)}
                )
                await self._tell(pod, node, "EvictedForTaint", f"would evict {_name(pod)}", reason)
            return
        if not self._bucket.take():
            self._metrics.evictions.labels(reason=reason, result="rate_limited").inc()
            log.warning(
                "eviction deferred: --evict.max-per-minute reached",
                extra={"node": node.name, "pod": _name(pod)},
            )
            return
        if not pod.owner_kinds:
            log.warning(
                "evicting a pod without owner references: nothing will recreate it",
                extra={"node": node.name, "pod": _name(pod)},
            )
        refusal: ApiError | None = None
        for attempt in range(self._settings.pdb_attempts):
            if attempt:
                await asyncio.sleep(self._settings.pdb_backoff * 2.0 ** (attempt - 1))
            if not self._leadership.is_leader:
                return
            try:
                await self._api.evict_pod(namespace=pod.namespace, name=pod.name)
            except ApiError as exc:
                if exc.status == 429:
                    refusal = exc
                    continue
                if exc.status == 404:
                    return  # gone since it was listed: nothing left to take out
                self._metrics.evictions.labels(reason=reason, result="error").inc()
                self._metrics.api_errors.labels(status=str(exc.status)).inc()
                log.error(
                    "eviction refused; nothing else written",
                    extra={"node": node.name, "pod": _name(pod), "error": str(exc)},
                )
                return
            self._metrics.evictions.labels(reason=reason, result="evicted").inc()
            self._forget(pod)
            log.warning("pod evicted", extra={"node": node.name, "pod": _name(pod)})
            await self._tell(pod, node, "EvictedForTaint", f"evicted {_name(pod)}", reason)
            return
        assert refusal is not None
        self._metrics.evictions.labels(reason=reason, result="blocked_by_pdb").inc()
        log.warning(
            "eviction blocked by a PodDisruptionBudget; not forced, retried at the next reconcile",
            extra={"node": node.name, "pod": _name(pod), "error": refusal.reason},
        )
        if self._first_report(pod, "blocked_by_pdb"):
            await self._tell(
                pod,
                node,
                "EvictionBlocked",
                f"eviction of {_name(pod)} refused by a PodDisruptionBudget after "
                f"{self._settings.pdb_attempts} tries: {refusal.reason}",
                reason,
                warning=True,
            )

    async def _tell(
        self,
        pod: PodView,
        node: NodeView,
        event: str,
        what: str,
        reason: str,
        *,
        warning: bool = False,
    ) -> None:
        """Record Events on the pod and on the node; a failure is logged and counted, never
        raised (an Event is a report, not part of the eviction)."""
        why = (
            "dry run: " if self._dry_run else ""
        ) + f"{what} from node {node.name} (taint {KEY_PREFIX}{reason}) by {self._owner}"
        try:
            await self._api.create_pod_event(pod=pod, reason=event, message=why, warning=warning)
            await self._api.create_event(node=node, reason=event, message=why, warning=warning)
        except ApiError as exc:
            self._metrics.api_errors.labels(status=str(exc.status)).inc()
            log.warning(
                "cannot record Event", extra={"pod": _name(pod), "reason": event, "error": str(exc)}
            )

    def _first_report(self, pod: PodView, outcome: str) -> bool:
        """True the first time `outcome` is seen for this pod (bounded memory), so a skip
        or a dry run is counted and told once, not at every reconcile."""
        key = (pod.uid or _name(pod), outcome)
        if key in self._reported:
            return False
        self._reported[key] = None
        while len(self._reported) > REPORTED_MEMORY:
            self._reported.popitem(last=False)
        return True

    def _forget(self, pod: PodView) -> None:
        for outcome in ("blocked_by_pdb", "dry_run"):
            self._reported.pop((pod.uid or _name(pod), outcome), None)


def _name(pod: PodView) -> str:
    return f"{pod.namespace}/{pod.name}"
