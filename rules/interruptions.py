"""Interruptions of training jobs: the recording rules' names and what they mean.

An interruption is the moment a training job stops making progress and has to restart
(docs/training-jobs.md, "Interruptions and lemon nodes"). The live rules (rules/alerts/goodput.py)
find each one from telemetry fleets already have and record it as sparse series: an
interruption is a short run of samples, present only while it is being seen, so a reader
over weeks reads what the interruptions cost, not every GPU's raw series. The report, the
dashboards and the lemon-node alert read these names from here.

Records (all of the global scope: a job spans nodes):

- `JOB_INTERRUPTION_RECORD` `{namespace, training_job, kind}`: 1 while an interruption of
  `kind` is seen on the job, absent otherwise. Each detection holds it for at least
  `thresholds.goodput.live_merge_window` (1m), so detections closer than that (a JobSet
  restart's pods appearing over several scrapes, two restarts within a minute) are one run
  of samples. One interruption = one run (a rise from absent to 1; runs are separated by
  at least one evaluation without a sample). A coincidence of kinds (a pod evicted, then
  the JobSet restarting every pod) is a run under each kind: per-kind counts may sum to
  more than the job's total, which `JOB_INTERRUPTED_RECORD` gives.
- `JOB_INTERRUPTED_RECORD` `{namespace, training_job}`: 1 while any kind's record is
  present (their union): one run per interruption of the job, whatever its kinds. The
  kind of a run is the first of `KINDS` present during it (`KINDS` is in that
  precedence: the most specific scheduler fact first, the in-place drop last).
- `NODE_INTERRUPTION_RECORD` `{node, namespace, training_job, kind}`: 1 while `node` is a
  node behind the job's interruption of `kind`, as the live rules can tell it: the node of
  the pod that was evicted, lost, failed or restarted its container, the node whose
  exporter fell silent or that Slurm marked failed while holding the job's GPUs. Kinds that
  name no node by themselves (a JobSet restart, an in-place restart) are not on it unless
  one of those facts names one: for a JobSet restart or a pod recreated, the nodes of the
  job's pods in phase Failed while it is seen. The report attributes causes and nodes
  more thoroughly (signals in a window around each interruption); the lemon-node alert
  reads this record.
- `JOB_GPUS_RECORD` `{namespace, training_job}`: how many GPUs the job holds now (GPUs of
  `fleetwatch:gpu_job:info`), for GPU-hours lost.
- `JOB_NODE_GPUS_RECORD` `{node, namespace, training_job}`: the job's GPUs on each node.
- `POD_JOB_RECORD` `{namespace, pod, training_job}`: each pod of a job that held GPUs
  within `thresholds.goodput.live_startup_grace` (its pods, named as `fleetwatch:gpu_job:info`
  names them), value 1.
- `JOB_PROGRESS_RECORD` `{namespace, training_job}`: 1 while the job makes progress (its
  median tensor activity above `thresholds.job_busy_ratio`), 0 while it holds GPUs and does
  not (an interruption, a checkpoint save, a stall): `avg_over_time` of it over a window
  is the job's effective training time ratio (ETTR)
  while scheduled (time queued is not seen).
- `JOB_TENSOR_MAX_RECORD` `{namespace, training_job}`: the job's busiest GPU's tensor
  activity; below `thresholds.tensor_idle_ratio` means every GPU of the job idles at once.

Kinds (`KIND_LABEL`):

- `node_fail`: a node holding a Slurm job's GPUs went silent: its exporter not scraped for
  `thresholds.goodput.live_node_silence` (Slurm ends the job NODE_FAIL when its node stops
  answering, and requeues it).
- `node_lost`: a node holding a Kubernetes job's GPUs went silent while kube-state-metrics
  says the node is not Ready, or Kubernetes marked a pod of the job lost with its node
  (pod status reason NodeLost).
- `evicted`: a pod of the job was evicted (kube-state-metrics' pod status reason Evicted,
  Shutdown, NodeAffinity or UnexpectedAdmissionError).
- `slurm_requeue`: the Slurm job started again with a higher `SLURM_RESTART_COUNT`.
- `jobset_restart`: a new JobSet restart attempt (kube-state-metrics' label of
  `jobset.sigs.k8s.io/restart-attempt`, when its allowlist names it).
- `pod_recreated`: a pod of the job created after the job had run for
  `thresholds.goodput.live_startup_grace` (a Kubeflow/training-operator pod recreated, a
  JobSet restart seen without the attempt label, a Job's pod replaced).
- `container_restart`: a container of the job's pods restarted in place
  (`kube_pod_container_status_restarts_total`).
- `in_place`: every GPU of the job dropped under `thresholds.tensor_idle_ratio` at once and
  came back above `thresholds.job_busy_ratio`, with no checkpoint save and no scheduler
  restart during the drop (torchrun restarting its workers in the same containers).
"""

from __future__ import annotations

from typing import Final

KIND_LABEL: Final = "kind"
"""The label naming how an interruption was seen."""

KINDS: Final = (
    "node_fail",
    "node_lost",
    "evicted",
    "slurm_requeue",
    "jobset_restart",
    "pod_recreated",
    "container_restart",
    "in_place",
)
"""Every kind, in precedence: a run of `JOB_INTERRUPTED_RECORD` is the first kind present."""

JOB_INTERRUPTION_RECORD: Final = "fleetwatch:job_interruption:active"
"""1 while an interruption of `kind` is seen on the job {namespace, training_job, kind}."""
JOB_INTERRUPTED_RECORD: Final = "fleetwatch:job_interrupted:active"
"""1 while any interruption of the job is seen {namespace, training_job}."""
NODE_INTERRUPTION_RECORD: Final = "fleetwatch:node_job_interruption:active"
"""1 while the node is behind an interruption of the job {node, namespace, training_job,
kind}."""
JOB_GPUS_RECORD: Final = "fleetwatch:job_gpus:count"
"""GPUs the job holds {namespace, training_job}."""
JOB_NODE_GPUS_RECORD: Final = "fleetwatch:job_node_gpus:count"
"""GPUs the job holds on each node {node, namespace, training_job}."""
POD_JOB_RECORD: Final = "fleetwatch:pod_training_job:info"
"""Each pod of a job that holds GPUs {namespace, pod, training_job} (value 1)."""
JOB_PROGRESS_RECORD: Final = "fleetwatch:job_progress:bool"
"""1 while the job makes progress, 0 while it holds GPUs and does not."""
JOB_TENSOR_MAX_RECORD: Final = "namespace_training_job:fleetwatch_gpu_tensor_active:max"
"""The job's busiest GPU's tensor activity {namespace, training_job}."""

EVICTED_REASONS: Final = ("Evicted", "Shutdown", "NodeAffinity", "UnexpectedAdmissionError")
"""kube-state-metrics' `kube_pod_status_reason` reasons of a pod put off its node."""
NODE_LOST_REASON: Final = "NodeLost"
"""kube-state-metrics' `kube_pod_status_reason` of a pod lost with its node."""

JOBSET_RESTART_ATTEMPT_LABEL: Final = "jobset.sigs.k8s.io/restart-attempt"
"""The pod label JobSet sets to the global restart attempt (0, 1, ...)."""
