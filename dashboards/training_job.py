"""Training job (uid fleetwatch-training-job): one job (namespace/training_job) across its
nodes: the GPU it waits for, idle GPUs, heat, its interruptions and effective training
time, fabric errors, checkpoint saves and taints.
"""

from __future__ import annotations

from typing import Final

from grafanalib.core import Dashboard, Heatmap, Panel, Templating

from dashboards.goodput_panels import job_panels
from dashboards.panel_promql import Queries
from dashboards.panels import (
    DS,
    Layout,
    dashboard,
    datasource_variable,
    query_variable,
    table,
    targets,
    timeseries,
)
from fleetwatch.catalog.gpu import GPU_TEMPERATURE_CELSIUS

TRAINING_JOB_UID: Final = "fleetwatch-training-job"
JOB_SEL: Final = 'namespace="$namespace", training_job="$training_job"'


def job_variables(q: Queries) -> Templating:
    """datasource, namespace and training_job (one job at a time) variables."""
    return Templating(
        list=[
            datasource_variable(),
            query_variable("namespace", "Namespace", f"label_values({q.job_info}, namespace)"),
            query_variable(
                "training_job",
                "Training job",
                f'label_values({q.job_info}{{namespace="$namespace"}}, training_job)',
            ),
        ]
    )


def build(q: Queries) -> Dashboard:
    """One training job (namespace/training_job) across its nodes."""
    lay = Layout()
    on_job_nodes = f"and on (node) {q.job_info}{{{JOB_SEL}}}"
    gpu_temp = q.exporter(GPU_TEMPERATURE_CELSIUS.name, 'sensor="gpu"')
    panels: list[Panel] = [
        lay.row("Work: which GPU does the job wait for?"),
        Heatmap(
            title="Tensor activity per GPU",
            description="One row per GPU of the job, colored by the share of time its "
            "tensor cores were active (fleetwatch GPM, else dcgm-exporter). The GPU the job "
            "waits for is the brightest row; a dark row is an idle GPU (GPUIdleInJob).",
            dataSource=DS,
            dataFormat="tsbuckets",
            gridPos=lay.place(16, 10),
            targets=targets((f"{q.job_tensor}{{{JOB_SEL}}}", "{{node}} GPU {{gpu}}")),
            yBucketBound="middle",
            hideZeroBuckets=False,
        ),
        timeseries(
            lay,
            "Job median tensor activity vs its last hour",
            (f"{q.job_tensor_median}{{{JOB_SEL}}}", "median now"),
            (f"avg_over_time({q.job_tensor_median}{{{JOB_SEL}}}[1h])", "average, last hour"),
            unit="percentunit",
            max_value=1,
            width=8,
            height=10,
            description="TrainingJobSlowdown fires when the median falls well below its "
            "own recent average.",
        ),
        table(
            lay,
            "GPUs ranked by tensor activity (straggler marked)",
            (f"{q.job_tensor}{{{JOB_SEL}}}", ""),
            (f"{q.job_sm_clock}{{{JOB_SEL}}}", ""),
            (
                "max by (node, gpu, uuid, namespace, pod, training_job) "
                f'(ALERTS{{alertname="GPUStraggler", {JOB_SEL}}})',
                "",
            ),
            width=24,
            height=10,
            columns={
                "Value #A": "tensor activity",
                "Value #B": "SM clock (Hz)",
                "Value #C": "straggler (GPUStraggler)",
            },
            sort_by="tensor activity",
            description="The GPU the job waits for has the highest activity and a lower SM "
            "clock (or a thermal/power clock event): GPUStraggler marks it with 1.",
        ),
        timeseries(
            lay,
            "SM clock per GPU and the job's median",
            (f"{q.job_sm_clock}{{{JOB_SEL}}}", "{{node}} GPU {{gpu}}"),
            (f"{q.job_sm_clock_median}{{{JOB_SEL}}}", "job median"),
            unit="hertz",
        ),
        timeseries(
            lay,
            "GPU temperature against the limit",
            (
                f"{gpu_temp}\n* on (uuid) group_left ()\nmax by (uuid) ({q.job_info}{{{JOB_SEL}}})",
                "{{node}} GPU {{gpu}}",
            ),
            unit="celsius",
            limits=[(q.gpu_limit, "red")],
            description=f"The line is the {q.gpu_limit:g} °C taint threshold "
            "(rules/config.yaml); GPUOverheatingSoon warns on a trend towards it.",
        ),
        *job_panels(lay, JOB_SEL),
        *checkpoint_panels(q, lay, on_job_nodes),
        lay.row("The job's nodes"),
        timeseries(
            lay,
            "NVLink and InfiniBand errors on the job's nodes",
            (f"{q.fabric_errors} {on_job_nodes}", "{{node}} {{fabric}}"),
            description="Errors per second on every NVLink and InfiniBand port of the "
            "nodes the job runs on.",
        ),
        timeseries(
            lay,
            "Erroring links and ports on the job's nodes",
            (
                f"{q.nvlink_rate} > 0 {on_job_nodes}",
                "{{node}} GPU {{gpu}} link {{link}} {{error}}",
            ),
            (f"{q.ib_rate} > 0 {on_job_nodes}", "{{node}} {{device}}/{{port}} {{error}}"),
            description="Which link or port counts errors (per s, by error type).",
        ),
        table(
            lay,
            "Taints on the job's nodes",
            (
                "count by (node, fleetwatch_taint, alertname) "
                f'(ALERTS{{alertstate="firing", fleetwatch_taint!=""}} {on_job_nodes})',
                "",
            ),
            width=24,
            description="Firing alerts that taint a node of the job "
            "(fleetwatch.io/<reason>): no new pod of the job lands there.",
        ),
    ]
    return dashboard(
        TRAINING_JOB_UID,
        "fleetwatch / Training job",
        "One training job across its nodes: the GPU it waits for, idle GPUs, heat, fabric "
        "errors, checkpoint saves and taints.",
        panels,
        job_variables(q),
    )


def checkpoint_panels(q: Queries, lay: Layout, on_job_nodes: str) -> list[Panel]:
    """The job's checkpoint saves: its write throughput with the saves marked, and each of
    its nodes' share (the storage straggler is the node that lags during a save)."""
    alerts = 'alertname=~"CheckpointStraggler|CheckpointMountHung|CheckpointMountReadOnly"'
    return [
        lay.row("Checkpoints: does a save stall on one node?"),
        timeseries(
            lay,
            "Checkpoint write throughput and saves",
            (f"{q.job_checkpoint_write}{{{JOB_SEL}}}", "job write rate"),
            (
                f"{q.job_checkpoint_burst}{{{JOB_SEL}}} * on (namespace, training_job) "
                f"group_left () max by (namespace, training_job) "
                f"(max_over_time({q.job_checkpoint_write}{{{JOB_SEL}}}[10m]))",
                "saving",
            ),
            unit="Bps",
            description="Bytes per second the job's nodes write to their checkpoint mounts; "
            "the saving band marks each save (its height is the job's recent peak rate). A "
            "save that stretches out while the rate sags is waiting on its slowest node.",
        ),
        timeseries(
            lay,
            "Checkpoint write rate per node of the job",
            (f"{q.node_checkpoint_write} {on_job_nodes}", "{{node}}"),
            unit="Bps",
            description="Each node's checkpoint writes: during a save the storage straggler "
            "(CheckpointStraggler) writes well below the others.",
        ),
        table(
            lay,
            "Checkpoint alerts on the job's nodes",
            (
                f'count by (node, alertname, mountpoint) (ALERTS{{alertstate="firing", '
                f"{alerts}}} {on_job_nodes})",
                "",
            ),
            width=24,
            height=6,
            description="A straggling, hung or read-only checkpoint mount on a node of the "
            "job; a hung or read-only one taints the node.",
        ),
    ]
