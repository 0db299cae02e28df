"""A simulated fleet's history as OpenMetrics text, with known anomalies injected.

The report's integration test and its benchmark both backfill this history into a real
Prometheus (`promtool tsdb create-blocks-from openmetrics`) and run the report on it, so
the report is checked against data whose every anomaly is known in advance. `Injected`
names what was planted; anything else the report flags is a false positive.

Node roles (0-based index; a fleet needs at least 6 nodes):
0 thermal outlier below the taint threshold (GPU 5 runs ~12 °C hotter than its peers),
  GPU 3 has Xid 79 but comes back, and port mlx5_2/1 goes down between scrapes (only its
  `link_downed` counter grows, no state change is seen);
1 idle allocated GPU 0 (a notebook pod), a flapping InfiniBand port mlx5_3/1, and the
  7-GPU job on GPUs 1-7 (no job label: the pod is the job) slows down in the last hour;
2 overheating GPU 2 above the threshold with thermal slowdown, GPUOverheating fires and the
  tainter taints then untaints the node;
3 GPU 6 is the straggler of the multi-node JobSet `llm` (nodes 0, 2, 3, 5): thermally
  throttled (lower SM clock, a thermal clock event) and so the busiest GPU of the job;
4 unallocated, GPU 7 has Xid 79 and falls off the bus; an A100-like node without GPM: its
  tensor activity comes from dcgm-exporter (`UUID`, `Hostname`, no `node` label);
5 saturated symbol_error counter on mlx5_1/1; GPU 3 idles in the `llm` job.
Nodes from 6 on are healthy members of 4-node batch Jobs. Pods carry their job's name in
kube-state-metrics' `kube_pod_labels` (`label_jobset_sigs_k8s_io_jobset_name`,
`label_batch_kubernetes_io_job_name`). Every series carries the scrape job a real store
gives it (the exporter's `job="fleetwatch"`, the tainter's, kube-state-metrics'), so the
shipped rules evaluate on this history as they do on a scraped one; dcgm-exporter's series
are labelled as dcgm-exporter labels them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

import numpy as np

from fleetwatch.catalog import ALL
from fleetwatch.catalog.allocation import GPU_ALLOCATION_INFO
from fleetwatch.catalog.gpu import (
    GPU_CLOCK_EVENT_ACTIVE,
    GPU_CLOCK_EVENT_SECONDS_TOTAL,
    GPU_CLOCK_HERTZ,
    GPU_ECC_ERRORS_TOTAL,
    GPU_POWER_WATTS,
    GPU_TEMPERATURE_CELSIUS,
    GPU_TENSOR_ACTIVE_RATIO,
    GPU_UTILIZATION_RATIO,
    GPUS_EXPECTED,
    GPUS_VISIBLE,
)
from fleetwatch.catalog.infiniband import (
    INFINIBAND_PORT_ERROR_SATURATED,
    INFINIBAND_PORT_ERRORS_TOTAL,
    INFINIBAND_PORT_RATE_BYTES_PER_SECOND,
    INFINIBAND_PORT_STATE_CHANGES_TOTAL,
    INFINIBAND_PORT_UP,
)
from fleetwatch.catalog.tainter import (
    TAINTER_BREAKER_OPEN,
    TAINTER_TAINT_OPERATIONS_TOTAL,
    TAINTER_TAINTED_NODES,
)
from fleetwatch.catalog.xid import GPU_XID_ERRORS_TOTAL

IB_RATE_BYTES = 400e9 / 8
PINNED_SYMBOL_ERRORS = 65535
SM_CLOCK_HZ = 1980e6
THROTTLED_SM_CLOCK_HZ = 1410e6
KSM = 'job="kube-state-metrics"'
EXPORTER = 'job="fleetwatch"'
"""The exporter's scrape job (rules/config.yaml's `selectors.exporter`)."""
DCGM_NODE = 4


@dataclass(frozen=True, kw_only=True)
class FleetSpec:
    """Size and time span of the simulated history; `end` is the last sample (epoch s)."""

    nodes: int = 6
    gpus_per_node: int = 8
    ib_ports_per_node: int = 8
    hours: float = 4.0
    step_seconds: int = 60
    end: int = 1_700_000_000
    seed: int = 7

    @property
    def start(self) -> int:
        """Timestamp of the first sample."""
        return self.end - int(self.hours * 3600) + self.step_seconds

    @property
    def timestamps(self) -> np.ndarray:
        """Every sample time, ascending."""
        return np.arange(self.start, self.end + 1, self.step_seconds, dtype=np.int64)


@dataclass(frozen=True)
class Injected:
    """What the simulation planted, by the keys the report's tables use."""

    hot_gpu: tuple[str, str]
    outlier_gpu: tuple[str, str]
    idle_allocated_gpu: tuple[str, str]
    straggler_gpu: tuple[str, str]
    straggler_job: tuple[str, str]
    idle_in_job_gpu: tuple[str, str]
    slowed_job: tuple[str, str]
    flapping_port: tuple[str, str, str]
    downed_port: tuple[str, str, str]
    saturated_port: tuple[str, str, str]
    xid79_gpu: tuple[str, str]
    xid79_returned_gpu: tuple[str, str]
    tainted_node: str
    hot_start: int
    hot_end: int
    flaps: int


def node_name(spec: FleetSpec, index: int) -> str:
    """`gpu-node-0003`: zero-padded so that names sort in index order."""
    return f"gpu-node-{index:04d}"


def uuid(node: int, gpu: int) -> str:
    """A stable, unique GPU UUID."""
    return f"GPU-{node:08x}-{gpu:04x}-4000-8000-000000000000"


def injected(spec: FleetSpec) -> Injected:
    """The anomalies `write_openmetrics` plants for `spec`."""
    if spec.nodes < 6 or spec.gpus_per_node < 8 or spec.ib_ports_per_node < 4:
        raise ValueError("a simulated fleet needs at least 6 nodes, 8 GPUs and 4 IB ports each")
    if spec.hours < 3:
        raise ValueError("a simulated fleet needs at least 3 hours of history")
    hot_start = spec.start + 3600 // spec.step_seconds * spec.step_seconds
    return Injected(
        hot_gpu=(node_name(spec, 2), "2"),
        outlier_gpu=(node_name(spec, 0), "5"),
        idle_allocated_gpu=(node_name(spec, 1), "0"),
        straggler_gpu=(node_name(spec, 3), "6"),
        straggler_job=("training", "llm"),
        idle_in_job_gpu=(node_name(spec, 5), "3"),
        slowed_job=("research", "bert-ft-0"),
        flapping_port=(node_name(spec, 1), "mlx5_3", "1"),
        downed_port=(node_name(spec, 0), "mlx5_2", "1"),
        saturated_port=(node_name(spec, 5), "mlx5_1", "1"),
        xid79_gpu=(node_name(spec, 4), "7"),
        xid79_returned_gpu=(node_name(spec, 0), "3"),
        tainted_node=node_name(spec, 2),
        hot_start=hot_start,
        hot_end=hot_start + 40 * 60,
        flaps=5,
    )


def allocation(spec: FleetSpec, node: int, gpu: int) -> tuple[str, str] | None:
    """(namespace, pod) holding the GPU, or None when it is not allocated."""
    if node == 4:
        return None
    if node == 1:
        return ("notebooks", "jupyter-alice") if gpu == 0 else ("research", "bert-ft-0")
    if node < 6:
        return "training", f"llm-workers-0-{[0, 2, 3, 5].index(node)}"
    return "training", f"job-{(node - 6) // 4}-worker-{(node - 6) % 4}"


def pod_labels(pod: str) -> str:
    """The job labels kube-state-metrics exports for a pod (allow-listed keys only)."""
    if pod.startswith("llm-workers-"):
        # JobSet pods also carry the Helm release: the JobSet name comes first.
        return (
            'label_jobset_sigs_k8s_io_jobset_name="llm",label_app_kubernetes_io_instance="llm-rel"'
        )
    if pod.startswith("job-"):
        return f'label_batch_kubernetes_io_job_name="{pod.rsplit("-worker-", 1)[0]}"'
    return ""


class _Writer:
    """Streams families to a text file, formatting one value matrix row at a time."""

    def __init__(self, *, out: TextIO, timestamps: np.ndarray) -> None:
        self._out = out
        self._timestamps = timestamps
        self._ts_text = [str(int(t)) for t in timestamps]

    def family(self, name: str, kind: str, rows: Iterator[tuple[str, np.ndarray]]) -> None:
        sample = f"{name}_total" if kind == "counter" else name
        self._out.write(f"# TYPE {name} {kind}\n")
        for labels, values in rows:
            prefix = f"{sample}{{{labels}}} "
            present = ~np.isnan(values)
            text = np.char.mod("%.6g", values[present])
            stamps = np.asarray(self._ts_text)[present]
            self._out.write(
                "".join(f"{prefix}{v} {t}\n" for v, t in zip(text, stamps, strict=True))
            )


Rows = Iterator[tuple[str, np.ndarray]]
"""A family's series: OpenMetrics label text (`node="x",gpu="0"`) and values (NaN: none)."""


def write_openmetrics(spec: FleetSpec, path: Path) -> Injected:
    """Write the fleet's whole history to `path` (OpenMetrics) and return what was injected."""
    plan = injected(spec)
    with path.open("w") as out:
        w = _Writer(out=out, timestamps=spec.timestamps)
        for name, kind, rows in _scraped(
            spec, plan, range(spec.nodes), np.random.default_rng(spec.seed)
        ):
            w.family(name, kind, rows)
        out.write("# EOF\n")
    return plan


def write_victoria_import(spec: FleetSpec, out: BinaryIO, *, chunk_nodes: int = 50) -> Injected:
    """Write the history as VictoriaMetrics `/api/v1/import` JSON lines, `chunk_nodes` nodes
    at a time, so a 10,000-node fleet streams in bounded memory.

    The first chunk draws its noise as `write_openmetrics` does, so a fleet of at most
    `chunk_nodes` nodes is the same history in both formats (the engines' comparison test
    relies on it); later chunks draw from their own seeds.
    """
    plan = injected(spec)
    for first in range(0, spec.nodes, chunk_nodes):
        nodes = range(first, min(spec.nodes, first + chunk_nodes))
        seed = spec.seed if first == 0 else (spec.seed, first)
        for name, kind, rows in _scraped(spec, plan, nodes, np.random.default_rng(seed)):
            sample = f"{name}_total" if kind == "counter" else name
            for labels, values in rows:
                out.write(_import_line(sample, labels, values, spec.timestamps))
    return plan


def _import_line(name: str, labels: str, values: np.ndarray, timestamps: np.ndarray) -> bytes:
    """One series as an import line: labels, values (`%.6g`, as OpenMetrics has them) and
    millisecond timestamps; NaN points are left out."""
    present = ~np.isnan(values)
    metric = re.sub(r'(\w+)="', r'"\1":"', labels)
    line = (
        f'{{"metric":{{"__name__":"{name}",{metric}}},'
        f'"values":[{",".join(np.char.mod("%.6g", values[present]))}],'
        f'"timestamps":[{",".join(map(str, (timestamps[present] * 1000).tolist()))}]}}\n'
    )
    return line.encode()


def _scraped(
    spec: FleetSpec, plan: Injected, nodes: range, rng: np.random.Generator
) -> Iterator[tuple[str, str, Rows]]:
    """`_families` as a store holds them: the exporter's families (the catalog's, those
    without a scrape job of their own, as the tainter's have) carry its scrape job."""
    exported = {metric.family_name for metric in ALL}
    for name, kind, rows in _families(spec, plan, nodes, rng):
        scraped = ((_with_job(labels), values) for labels, values in rows)
        yield name, kind, scraped if name in exported else rows


def _with_job(labels: str) -> str:
    """`labels` with the exporter's scrape job, unless they name a job already."""
    return labels if labels.startswith("job=") or ',job="' in labels else f"{EXPORTER},{labels}"


def _families(
    spec: FleetSpec, plan: Injected, nodes: range, rng: np.random.Generator
) -> Iterator[tuple[str, str, Rows]]:
    """Every family's series of `nodes` (fleet-wide series with the chunk of node 0), in
    the order `write_openmetrics` writes them: (name, OpenMetrics type, rows)."""
    ts = spec.timestamps
    steps = len(ts)
    n, g = len(nodes), spec.gpus_per_node
    at = {node: i for i, node in enumerate(nodes)}  # fleet index -> row in the matrices
    hot = (ts >= plan.hot_start) & (ts < plan.hot_end)
    xid_at = spec.start + (steps // 2) * spec.step_seconds
    gone = ts >= xid_at

    tensor = np.zeros((n, g, steps))
    util = np.zeros((n, g, steps))
    for node in nodes:
        for gpu in range(g):
            owner = allocation(spec, node, gpu)
            i = at[node]
            if owner is None:
                tensor[i, gpu] = np.abs(rng.normal(0.0, 0.003, steps))
            elif owner[0] == "notebooks":
                tensor[i, gpu] = np.abs(rng.normal(0.005, 0.003, steps))
                util[i, gpu] = np.clip(rng.normal(0.35, 0.05, steps), 0, 1)
            else:
                tensor[i, gpu] = np.clip(rng.normal(0.55, 0.03, steps), 0, 1)
                util[i, gpu] = np.clip(rng.normal(0.97, 0.01, steps), 0, 1)
    # The straggler: throttled, so the job waits for it and it is busy longest.
    if 3 in at:
        tensor[at[3], 6] = np.clip(rng.normal(0.58, 0.01, steps), 0, 1)
    if 5 in at:
        tensor[at[5], 3] = np.clip(rng.normal(0.15, 0.02, steps), 0, 1)
    if 1 in at:
        tensor[at[1], 1:, ts > spec.end - 3600] *= 0.45
    sm_clock = np.full((n, g, steps), SM_CLOCK_HZ) + rng.normal(0, 5e6, (n, g, steps))
    throttled = np.zeros((n, g, steps))
    if 3 in at:
        sm_clock[at[3], 6] = THROTTLED_SM_CLOCK_HZ
        throttled[at[3], 6] = 1.0
    power = np.clip(90 + 930 * tensor + rng.normal(0, 8, (n, g, steps)), 60, 700)
    temp = np.clip(35 + 0.045 * power + rng.normal(0, 1, (n, g, steps)), 25, 70)
    slowdown = np.zeros((n, g, steps))
    if 0 in at:
        temp[at[0], 5] = np.clip(temp[at[0], 5] + 12, 25, 76.5)
    if 2 in at:
        temp[at[2], 2, hot] = 84 + rng.normal(0, 0.5, int(hot.sum()))
        slowdown[at[2], 2] = np.cumsum(hot * spec.step_seconds)
    if 4 in at:
        for matrix in (tensor, util, power, temp, slowdown, sm_clock, throttled):
            matrix[at[4], 7, gone] = np.nan

    def gpu_rows(matrix: np.ndarray, extra: str = "", only: Iterable[int] = nodes) -> Rows:
        for node in only:
            for gpu in range(g):
                labels = f'node="{node_name(spec, node)}",gpu="{gpu}",uuid="{uuid(node, gpu)}"'
                yield labels + extra, matrix[at[node], gpu]

    def const(value: float) -> np.ndarray:
        return np.full(steps, value)

    yield GPU_TEMPERATURE_CELSIUS.name, "gauge", gpu_rows(temp, ',sensor="gpu"')
    yield GPU_POWER_WATTS.name, "gauge", gpu_rows(power)
    with_gpm = [node for node in nodes if node != DCGM_NODE]
    yield GPU_TENSOR_ACTIVE_RATIO.name, "gauge", gpu_rows(tensor, ',pipe="any"', with_gpm)
    if DCGM_NODE in at:
        yield "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", _dcgm_rows(spec, tensor[at[DCGM_NODE]])
    yield GPU_UTILIZATION_RATIO.name, "gauge", gpu_rows(util)
    yield GPU_CLOCK_HERTZ.name, "gauge", gpu_rows(sm_clock, ',clock="sm"')
    yield (
        GPU_CLOCK_EVENT_ACTIVE.name,
        "gauge",
        gpu_rows(throttled, ',reason="sw_thermal_slowdown"'),
    )
    yield (
        GPU_CLOCK_EVENT_SECONDS_TOTAL.family_name,
        "counter",
        gpu_rows(slowdown, ',reason="hw_thermal_slowdown"'),
    )
    zeros = np.where(np.isnan(temp), np.nan, 0.0)
    yield (
        GPU_ECC_ERRORS_TOTAL.family_name,
        "counter",
        (
            row
            for sev in ("corrected", "uncorrected")
            for row in gpu_rows(zeros, f',severity="{sev}"')
        ),
    )
    yield GPU_ALLOCATION_INFO.name, "gauge", _allocation_rows(spec, nodes, steps)
    yield "kube_pod_labels", "gauge", _pod_label_rows(spec, nodes, steps)
    count = np.full((n, steps), float(g))
    if 4 in at:
        count[at[4], gone] = g - 1
    yield (
        GPUS_VISIBLE.name,
        "gauge",
        ((f'node="{node_name(spec, node)}"', count[at[node]]) for node in nodes),
    )
    yield (
        GPUS_EXPECTED.name,
        "gauge",
        ((f'node="{node_name(spec, node)}"', const(g)) for node in nodes),
    )
    xid = np.where(gone, 1.0, np.nan)
    returned = np.where(ts >= spec.start + (steps // 4) * spec.step_seconds, 1.0, np.nan)
    xids = [
        (f'node="{node_name(spec, 4)}",gpu="7",uuid="{uuid(4, 7)}",xid="79"', xid),
        (f'node="{node_name(spec, 0)}",gpu="3",uuid="{uuid(0, 3)}",xid="79"', returned),
    ]
    if 0 in at:
        yield GPU_XID_ERRORS_TOTAL.family_name, "counter", iter(xids)
    yield from _infiniband(spec, plan, nodes, steps)
    if 0 in at:
        yield from _remediation(plan, ts)


def _allocation_rows(spec: FleetSpec, nodes: range, steps: int) -> Rows:
    for node in nodes:
        for gpu in range(spec.gpus_per_node):
            owner = allocation(spec, node, gpu)
            if owner is None:
                continue
            values = np.ones(steps)
            if node == 4 and gpu == 7:
                values[steps // 2 :] = np.nan
            yield (
                (
                    f'node="{node_name(spec, node)}",gpu="{gpu}",uuid="{uuid(node, gpu)}",'
                    f'namespace="{owner[0]}",pod="{owner[1]}",container="main"'
                ),
                values,
            )


def _dcgm_rows(spec: FleetSpec, tensor: np.ndarray) -> Rows:
    """dcgm-exporter's tensor activity of the node without GPM (`tensor`: its GPUs' rows),
    labelled as dcgm-exporter labels it."""
    for gpu in range(spec.gpus_per_node):
        labels = (
            f'gpu="{gpu}",UUID="{uuid(DCGM_NODE, gpu)}",Hostname="{node_name(spec, DCGM_NODE)}",'
            'modelName="NVIDIA A100-SXM4-80GB"'
        )
        yield labels, tensor[gpu]


def _pod_label_rows(spec: FleetSpec, nodes: range, steps: int) -> Rows:
    pods = sorted(
        {
            owner
            for node in nodes
            for gpu in range(spec.gpus_per_node)
            if (owner := allocation(spec, node, gpu)) is not None
        }
    )
    for namespace, pod in pods:
        labels = ",".join(
            part
            for part in (KSM, f'namespace="{namespace}"', f'pod="{pod}"', pod_labels(pod))
            if part
        )
        yield labels, np.ones(steps)


def _infiniband(
    spec: FleetSpec, plan: Injected, nodes: range, steps: int
) -> Iterator[tuple[str, str, Rows]]:
    ports = [(node, p) for node in nodes for p in range(spec.ib_ports_per_node)]

    def label(node: int, p: int) -> str:
        return f'node="{node_name(spec, node)}",device="mlx5_{p}",port="1"'

    up = {key: np.ones(steps) for key in ports}
    changes = {key: np.zeros(steps) for key in ports}
    downed = {key: np.zeros(steps) for key in ports}
    symbol = {key: np.zeros(steps) for key in ports}
    saturated = {key: np.zeros(steps) for key in ports}
    flap = (1, 3)
    for k in range(plan.flaps if flap in up else 0):
        at = steps // (plan.flaps + 1) * (k + 1)
        up[flap][at : at + 2] = 0
        changes[flap][at:] += 1
        changes[flap][at + 2 :] += 1
        downed[flap][at:] += 1
    # A link that drops and retrains between two scrapes: only link_downed sees it.
    blip = (0, 2)
    for k in range(3 if blip in up else 0):
        downed[blip][steps // 4 * (k + 1) :] += 1
    sat = (5, 1)
    pin_at = steps * 3 // 8
    climb = np.arange(steps) * (PINNED_SYMBOL_ERRORS / pin_at)
    if sat in up:
        symbol[sat] = np.floor(np.minimum(climb, PINNED_SYMBOL_ERRORS))
        saturated[sat][pin_at:] = 1
    yield INFINIBAND_PORT_UP.name, "gauge", ((label(*key), up[key]) for key in ports)
    yield (
        INFINIBAND_PORT_RATE_BYTES_PER_SECOND.name,
        "gauge",
        ((label(*key), np.full(steps, IB_RATE_BYTES)) for key in ports),
    )
    yield (
        INFINIBAND_PORT_STATE_CHANGES_TOTAL.family_name,
        "counter",
        ((label(*key), changes[key]) for key in ports),
    )
    yield (
        INFINIBAND_PORT_ERRORS_TOTAL.family_name,
        "counter",
        (
            row
            for key in ports
            for row in (
                (label(*key) + ',error="link_downed"', downed[key]),
                (label(*key) + ',error="symbol"', symbol[key]),
            )
        ),
    )
    yield (
        INFINIBAND_PORT_ERROR_SATURATED.name,
        "gauge",
        ((label(*key) + ',error="symbol"', saturated[key]) for key in ports),
    )


def _remediation(plan: Injected, ts: np.ndarray) -> Iterator[tuple[str, str, Rows]]:
    firing = (ts >= plan.hot_start) & (ts < plan.hot_end)
    alert = (
        f'alertname="GPUOverheating",alertstate="firing",fleetwatch_taint="gpu-overheat",'
        f'gpu="2",node="{plan.tainted_node}",severity="critical",uuid="{uuid(2, 2)}"'
    )
    yield "ALERTS", "gauge", iter([(alert, np.where(firing, 1.0, np.nan))])
    tainter = 'job="fleetwatch-tainter"'
    added = (ts >= plan.hot_start).astype(float)
    removed = (ts >= plan.hot_end).astype(float)
    yield (
        TAINTER_TAINT_OPERATIONS_TOTAL.family_name,
        "counter",
        iter(
            [
                (tainter + ',op="add",result="success"', added),
                (tainter + ',op="remove",result="success"', removed),
            ]
        ),
    )
    yield TAINTER_TAINTED_NODES.name, "gauge", iter([(tainter, firing.astype(float))])
    yield TAINTER_BREAKER_OPEN.name, "gauge", iter([(tainter, np.zeros(len(ts)))])
