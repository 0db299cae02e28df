"""Shared pieces of every fleetwatch dashboard: grid layout, panel builders, variables.

Each dashboard module lists its panels through these builders, so every panel reads the
`datasource` variable, lays itself out on Grafana's 24-column grid and shows thresholds
the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from grafanalib.core import (
    Dashboard,
    DashboardLink,
    GridPos,
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

from fleetwatch.catalog.exporter import BUILD_INFO
from fleetwatch.catalog.gpu import GPU_INFO

DS: Final = "${datasource}"
NODE: Final = 'node=~"$node"'
GPU: Final = 'gpu=~"$gpu"'
WIDTH: Final = 24


class Layout:
    """Places panels left to right in rows of 24 columns, so sources list panels only."""

    def __init__(self) -> None:
        self._x = 0
        self._y = 0
        self._row_height = 0

    def place(self, width: int, height: int) -> GridPos:
        """The next free spot of `width` x `height`, starting a new row when it does not fit."""
        if self._x + width > WIDTH:
            self._x, self._y, self._row_height = 0, self._y + self._row_height, 0
        pos = GridPos(h=height, w=width, x=self._x, y=self._y)
        self._x += width
        self._row_height = max(self._row_height, height)
        return pos

    def row(self, title: str) -> RowPanel:
        """A full-width row header below everything placed so far."""
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
    """A time series of (expr, legend) queries; `limits` draw threshold lines."""
    return TimeSeries(
        title=title,
        description=description,
        dataSource=DS,
        targets=targets(*queries),
        gridPos=layout.place(width, height),
        unit=unit,
        valueMax=max_value,
        thresholds=threshold_steps(*limits),
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
    """A single-value panel of `expr`, colored by `limits`."""
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


def datasource_variable() -> Template:
    """The `datasource` variable every panel reads: any Prometheus data source."""
    return Template(
        name="datasource",
        label="Data source",
        type="datasource",
        query="prometheus",
        default="Prometheus",
    )


def query_variable(
    name: str, label: str, query: str, *, sort: int = 1, every: bool = False
) -> Template:
    """A variable whose values a `label_values` query lists; `every` makes it multi-select,
    all values by default."""
    choice: dict[str, Any] = (
        {"includeAll": True, "multi": True, "default": "$__all"} if every else {}
    )
    return Template(
        name=name,
        label=label,
        dataSource=DS,
        type="query",
        query=query,
        refresh=2,
        sort=sort,
        **choice,
    )


def variables(job: str, *, gpu: bool) -> Templating:
    """datasource, node (multi, all) and optionally gpu (multi, all) variables."""
    items = [
        datasource_variable(),
        query_variable("node", "Node", f"label_values({BUILD_INFO}{{{job}}}, node)", every=True),
    ]
    if gpu:
        query = f"label_values({GPU_INFO}{{{job}, {NODE}}}, gpu)"
        items.append(query_variable("gpu", "GPU", query, sort=3, every=True))
    return Templating(list=items)


def dashboard(
    uid: str,
    title: str,
    description: str,
    panels: list[Panel],
    templating: Templating,
    *,
    links: Sequence[DashboardLink] = (),
) -> Dashboard:
    """A fleetwatch dashboard: common tags, UTC, 10 s refresh, last hour, read-only."""
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
