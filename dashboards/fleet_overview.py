"""Fleet overview (uid fleetwatch-fleet): tensor activity vs utilization, heat, taints, Xids,
fabric hot spots and every training job.
"""

from __future__ import annotations

from typing import Final

from grafanalib.core import Dashboard, DashboardLink, Heatmap, Panel

from dashboards.goodput_panels import fleet_panels
from dashboards.panel_promql import Queries
from dashboards.panels import (
    DS,
    NODE,
    Layout,
    dashboard,
    stat,
    table,
    targets,
    timeseries,
    variables,
)
from dashboards.training_job import TRAINING_JOB_UID
from fleetwatch.catalog.gpu import (
    GPU_TEMPERATURE_CELSIUS,
    GPU_TENSOR_ACTIVE_RATIO,
    GPU_UTILIZATION_RATIO,
)
from fleetwatch.catalog.xid import GPU_XID_ERRORS_TOTAL

TRAINING_JOB_URL: Final = (
    f"/d/{TRAINING_JOB_UID}?var-namespace=${{__data.fields.namespace}}"
    "&var-training_job=${__data.fields.training_job}&${__url_time_range}"
)


def build(q: Queries) -> Dashboard:
    """The fleet at a glance, each training job linking to its Training job dashboard."""
    lay = Layout()
    temp = q.exporter(GPU_TEMPERATURE_CELSIUS.name, 'sensor="gpu"', NODE)
    panels: list[Panel] = [
        lay.row("Work: tensor cores, not 'utilization'"),
        Heatmap(
            title="Tensor-core activity by node",
            description="Mean share of time any tensor pipe was active, per node (recorded "
            f"as node:{GPU_TENSOR_ACTIVE_RATIO}:avg).",
            dataSource=DS,
            dataFormat="tsbuckets",
            gridPos=lay.place(12, 9),
            targets=targets((f'node:{GPU_TENSOR_ACTIVE_RATIO}:avg{{node=~"$node"}}', "{{node}}")),
            yBucketBound="middle",
            hideZeroBuckets=False,
        ),
        timeseries(
            lay,
            "Fleet: tensor activity vs GPU utilization",
            (f"fleet:{GPU_TENSOR_ACTIVE_RATIO}:avg", "tensor-core activity"),
            (f"fleet:{GPU_UTILIZATION_RATIO}:avg", "GPU utilization (NVML)"),
            unit="percentunit",
            max_value=1,
            height=9,
            description="NVML utilization counts any kernel running; the gap to tensor "
            "activity is the work the GPUs could do but do not.",
        ),
        lay.row("Heat"),
        timeseries(
            lay,
            "Hottest GPUs",
            (f"topk(10, {temp})", "{{node}} GPU {{gpu}}"),
            unit="celsius",
            width=18,
            limits=[(q.gpu_limit, "red")],
            description=f"Taint threshold {q.gpu_limit:g} °C (rules/config.yaml).",
        ),
        stat(
            lay,
            "GPUs above threshold",
            "fleet:fleetwatch_gpu_over_temperature_threshold:count",
            limits=[(1, "red")],
            height=8,
            description=(
                "GPUs past their model's overheat policy, where GPUOverheating taints: the "
                "taint threshold, or a margin to the slowdown limit for the models "
                "rules/config.yaml lists (thresholds.overheat_policy)."
            ),
        ),
        lay.row("Failures"),
        table(
            lay,
            "Nodes tainted and why",
            (
                "count by (node, fleetwatch_taint, alertname) "
                '(ALERTS{alertstate="firing", fleetwatch_taint!=""})',
                "",
            ),
            description="Firing alerts that ask the tainter for a taint (fleetwatch.io/<reason>).",
        ),
        timeseries(
            lay,
            "Xid events",
            (
                "sum by (node, gpu, xid) (increase("
                f"{q.exporter(GPU_XID_ERRORS_TOTAL.name, NODE)}[$__rate_interval]))",
                "{{node}} GPU {{gpu}} Xid {{xid}}",
            ),
            description="Xid errors per interval, by GPU and Xid.",
        ),
        timeseries(
            lay,
            "InfiniBand error hot spots",
            (f'topk(10, {q.ib_rate}{{node=~"$node"}})', "{{node}} {{device}}/{{port}} {{error}}"),
            unit="short",
            description="Highest error rates per port and error type (per s).",
        ),
        timeseries(
            lay,
            "NVLink error hot spots",
            (
                f'topk(10, {q.nvlink_rate}{{node=~"$node"}})',
                "{{node}} GPU {{gpu}} link {{link}} {{error}}",
            ),
            unit="short",
            description="Highest error rates per link and error type (per s).",
        ),
        lay.row("Training jobs"),
        table(
            lay,
            "Training jobs by median tensor activity",
            (q.job_tensor_median, ""),
            (f"count by (namespace, training_job) ({q.job_info})", ""),
            width=24,
            columns={"Value #A": "median tensor activity", "Value #B": "GPUs"},
            sort_by="median tensor activity",
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "training_job"},
                    "properties": [
                        {
                            "id": "links",
                            "value": [{"title": "Training job", "url": TRAINING_JOB_URL}],
                        }
                    ],
                }
            ],
            description="Every training job (namespace/training_job from fleetwatch:gpu_job:"
            "info); click a job for its Training job dashboard.",
        ),
        *fleet_panels(lay, q.exporter("up")),
    ]
    return dashboard(
        "fleetwatch-fleet",
        "fleetwatch / Fleet overview",
        "Tensor-core work, heat, taints and fabric hot spots across the fleet.",
        panels,
        variables(q.job, gpu=False),
        links=[
            DashboardLink(
                title="Training job",
                type="link",
                uri=f"/d/{TRAINING_JOB_UID}",
                keepTime=True,
                tooltip="Which GPU a training job waits for",
            )
        ],
    )
