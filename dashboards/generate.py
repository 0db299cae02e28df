"""Generate fleetwatch's Grafana dashboards (grafanalib) as JSON files in dashboards/.

Thresholds (the 78 °C line, the HBM limit) and the exporter's job selector come from
rules/config.yaml through rules/generate.py, so a dashboard never disagrees with the alerts.
Run as a script to rewrite dashboards/*.json (`--check` only reports drift); import it for
`dashboards(config)` and `panel_queries(data)`, which the tests use to check every query.

Dashboards (stable UIDs, variables datasource / node / gpu, or namespace / training_job):
- fleetwatch-fleet   Fleet overview: tensor activity vs utilization, heat, taints, Xids, hot
                     spots, training jobs (each linking to the Training job dashboard)
- fleetwatch-training-job  Training job: which GPU the job waits for, idle GPUs, heat, fabric
                     errors and taints on the job's nodes
- fleetwatch-node    Node detail: temperatures, clocks, power, NVLink matrix, InfiniBand ports
- fleetwatch-fabric  Fabric: InfiniBand error rates, flaps, degraded links, saturation, NVLink
- fleetwatch-stack   Stack health: collectors, scrapes, tainter actions and breaker
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from fleetwatch.rules import config as rules_config
from fleetwatch.rules import definitions as rules_definitions
from fleetwatch.rules import generate as rules_generate
from fleetwatch.rules import promql as rules_promql
from grafanalib._gen import DashboardEncoder
from grafanalib.core import (
    Dashboard,
    DashboardLink,
    GridPos,
    Heatmap,
    Panel,
    RowPanel,
    Stat,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

ROOT: Final = Path(__file__).resolve().parents[1]
DASHBOARDS_DIR: Final = ROOT / "dashboards"
DS: Final = "${datasource}"
NODE: Final = 'node=~"$node"'
GPU: Final = 'gpu=~"$gpu"'
JOB_SEL: Final = 'namespace="$namespace", training_job="$training_job"'
TRAINING_JOB_UID: Final = "fleetwatch-training-job"
TRAINING_JOB_URL: Final = (
    f"/d/{TRAINING_JOB_UID}?var-namespace=${{__data.fields.namespace}}"
    "&var-training_job=${__data.fields.training_job}&${__url_time_range}"
)
WIDTH: Final = 24


class Layout:
    """Places panels left to right in rows of 24 columns, so sources list panels only."""

    def __init__(self) -> None:
        self._x = 0
        self._y = 0
        self._row_height = 0

    def place(self, width: int, height: int) -> GridPos:
        if self._x + width > WIDTH:
            self._x, self._y, self._row_height = 0, self._y + self._row_height, 0
        pos = GridPos(h=height, w=width, x=self._x, y=self._y)
        self._x += width
        self._row_height = max(self._row_height, height)
        return pos

    def row(self, title: str) -> RowPanel:
        if self._x:
            self._x, self._y, self._row_height = 0, self._y + self._row_height, 0
        panel = RowPanel(title=title, gridPos=GridPos(h=1, w=WIDTH, x=0, y=self._y))
        self._y += 1
        return panel


def targets(*queries: tuple[str, str], instant: bool = False) -> list[Target]:
    """Targets from (expr, legend) pairs, with refIds A, B, ..."""
    return [
        Target(
            expr=expr,
            legendFormat=legend,
            refId=chr(ord("A") + i),
            datasource=DS,
            instant=instant,
            format="table" if instant else "time_series",
        )
        for i, (expr, legend) in enumerate(queries)
    ]


def threshold_steps(*limits: tuple[float, str]) -> list[dict[str, Any]]:
    """Grafana threshold steps: green base, then each (value, color)."""
    return [{"color": "green", "value": None}] + [{"color": c, "value": v} for v, c in limits]


def timeseries(
    layout: Layout,
    title: str,
    *queries: tuple[str, str],
    unit: str = "short",
    width: int = 12,
    height: int = 8,
    limits: Sequence[tuple[float, str]] = (),
    description: str = "",
    max_value: float | None = None,
) -> TimeSeries:
    return TimeSeries(
        title=title,
        description=description,
        dataSource=DS,
        targets=targets(*queries),
        gridPos=layout.place(width, height),
        unit=unit,
        valueMax=max_value,
        thresholds=threshold_steps(*limits) if limits else threshold_steps(),
        thresholdsStyleMode="line" if limits else "off",
        legendDisplayMode="table",
        legendPlacement="right",
        legendCalcs=["lastNotNull", "max"],
    )


def table(
    layout: Layout,
    title: str,
    *queries: tuple[str, str],
    width: int = 12,
    height: int = 8,
    description: str = "",
    columns: dict[str, str] | None = None,
    sort_by: str | None = None,
    overrides: list[dict[str, Any]] | None = None,
) -> Table:
    """Instant queries merged into one table; `columns` renames value columns
    (`Value #A` -> a name), `sort_by` sorts by a column, highest first."""
    transformations: list[dict[str, Any]] = [{"id": "merge", "options": {}}]
    if columns:
        transformations.append(
            {
                "id": "organize",
                "options": {"renameByName": columns, "excludeByName": {"Time": True}},
            }
        )
    if sort_by:
        transformations.append(
            {"id": "sortBy", "options": {"sort": [{"field": sort_by, "desc": True}]}}
        )
    return Table(
        title=title,
        description=description,
        dataSource=DS,
        targets=targets(*queries, instant=True),
        gridPos=layout.place(width, height),
        transformations=transformations,
        overrides=overrides or [],
        showHeader=True,
    )


def stat(
    layout: Layout,
    title: str,
    expr: str,
    *,
    width: int = 6,
    height: int = 4,
    limits: Sequence[tuple[float, str]] = (),
    unit: str = "none",
    description: str = "",
) -> Stat:
    return Stat(
        title=title,
        description=description,
        dataSource=DS,
        targets=targets((expr, "")),
        gridPos=layout.place(width, height),
        format=unit,
        reduceCalc="lastNotNull",
        thresholds=threshold_steps(*limits),
        graphMode="area",
    )


def variables(job: str, *, gpu: bool) -> Templating:
    """datasource, node (multi, all) and optionally gpu (multi, all) variables."""
    items = [
        Template(
            name="datasource",
            label="Data source",
            type="datasource",
            query="prometheus",
            default="Prometheus",
        ),
        Template(
            name="node",
            label="Node",
            dataSource=DS,
            type="query",
            query=f"label_values(fleetwatch_build_info{{{job}}}, node)",
            includeAll=True,
            multi=True,
            default="$__all",
            refresh=2,
            sort=1,
        ),
    ]
    if gpu:
        items.append(
            Template(
                name="gpu",
                label="GPU",
                dataSource=DS,
                type="query",
                query=f"label_values(fleetwatch_gpu_info{{{job}, {NODE}}}, gpu)",
                includeAll=True,
                multi=True,
                default="$__all",
                refresh=2,
                sort=3,
            )
        )
    return Templating(list=items)


def job_variables() -> Templating:
    """datasource, namespace and training_job (one job at a time) variables."""
    return Templating(
        list=[
            Template(
                name="datasource",
                label="Data source",
                type="datasource",
                query="prometheus",
                default="Prometheus",
            ),
            Template(
                name="namespace",
                label="Namespace",
                dataSource=DS,
                type="query",
                query=f"label_values({rules_definitions.JOB_INFO}, namespace)",
                refresh=2,
                sort=1,
            ),
            Template(
                name="training_job",
                label="Training job",
                dataSource=DS,
                type="query",
                query=(
                    f'label_values({rules_definitions.JOB_INFO}{{namespace="$namespace"}}, '
                    "training_job)"
                ),
                refresh=2,
                sort=1,
            ),
        ]
    )


def dashboard(
    uid: str,
    title: str,
    description: str,
    panels: list[Panel],
    templating: Templating,
    *,
    links: Sequence[DashboardLink] = (),
) -> Dashboard:
    return Dashboard(
        links=list(links),
        uid=uid,
        title=title,
        description=description,
        tags=["fleetwatch", "gpu"],
        panels=panels,
        templating=templating,
        timezone="utc",
        refresh="10s",
        time=Time("now-1h", "now"),
        editable=False,
    ).auto_panel_ids()


class Queries:
    """PromQL for the dashboards, built with the alert rules' own selectors and names."""

    def __init__(self, config: Any) -> None:
        self.job = config.exporter_selector
        self._q = rules_promql.Promql(config)
        params = rules_config.parameters(config)
        self.gpu_limit = float(params["thresholds.gpu_temperature_celsius"])
        self.memory_limit = float(params["thresholds.memory_temperature_celsius"])
        self.nvlink_rate = self._q.rate_name("node_gpu_link", "fleetwatch_nvlink_errors_total")
        self.ib_rate = self._q.rate_name(
            "node_device_port", "fleetwatch_infiniband_port_errors_total"
        )
        self.ib_data_rate = self._q.rate_name(
            "node_device_port", "fleetwatch_infiniband_port_data_bytes_total"
        )
        self.fabric_errors = rules_definitions.fabric_errors_record(config)

    def exporter(self, metric: str, *matchers: str) -> str:
        return str(self._q.exporter(metric, *matchers))

    def tainter(self, metric: str, *matchers: str) -> str:
        return str(self._q.tainter(metric, *matchers))


def fleet_overview(q: Queries) -> Dashboard:
    lay = Layout()
    temp = q.exporter("fleetwatch_gpu_temperature_celsius", 'sensor="gpu"', NODE)
    panels: list[Panel] = [
        lay.row("Work: tensor cores, not 'utilization'"),
        Heatmap(
            title="Tensor-core activity by node",
            description="Mean share of time any tensor pipe was active, per node (recorded "
            "as node:fleetwatch_gpu_tensor_active_ratio:avg).",
            dataSource=DS,
            dataFormat="tsbuckets",
            gridPos=lay.place(12, 9),
            targets=targets(
                ('node:fleetwatch_gpu_tensor_active_ratio:avg{node=~"$node"}', "{{node}}")
            ),
            yBucketBound="middle",
            hideZeroBuckets=False,
        ),
        timeseries(
            lay,
            "Fleet: tensor activity vs GPU utilization",
            ("fleet:fleetwatch_gpu_tensor_active_ratio:avg", "tensor-core activity"),
            ("fleet:fleetwatch_gpu_utilization_ratio:avg", "GPU utilization (NVML)"),
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
                f"{q.exporter('fleetwatch_gpu_xid_errors_total', NODE)}[$__rate_interval]))",
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
            (rules_definitions.JOB_TENSOR_MEDIAN, ""),
            (f"count by (namespace, training_job) ({rules_definitions.JOB_INFO})", ""),
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


def training_job(q: Queries) -> Dashboard:
    """One training job (namespace/training_job) across its nodes."""
    r = rules_definitions
    lay = Layout()
    on_job_nodes = f"and on (node) {r.JOB_INFO}{{{JOB_SEL}}}"
    gpu_temp = q.exporter("fleetwatch_gpu_temperature_celsius", 'sensor="gpu"')
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
            targets=targets((f"{r.JOB_TENSOR}{{{JOB_SEL}}}", "{{node}} GPU {{gpu}}")),
            yBucketBound="middle",
            hideZeroBuckets=False,
        ),
        timeseries(
            lay,
            "Job median tensor activity vs its last hour",
            (f"{r.JOB_TENSOR_MEDIAN}{{{JOB_SEL}}}", "median now"),
            (f"avg_over_time({r.JOB_TENSOR_MEDIAN}{{{JOB_SEL}}}[1h])", "average, last hour"),
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
            (f"{r.JOB_TENSOR}{{{JOB_SEL}}}", ""),
            (f"{r.JOB_SM_CLOCK}{{{JOB_SEL}}}", ""),
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
            (f"{r.JOB_SM_CLOCK}{{{JOB_SEL}}}", "{{node}} GPU {{gpu}}"),
            (f"{r.JOB_SM_CLOCK_MEDIAN}{{{JOB_SEL}}}", "job median"),
            unit="hertz",
        ),
        timeseries(
            lay,
            "GPU temperature against the limit",
            (
                f"{gpu_temp}\n* on (uuid) group_left ()\nmax by (uuid) ({r.JOB_INFO}{{{JOB_SEL}}})",
                "{{node}} GPU {{gpu}}",
            ),
            unit="celsius",
            limits=[(q.gpu_limit, "red")],
            description=f"The line is the {q.gpu_limit:g} °C taint threshold "
            "(rules/config.yaml); GPUOverheatingSoon warns on a trend towards it.",
        ),
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
        "errors and taints.",
        panels,
        job_variables(),
    )


def node_detail(q: Queries) -> Dashboard:
    lay = Layout()
    gpu_sel = (NODE, GPU)
    panels: list[Panel] = [
        lay.row("Temperatures and clocks"),
        timeseries(
            lay,
            "GPU temperature",
            (
                q.exporter("fleetwatch_gpu_temperature_celsius", 'sensor="gpu"', *gpu_sel),
                "{{node}} GPU {{gpu}}",
            ),
            unit="celsius",
            limits=[(q.gpu_limit, "red")],
            description=f"Core sensor; the line is the {q.gpu_limit:g} °C taint threshold.",
        ),
        timeseries(
            lay,
            "HBM temperature",
            (
                q.exporter("fleetwatch_gpu_temperature_celsius", 'sensor="memory"', *gpu_sel),
                "{{node}} GPU {{gpu}}",
            ),
            unit="celsius",
            limits=[(q.memory_limit, "orange")],
        ),
        timeseries(
            lay,
            "SM clock",
            (
                q.exporter("fleetwatch_gpu_clock_hertz", 'clock="sm"', *gpu_sel),
                "{{node}} GPU {{gpu}}",
            ),
            unit="hertz",
        ),
        timeseries(
            lay,
            "Clock-event reasons active",
            (
                q.exporter("fleetwatch_gpu_clock_event_active", *gpu_sel),
                "{{node}} GPU {{gpu}} {{reason}}",
            ),
            unit="bool",
            description="1 while a reason (thermal, power) slows the clocks.",
        ),
        lay.row("Power and work"),
        timeseries(
            lay,
            "Power draw and limit",
            (q.exporter("fleetwatch_gpu_power_watts", *gpu_sel), "{{node}} GPU {{gpu}}"),
            (
                q.exporter("fleetwatch_gpu_power_limit_watts", *gpu_sel),
                "{{node}} GPU {{gpu}} limit",
            ),
            unit="watt",
        ),
        timeseries(
            lay,
            "Tensor-core activity and utilization",
            (
                q.exporter("fleetwatch_gpu_tensor_active_ratio", 'pipe="any"', *gpu_sel),
                "{{node}} GPU {{gpu}} tensor",
            ),
            (
                q.exporter("fleetwatch_gpu_utilization_ratio", *gpu_sel),
                "{{node}} GPU {{gpu}} utilization",
            ),
            unit="percentunit",
            max_value=1,
        ),
        lay.row("Interconnect"),
        table(
            lay,
            "NVLink error matrix (per s, by GPU and link)",
            (f"sum by (node, gpu, link) ({q.nvlink_rate}{{{NODE}, {GPU}}})", ""),
            description="Sum of all NVLink error types per link over the rate window.",
        ),
        table(
            lay,
            "NVLinks down",
            (f"{q.exporter('fleetwatch_nvlink_up', *gpu_sel)} == 0", ""),
            description="Links whose state is not up (empty when all links are up).",
        ),
        table(
            lay,
            "InfiniBand ports and the GPUs they serve",
            (q.exporter("fleetwatch_infiniband_port_info", NODE), ""),
            (q.exporter("fleetwatch_infiniband_port_up", NODE), ""),
            (q.exporter("fleetwatch_infiniband_port_rate_bytes_per_second", NODE), ""),
            width=24,
            description="Each HCA port with its NUMA node and the GPUs under the same "
            "PCIe switch, its state and trained rate.",
        ),
    ]
    return dashboard(
        "fleetwatch-node",
        "fleetwatch / Node detail",
        "Per-GPU heat, clocks, power and the node's NVLink and InfiniBand links.",
        panels,
        variables(q.job, gpu=True),
    )


def fabric(q: Queries) -> Dashboard:
    lay = Layout()
    state_changes = q.exporter("fleetwatch_infiniband_port_state_changes_total", NODE)
    link_downed = q.exporter("fleetwatch_infiniband_port_errors_total", 'error="link_downed"', NODE)
    panels: list[Panel] = [
        lay.row("InfiniBand"),
        timeseries(
            lay,
            "InfiniBand error rate by port and type",
            (f"{q.ib_rate}{{{NODE}}}", "{{node}} {{device}}/{{port}} {{error}}"),
            width=24,
            description="Errors per second over the rate window.",
        ),
        timeseries(
            lay,
            "Link flaps (link_downed and state changes, last hour)",
            (f"increase({link_downed}[1h])", "{{node}} {{device}}/{{port}} link_downed"),
            (
                f"increase({state_changes}[1h])",
                "{{node}} {{device}}/{{port}} state changes",
            ),
        ),
        timeseries(
            lay,
            "Trained rate vs expected",
            (
                q.exporter("fleetwatch_infiniband_port_rate_bytes_per_second", NODE),
                "{{node}} {{device}}/{{port}}",
            ),
            (
                q.exporter("fleetwatch_infiniband_port_expected_rate_bytes_per_second", NODE),
                "{{node}} {{device}}/{{port}} expected",
            ),
            unit="Bps",
            description="A link below its expected rate is degraded.",
        ),
        table(
            lay,
            "Ports down",
            (f"{q.exporter('fleetwatch_infiniband_port_up', NODE)} == 0", ""),
            description="Ports not ACTIVE/LinkUp (empty when all are up).",
        ),
        table(
            lay,
            "Saturated counters",
            (f"{q.exporter('fleetwatch_infiniband_port_error_saturated', NODE)} == 1", ""),
            description="PMA counters pinned at their maximum: their rate reads 0.",
        ),
        timeseries(
            lay,
            "InfiniBand throughput",
            (f"{q.ib_data_rate}{{{NODE}}}", "{{node}} {{device}}/{{port}} {{direction}}"),
            unit="Bps",
            width=24,
        ),
        lay.row("NVLink"),
        timeseries(
            lay,
            "NVLink error rate by link and type",
            (f"{q.nvlink_rate}{{{NODE}}} > 0", "{{node}} GPU {{gpu}} link {{link}} {{error}}"),
            width=24,
            description="Links with errors in the rate window (per s).",
        ),
    ]
    return dashboard(
        "fleetwatch-fabric",
        "fleetwatch / Fabric",
        "InfiniBand and NVLink health: errors, flaps, degraded and saturated links.",
        panels,
        variables(q.job, gpu=False),
    )


def stack_health(q: Queries) -> Dashboard:
    lay = Layout()
    panels: list[Panel] = [
        lay.row("Exporter"),
        timeseries(
            lay,
            "Collectors up",
            (q.exporter("fleetwatch_collector_up", NODE), "{{node}} {{collector}}"),
            unit="bool",
        ),
        timeseries(
            lay,
            "Collector duration",
            (q.exporter("fleetwatch_collector_duration_seconds", NODE), "{{node}} {{collector}}"),
            unit="s",
        ),
        timeseries(
            lay,
            "Collector errors",
            (
                f"rate({q.exporter('fleetwatch_collector_errors_total', NODE)}[$__rate_interval])",
                "{{node}} {{collector}}",
            ),
        ),
        timeseries(
            lay,
            "Scrape duration",
            (q.exporter("scrape_duration_seconds", NODE), "{{node}} {{instance}}"),
            unit="s",
        ),
        lay.row("Tainter"),
        timeseries(
            lay,
            "Taint operations",
            (
                "sum by (op, result) (rate("
                f"{q.tainter('fleetwatch_tainter_taint_operations_total')}[$__rate_interval]))",
                "{{op}} {{result}}",
            ),
        ),
        timeseries(
            lay,
            "Webhook requests",
            (
                "sum by (result) (rate("
                f"{q.tainter('fleetwatch_tainter_webhook_requests_total')}[$__rate_interval]))",
                "{{result}}",
            ),
        ),
        stat(lay, "Tainted nodes", f"max({q.tainter('fleetwatch_tainter_tainted_nodes')})"),
        stat(
            lay,
            "Circuit breaker open",
            f"max({q.tainter('fleetwatch_tainter_breaker_open')})",
            limits=[(1, "red")],
        ),
    ]
    return dashboard(
        "fleetwatch-stack",
        "fleetwatch / Stack health",
        "The exporter's collectors and scrapes, and the taint controller.",
        panels,
        variables(q.job, gpu=False),
    )


def dashboards(config: Any | None = None) -> dict[str, Dashboard]:
    """Every dashboard by file stem, built from rules/config.yaml (or `config`)."""
    q = Queries(
        config if config is not None else rules_config.load_config(ROOT / rules_config.CONFIG_FILE)
    )
    return {
        "fleet-overview": fleet_overview(q),
        "training-job": training_job(q),
        "node-detail": node_detail(q),
        "fabric": fabric(q),
        "stack-health": stack_health(q),
    }


def to_json(board: Dashboard) -> str:
    return json.dumps(board.to_json_data(), cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"


def rendered_files(config: Any | None = None) -> dict[Path, str]:
    return {
        DASHBOARDS_DIR / f"{stem}.json": to_json(board)
        for stem, board in dashboards(config).items()
    }


def _walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _walk_panels(panel.get("panels", []))


def panel_queries(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of a dashboard's JSON."""
    return [
        (panel["title"], target["expr"])
        for panel in _walk_panels(data.get("panels", []))
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite dashboards/*.json, or with --check report which differ from the sources."""
    parser = argparse.ArgumentParser(description="Generate fleetwatch's Grafana dashboards.")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when a dashboard JSON is out of date",
    )
    args = parser.parse_args(argv)
    return int(
        rules_generate.sync_files(
            rendered_files(), check=args.check, command="dashboards/generate.py"
        )
    )


if __name__ == "__main__":
    sys.exit(main())
