"""What a report query is: the `Query` type, the `Window` it reads, its shapes and keys.

Aggregation that Prometheus does well (quantiles over time, increases, time spent in a
state at `--step` resolution) is pushed into PromQL, so a 1,000-node day arrives as a
few hundred thousand points instead of tens of millions. Three query shapes:

- `summary`: one value per series over the whole window (evaluated once, at `until`);
- `bucketed`: one value per series per `--bucket` (e.g. hourly mean tensor activity);
- `timeline`: a few low-cardinality series at full `--step` (alerts, tainter state).

Per-GPU and per-port queries ask for one value per series over the window (or per
bucket) and finding queries keep only the rows above zero (`> 0`), so what crosses the
network grows with the nodes and the findings, not with raw samples. Each expression
takes a `Window`, whose `nodes` regex scopes it to one node batch
(`fleetwatch.report.windowed_promql`). The queries themselves are one module per report
area, gathered in `fleetwatch.report.query_table`; running them is
`fleetwatch.report.dataset`.

Where a recording rule's series answers a query (`Query.recorded`: tensor activity per
GPU, `fleetwatch:gpu_tensor_active:ratio`), the query reads it when the store holds it
over the window, and falls back to its raw expression when it does not (a store without
the rules, such as a long-term store fed raw series only, or rules deployed within the
window): `coverage` is the one cheap query that tells which.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from fleetwatch.rules.config import ModelPolicy

AREAS = ("thermal", "training", "fabric", "reliability", "remediation", "checkpoints", "goodput")
"""The report's areas, each one module of queries (`fleetwatch.report.query_table`), in the
order of its sections; `fleetwatch report --report.section` runs only those named."""

Shape = Literal["summary", "bucketed", "timeline"]
"""How a query is evaluated over the window (see the module's docstring)."""

# The label columns a query yields, by what it describes.
GPU = ("node", "gpu", "uuid")
PORT = ("node", "device", "port")
MOUNT = ("node", "mountpoint")
JOB = ("namespace", "training_job")
POD_JOB = ("namespace", "pod", "training_job")
DOMAIN = ("cluster_uuid", "clique_id")


@dataclass(frozen=True, kw_only=True)
class Window:
    """The time range analysed and the resolutions used (all in seconds)."""

    start: float
    end: float
    step: float
    bucket: float
    threshold_celsius: float
    """The overheat policy's default (`thresholds.gpu_temperature_celsius`, or the report's
    --thermal.threshold-celsius)."""
    overheat_policy: tuple[ModelPolicy, ...] = ()
    """The models judged by a policy of their own (`thresholds.overheat_policy`)."""
    selector: str = ""
    nodes: str = ""
    """A regex of the nodes of one batch (empty: every node the selector matches)."""

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """A recording rule's series that answer a query: `record`, the rule's name (from
    `fleetwatch.rules.definitions`), and `build`, the query over it, which yields what the
    query's raw expression yields (the same keys, the value the rule computes the same way)
    while the store reads one series a key instead of evaluating the rule's expression."""

    record: str
    build: Callable[[Window], str]
    covers: Callable[[Window], tuple[str, str]] | None = None
    """(recorded, raw): the keys each form holds over the window's last `bucket`, for
    `coverage`, where `build` and the raw expression hold nothing between changes (a
    transitions query); None: `build` and the raw expression themselves."""


@dataclass(frozen=True, kw_only=True)
class Query:
    """One PromQL query: the metrics it needs and the label columns it yields.

    `required` metrics missing from the window mean a collector is off; `optional` ones
    are counters that only exist once something happened (an Xid, a taint); of `any_of`
    (two sources of one value) one is enough.
    """

    name: str
    shape: Shape
    keys: tuple[str, ...]
    required: tuple[str, ...]
    build: Callable[[Window], str]
    optional: tuple[str, ...] = ()
    scoped: bool = True
    any_of: Callable[[], tuple[str, ...]] | None = None
    """Metrics that stand in for each other: at least one must have samples."""
    batched: bool = True
    """Read in node batches; False for queries that compare across the fleet or carry no
    node label (their answers hold findings only, or a handful of series)."""
    recorded: Recorded | None = None
    """The recorded series that answer this query where the store holds them."""


COVERAGE_LOOKBACK_SECONDS = 300.0
"""How far back `coverage` looks for a series' latest sample (Prometheus' lookback)."""


def coverage(window: Window, query: Query) -> str:
    """Whether `query`'s recorded series answer for every key its raw expression does:
    1 where the recorded form yields at least as many series as the raw one over the last
    `COVERAGE_LOOKBACK_SECONDS` (a store holding the recorded series only counts too),
    nothing where it yields fewer (rules that ran on only part of the fleet, or not then).
    Asked at the start of the window and at its end, it tells whether the store holds them
    over the whole window. Whole fleet, one lookback of samples a series: cheap."""
    if query.recorded is None:
        raise ValueError(f"query {query.name} has no recorded form")
    recent = dataclasses.replace(window, bucket=COVERAGE_LOOKBACK_SECONDS, nodes="")
    covers = query.recorded.covers
    recorded, raw = (
        (query.recorded.build(recent), query.build(recent)) if covers is None else covers(recent)
    )
    return f"count({recorded}) >= bool (count({raw}) or vector(0))"
