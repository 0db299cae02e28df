"""The GPU reset Job: one manifest for the tainter and the chart's reviewed example.

A GPU reset without a reboot runs on the node fleetwatch holds out, once the node is drained of
GPU pods: the NVIDIA driver's own `nvidia-smi --gpu-reset -i N` for each GPU, only when
`nvidia-smi --query-compute-apps` shows no process on any of them (else exit 3, nothing reset).
The tainter resets every GPU of the node (`GPU=all`): the node holds no GPU pod by then, and
on NVSwitch systems the driver resets the GPUs of a fabric together anyway.

Privileges are the chart's exporter admin container's and no more (helm/fleetwatch/templates/
exporter-daemonset.yaml, `exporter-admin`; tests/deploy/test_gpu_reset_job.py compares them):
root, every capability dropped but SYS_ADMIN, a read-only root filesystem, the RuntimeDefault
seccomp profile, the `nvidia` runtime class with the utility driver capability, no service
account token; never privileged. It tolerates every taint (the node is held out, maybe
cordoned), never retries (`backoffLimit: 0`), is failed by the Job controller past the repair
timeout (`activeDeadlineSeconds`) and removed a day after it finished.
`helm/write_chart.py` writes the example from `reset_job` with `${...}` placeholders.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

COMPONENT: Final = "gpu-reset"
NODE_ANNOTATION: Final = "fleetwatch.io/node"
REASON_ANNOTATION: Final = "fleetwatch.io/reason"
ALL_GPUS: Final = "all"
HELD_EXIT: Final = 3

RESET_SCRIPT: Final = f"""set -eu
gpus="$GPU"
if [ "$gpus" = {ALL_GPUS} ]; then
  gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader)
fi
if [ -z "$gpus" ]; then
  echo "nvidia-smi lists no GPU: nothing reset"
  exit 4
fi
for i in $gpus; do
  held=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader -i "$i")
  if [ -n "$held" ]; then
    echo "GPU $i is held by process(es) $held: not reset"
    exit {HELD_EXIT}
  fi
done
for i in $gpus; do
  nvidia-smi --gpu-reset -i "$i"
done
"""


def job_name(node: str, reason: str, take_out: str) -> str:
    """The Job's name for one take-out of `node` for `reason` (`take_out`: its audit record's
    time and alert fingerprints): the same take-out always names the same Job, so a retried
    create finds it (409) instead of resetting twice, and the next take-out names another."""
    digest = hashlib.sha256(f"{node}\n{reason}\n{take_out}".encode()).hexdigest()[:16]
    return f"fleetwatch-gpu-reset-{digest}"


def reset_job(
    *,
    name: str,
    namespace: str,
    node: str,
    reason: str,
    image: str,
    deadline_seconds: int,
    gpu: str = ALL_GPUS,
) -> dict[str, Any]:
    """The batch/v1 Job that resets `gpu` (an index, or every GPU) on `node`."""
    labels = {"app.kubernetes.io/name": "fleetwatch", "app.kubernetes.io/component": COMPONENT}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": {NODE_ANNOTATION: node, REASON_ANNOTATION: reason},
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline_seconds,
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "runtimeClassName": "nvidia",
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [_container(image, gpu)],
                },
            },
        },
    }


def _container(image: str, gpu: str) -> dict[str, Any]:
    return {
        "name": COMPONENT,
        "image": image,
        "command": ["/bin/sh", "-c", RESET_SCRIPT],
        "env": [
            {"name": "GPU", "value": gpu},
            # Every GPU visible (the pod requests no nvidia.com/gpu), as for the exporter.
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
        ],
        "securityContext": {
            "runAsNonRoot": False,
            "runAsUser": 0,
            "runAsGroup": 0,
            "readOnlyRootFilesystem": True,
            "seccompProfile": {"type": "RuntimeDefault"},
            "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
        },
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
    }
