"""NVLink-domain rules (GB200/GB300 NVL72, global scope): each domain's GPUs and nodes, its
degraded and unregistered GPUs, the training jobs that span it, and the alert when a domain
with running jobs degrades.

A domain is what NVML's fabric info names (`fleetwatch_gpu_fabric_info`: cluster UUID and
clique ID). Every GPU of one NVLink domain shares the fabric, and a multi-node NVLink job
(an IMEX / ComputeDomain job) stops as a whole when one tray's fabric fails, so the
domain, not the node, is what these rules count. They need every node of a domain in one
query: they run in the global ruler (rules/config.yaml `rule_groups:`).
"""

from __future__ import annotations

from fleetwatch.catalog.gpu import GPU_FABRIC_DEGRADED, GPU_FABRIC_INFO, GPU_FABRIC_STATE_ID
from fleetwatch.rules.alerts.fabric import FABRIC_COMPLETED
from fleetwatch.rules.config import Config, Params
from fleetwatch.rules.definitions import (
    DOMAIN_DEGRADED,
    DOMAIN_GPU_INFO,
    DOMAIN_GPUS,
    DOMAIN_JOB_GPUS,
    DOMAIN_LABELS,
    DOMAIN_NODES,
    DOMAIN_UNREGISTERED,
    JOB_INFO,
)
from fleetwatch.rules.promql import Alert, Promql, Record

_GPU_KEY = "node, gpu, uuid"


def _per_domain(config: Config, metric: str, condition: str) -> str:
    """How many of each domain's GPUs meet `condition` on `metric` (0 when none)."""
    q = Promql(config)
    return (
        f"sum by ({DOMAIN_LABELS}) (\n{DOMAIN_GPU_INFO}\n* on ({_GPU_KEY}) group_left ()\n"
        f"(max by ({_GPU_KEY}) ({q.exporter(metric)}) {condition})\n)"
    )


def records(config: Config, p: Params) -> list[Record]:
    """Each GPU's domain; per domain its GPUs, nodes, degraded and unregistered GPUs; and
    the GPUs each training job holds in each domain."""
    del p  # no thresholds: counts only
    q = Promql(config)
    return [
        Record(
            record=DOMAIN_GPU_INFO,
            expr=f"max by ({_GPU_KEY}, {DOMAIN_LABELS}) ({q.exporter(GPU_FABRIC_INFO.name)})",
        ),
        Record(record=DOMAIN_GPUS, expr=f"count by ({DOMAIN_LABELS}) ({DOMAIN_GPU_INFO})"),
        Record(
            record=DOMAIN_NODES,
            expr=(
                f"count by ({DOMAIN_LABELS}) (\n"
                f"group by ({DOMAIN_LABELS}, node) ({DOMAIN_GPU_INFO})\n)"
            ),
        ),
        Record(
            record=DOMAIN_DEGRADED,
            expr=_per_domain(config, GPU_FABRIC_DEGRADED.name, "== bool 1"),
        ),
        Record(
            record=DOMAIN_UNREGISTERED,
            expr=_per_domain(config, GPU_FABRIC_STATE_ID.name, f"!= bool {FABRIC_COMPLETED}"),
        ),
        Record(
            record=DOMAIN_JOB_GPUS,
            expr=(
                f"count by ({DOMAIN_LABELS}, namespace, training_job) (\n"
                f"group by (uuid, namespace, training_job) ({JOB_INFO})\n"
                f"* on (uuid) group_left ({DOMAIN_LABELS})\n{DOMAIN_GPU_INFO}\n)"
            ),
        ),
    ]


def alerts(config: Config, p: Params) -> list[Alert]:
    """A domain with running training jobs that has degraded or unregistered GPUs."""
    del config, p  # reads recording rules only
    domain = "NVLink domain {{ $labels.cluster_uuid }} clique {{ $labels.clique_id }}"
    return [
        Alert(
            name="NVLinkDomainDegraded",
            expr=(
                f"({DOMAIN_DEGRADED} + {DOMAIN_UNREGISTERED}) > 0\n"
                f"and on ({DOMAIN_LABELS})\ngroup by ({DOMAIN_LABELS}) ({DOMAIN_JOB_GPUS})"
            ),
            summary=f"{domain} degraded under running jobs",
            description=(
                f"{{{{ $value }}}} GPU(s) of {domain} report a degraded or unregistered NVLink "
                "fabric while training jobs run in the domain: every job spanning it (a "
                "ComputeDomain's jobs all stop when one tray's fabric fails) slows down or "
                f"fails. The jobs spanning it are the {DOMAIN_JOB_GPUS} series of this "
                "cluster_uuid and clique_id."
            ),
        ),
    ]
