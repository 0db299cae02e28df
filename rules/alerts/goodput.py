"""Goodput, live: every interruption of a training job as a recording rule, per job and per
node, and the node that keeps interrupting jobs (`NodeInterruptsJobs`), taken out with a
manual release.

What each record means, its labels and how to count it are in
`fleetwatch.rules.interruptions` (the report and the dashboards read the same names).
Thresholds are `thresholds.goodput.live_*` in rules/config.yaml, read here as
`p("goodput.<name>")`. Every rule here is of the global scope: a job spans nodes, and its
pods' facts come from kube-state-metrics.

Each kind's condition holds for `live_merge_window` after what it detects (a value that
changed since `live_merge_window` ago, a pod created within it), so one interruption is one
run of samples however many scrapes its facts are spread over, and the records are absent
between interruptions: a reader over weeks reads the interruptions, not every evaluation.
"""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.allocation import GPU_ALLOCATION_INFO
from fleetwatch.catalog.slurm import SLURM_JOB_RESTARTS, SLURM_NAMESPACE
from fleetwatch.rules.config import Config, Params
from fleetwatch.rules.contract import HARDWARE_INSPECTION, NeedsPrometheus
from fleetwatch.rules.definitions import (
    CHECKPOINT_JOB_BURST_RECORD,
    JOB_INFO,
    JOB_LABELS,
    JOB_TENSOR,
    JOB_TENSOR_MEDIAN,
    kube_state_metrics_label,
    pod_training_job,
)
from fleetwatch.rules.interruptions import (
    EVICTED_REASONS,
    JOB_GPUS_RECORD,
    JOB_INTERRUPTED_RECORD,
    JOB_INTERRUPTION_RECORD,
    JOB_NODE_GPUS_RECORD,
    JOB_PROGRESS_RECORD,
    JOB_TENSOR_MAX_RECORD,
    JOBSET_RESTART_ATTEMPT_LABEL,
    KIND_LABEL,
    NODE_INTERRUPTION_RECORD,
    NODE_LOST_REASON,
    POD_JOB_RECORD,
)
from fleetwatch.rules.promql import Alert, Promql, Record, Remediation, lookup, match

LEMON_REASON: Final = "lemon-node"
"""The taint reason of `NodeInterruptsJobs` (fleetwatch.io/lemon-node)."""
_POD: Final = "namespace, pod"
_NODE_JOB: Final = f"node, {JOB_LABELS}"


def _kinds(by_kind: dict[str, str]) -> str:
    """One record of every kind: each expression with label `kind` set to its kind, joined
    with `or` (one rule per record name: promtool refuses two rules that could write the
    same series)."""
    return "\nor\n".join(
        f'label_replace(\n{expr},\n"{KIND_LABEL}", "{kind}", "", ""\n)'
        for kind, expr in by_kind.items()
    )


class _Facts:
    """The PromQL of what kube-state-metrics and the exporter show about a job's pods and
    nodes, with the configured selectors and windows."""

    def __init__(self, config: Config, p: Params) -> None:
        self.q = Promql(config)
        self.merge = p("goodput.live_merge_window")
        self.grace = p("goodput.live_startup_grace")
        self.silence = p("goodput.live_node_silence")
        self.attempt = kube_state_metrics_label(JOBSET_RESTART_ATTEMPT_LABEL)

    def changed(self, metric: str, *matchers: str, test: str) -> str:
        """Series of kube-state-metrics' `metric` that pass `test` now but did not
        `live_merge_window` ago (or did not exist then)."""
        now = self.q.kube_state_metrics(metric, *matchers)
        return f"({now} {test})\nunless\n({now} offset {self.merge} {test})"

    def pod_reason(self, reasons: str) -> str:
        """Pods put off their node for one of `reasons` (regex) within the merge window."""
        return self.changed("kube_pod_status_reason", match("reason", "=~", reasons), test="== 1")

    def restarted(self) -> str:
        """Pods with a container restarted in place within the merge window."""
        restarts = self.q.kube_state_metrics("kube_pod_container_status_restarts_total")
        return f"({restarts} - {restarts} offset {self.merge}) > 0"

    def failed_nodes(self) -> str:
        """{node, namespace, training_job}: nodes of the job's pods in phase Failed within
        the merge window (a JobSet deletes the failed pod before it recreates the job's)."""
        merge = self.merge
        phase = self.q.kube_state_metrics("kube_pod_status_phase", match("phase", "=", "Failed"))
        info = self.q.kube_state_metrics("kube_pod_info", match("node", "!=", ""))
        return (
            f"group by ({_NODE_JOB}) (\n(last_over_time({phase}[{merge}]) == 1)\n"
            f"* on ({_POD}) group_left (training_job)\nlast_over_time({POD_JOB_RECORD}[{merge}])\n"
            f"* on ({_POD}) group_left (node)\n"
            f"topk by ({_POD}) (1, group by ({_POD}, node) (last_over_time({info}[{merge}])))\n)"
        )

    def recreated(self) -> str:
        """Pods that appeared within the merge window and carry no JobSet restart attempt (those
        are `jobset_restart`'s)."""
        created = self.q.kube_state_metrics("kube_pod_created")
        attempts = self.q.kube_state_metrics("kube_pod_labels", match(self.attempt, "!=", ""))
        return f"({created} unless {created} offset {self.merge})\nunless on ({_POD})\n{attempts}"

    def known(self) -> str:
        """Jobs that held GPUs at some time within `live_startup_grace` before the merge
        window: a job seen before, not one starting (nor one Prometheus just met)."""
        return (
            f"group by ({JOB_LABELS}) "
            f"(max_over_time({JOB_GPUS_RECORD}[{self.grace}] offset {self.merge}))"
        )

    def of_job(self, pods: str) -> str:
        """{namespace, training_job} of the jobs some of whose `pods` are listed."""
        return (
            f"group by ({JOB_LABELS}) (\n(\n{pods}\n)\n"
            f"* on ({_POD}) group_left (training_job)\n{POD_JOB_RECORD}\n)"
        )

    def on_node(self, pods: str) -> str:
        """{node, namespace, training_job} of `pods` on the node kube-state-metrics places
        them on (a pod without a node is left out)."""
        info = self.q.kube_state_metrics("kube_pod_info", match("node", "!=", ""))
        return (
            f"group by ({_NODE_JOB}) (\n(\n{pods}\n)\n"
            f"* on ({_POD}) group_left (training_job)\n{POD_JOB_RECORD}\n"
            f"* on ({_POD}) group_left (node)\n"
            f"topk by ({_POD}) (1, group by ({_POD}, node) ({info}))\n)"
        )

    def silent(self, namespace_matcher: str) -> str:
        """{node, namespace, training_job}: nodes that held GPUs of a job (namespace
        matching) within `live_node_silence` + the merge window and whose exporter has not
        been scraped successfully for `live_node_silence`."""
        held = (
            f"last_over_time({JOB_NODE_GPUS_RECORD}{{{namespace_matcher}}}"
            f"[{self.silence}])\n  or last_over_time({JOB_NODE_GPUS_RECORD}"
            f"{{{namespace_matcher}}}[{self.silence}] offset {self.merge})"
        )
        up = self.q.exporter("up")
        return (
            f"group by ({_NODE_JOB}) (\n  {held}\n)\n"
            f"unless on (node)\n(max by (node) (max_over_time({up}[{self.silence}])) == 1)"
        )

    def not_ready(self) -> str:
        """Nodes kube-state-metrics says are not Ready."""
        ready = self.q.kube_state_metrics(
            "kube_node_status_condition", match("condition", "=", "Ready"), 'status="true"'
        )
        return f"max by (node) ({ready}) == 0"


def records(config: Config, p: Params) -> list[Record]:
    """The interruption records (fleetwatch.rules.interruptions) in evaluation order: what
    the kinds read first, then each kind per job, the job's union, then per node."""
    f = _Facts(config, p)
    q = f.q
    allocated = q.exporter(GPU_ALLOCATION_INFO.name)
    pods = pod_training_job(
        config, q.kube_state_metrics, fallback=f"max by (namespace, pod) ({allocated})"
    )
    idle, busy = p("tensor_idle_ratio"), p("job_busy_ratio")
    window = p("goodput.live_restart_window")
    merge = f.merge
    restarts = q.exporter(SLURM_JOB_RESTARTS.name)
    up = q.exporter("up")
    requeued = (
        f"group by (job_id) (\n  (({restarts} > 0) unless on (node, job_id) "
        f"{restarts} offset {merge})\n  and on (node) (max by (node) ({up} offset {merge}) == 1)\n"
        f"  or\n  {restarts} > {restarts} offset {merge}\n)"
    )
    slurm_job = (
        f"group by ({JOB_LABELS}) (\n"
        f'label_replace(label_replace(\n{requeued},\n"training_job", "$1", "job_id", "(.+)"),\n'
        f'"namespace", "{SLURM_NAMESPACE}", "", "")\n)'
    )
    # At some evaluation within the merge window, every GPU of the job had been idle for
    # `live_restart_min`, and the job was training within `live_restart_window` before that
    # idle time began (so the idle time is a drop, not the job's start).
    idle_min = p("goodput.live_restart_min")
    dropped = (
        f"max_over_time((\n  max_over_time({JOB_TENSOR_MAX_RECORD}[{idle_min}]) < {idle}\n"
        f"  and on ({JOB_LABELS})\n"
        f"  max_over_time({JOB_TENSOR_MEDIAN}[{window}] offset {idle_min}) > {busy}\n"
        f")[{merge}:{config.evaluation_interval}])"
    )
    in_place = (
        f"group by ({JOB_LABELS}) (\n{JOB_TENSOR_MEDIAN} > {busy}\n"
        f"and on ({JOB_LABELS})\n{dropped}\n)\n"
        f"unless on ({JOB_LABELS})\n(max_over_time({CHECKPOINT_JOB_BURST_RECORD}[{window}]) == 1)\n"
        f"unless on ({JOB_LABELS})\n"
        f'max_over_time({JOB_INTERRUPTION_RECORD}{{{KIND_LABEL}!="in_place"}}[{window}])'
    )
    slurm, not_slurm = (
        match("namespace", "=", SLURM_NAMESPACE),
        match("namespace", "!=", SLURM_NAMESPACE),
    )
    lost_silent = f"(\n{f.silent(not_slurm)}\n)\nand on (node)\n({f.not_ready()})"
    attempts = q.kube_state_metrics("kube_pod_labels", match(f.attempt, "!=", ""))
    attempt_of = (
        f"group by ({JOB_LABELS}, {f.attempt}) (\n({{pods}})\n"
        f"* on ({_POD}) group_left (training_job)\n{{jobs}}\n)"
    )
    new_attempt = (
        attempt_of.format(pods=attempts, jobs=POD_JOB_RECORD)
        + f"\nunless on ({JOB_LABELS}, {f.attempt})\n"
        + attempt_of.format(
            pods=f"{attempts} offset {merge}", jobs=f"{POD_JOB_RECORD} offset {merge}"
        )
    )
    by_kind = {
        "node_fail": f"group by ({JOB_LABELS}) ({f.silent(slurm)})",
        "node_lost": (
            f"group by ({JOB_LABELS}) (\n{lost_silent}\n)\n"
            f"or\n{f.of_job(f.pod_reason(NODE_LOST_REASON))}"
        ),
        "evicted": f.of_job(f.pod_reason("|".join(EVICTED_REASONS))),
        "slurm_requeue": slurm_job,
        "jobset_restart": (
            f"group by ({JOB_LABELS}) (\n{new_attempt}\n)\nand on ({JOB_LABELS})\n{f.known()}"
        ),
        "pod_recreated": f"{f.of_job(f.recreated())}\nand on ({JOB_LABELS})\n{f.known()}",
        "container_restart": f.of_job(f.restarted()),
        "in_place": in_place,
    }
    failed_nodes = f.failed_nodes()
    by_node = {
        "node_fail": f.silent(slurm),
        "node_lost": f"{lost_silent}\nor\n{f.on_node(f.pod_reason(NODE_LOST_REASON))}",
        "evicted": f.on_node(f.pod_reason("|".join(EVICTED_REASONS))),
        "jobset_restart": (
            f"{failed_nodes}\nand on ({JOB_LABELS})\n"
            f'{JOB_INTERRUPTION_RECORD}{{{KIND_LABEL}="jobset_restart"}}'
        ),
        "pod_recreated": (
            f"{failed_nodes}\nand on ({JOB_LABELS})\n"
            f'{JOB_INTERRUPTION_RECORD}{{{KIND_LABEL}="pod_recreated"}}'
        ),
        "container_restart": f.on_node(f.restarted()),
    }
    return [
        Record(record=JOB_GPUS_RECORD, expr=f"count by ({JOB_LABELS}) ({JOB_INFO})"),
        Record(record=JOB_NODE_GPUS_RECORD, expr=f"count by ({_NODE_JOB}) ({JOB_INFO})"),
        Record(record=JOB_TENSOR_MAX_RECORD, expr=f"max by ({JOB_LABELS}) ({JOB_TENSOR})"),
        Record(record=JOB_PROGRESS_RECORD, expr=f"{JOB_TENSOR_MEDIAN} > bool {busy}"),
        Record(
            record=POD_JOB_RECORD,
            expr=(
                f"{pods}\nand on ({JOB_LABELS})\n(max_over_time({JOB_GPUS_RECORD}[{f.grace}]) > 0)"
            ),
        ),
        Record(record=JOB_INTERRUPTION_RECORD, expr=_kinds(by_kind)),
        Record(
            record=JOB_INTERRUPTED_RECORD,
            expr=f"group by ({JOB_LABELS}) ({JOB_INTERRUPTION_RECORD})",
        ),
        Record(record=NODE_INTERRUPTION_RECORD, expr=_kinds(by_node)),
    ]


def alerts(config: Config, p: Params) -> list[Alert]:
    """`NodeInterruptsJobs`: a node behind interruptions of several different training jobs
    within a day (a lemon: it passes every check and keeps failing jobs)."""
    window, jobs = p("goodput.live_lemon_window"), p("goodput.live_lemon_jobs")
    kinds = p("goodput.live_lemon_kinds")
    interrupted = (
        f"count by ({_NODE_JOB}) (\n  max_over_time({NODE_INTERRUPTION_RECORD}"
        f'{{{KIND_LABEL}=~"{kinds}"}}[{window}])\n)'
    )
    return [
        Alert(
            name="NodeInterruptsJobs",
            expr=f"count by (node) (\n{interrupted}\n) >= {jobs}",
            summary="Node {{ $labels.node }} interrupted {{ $value }} training jobs within "
            + window,
            description=(
                "Node {{ $labels.node }} was behind interruptions of {{ $value }} different "
                f"training jobs within {window} ({kinds}): "
                + lookup(
                    f"count by (namespace, training_job, kind) (max_over_time("
                    f"{NODE_INTERRUPTION_RECORD}{{node=%q}}[{window}]))",
                    "node",
                    then="{{ .Labels.namespace }}/{{ .Labels.training_job }} ({{ .Labels.kind }})",
                    sort="training_job",
                )
                + ". A node that keeps interrupting jobs while passing every check is a "
                "lemon: it is taken out until a person has inspected it."
            ),
            remediation=Remediation(
                reason=LEMON_REASON,
                manual="a lemon passes every check fleetwatch runs: only a person's inspection "
                "or repair says it is fit again",
                local=NeedsPrometheus(
                    why=f"interruptions of different jobs within {window} are in Prometheus' "
                    "history, not in one scrape of the node"
                ),
                # A lemon passes every check: what repairs it is a person's inspection.
                repair=HARDWARE_INSPECTION,
            ),
        ),
    ]
