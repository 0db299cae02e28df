"""The exporter's own families: the build, and each collector's health as the engine sees it.

Part of the metric catalog (`fleetwatch.catalog`): each family is declared here once and
imported by name wherever it is emitted or read."""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.spec import Families

FAMILIES: Final = Families()
"""Every family of this module, in declaration order (the order docs/metrics.md lists them)."""

BUILD_INFO: Final = FAMILIES.declare(
    "fleetwatch_build_info",
    "gauge",
    "fleetwatch build; value 1.",
    ("version", "python_version"),
    unit="info (1)",
    source="package metadata (the exporter's and the tainter's /metrics)",
    series="1",
)


COLLECTOR_UP: Final = FAMILIES.declare(
    "fleetwatch_collector_up",
    "gauge",
    "1 when the collector's last run succeeded within its deadline.",
    ("collector",),
    unit="0/1",
    source="engine: 1 when the last run succeeded within its deadline",
    series="C",
)


COLLECTOR_DURATION_SECONDS: Final = FAMILIES.declare(
    "fleetwatch_collector_duration_seconds",
    "gauge",
    "Wall time of the collector's last completed run.",
    ("collector",),
    unit="seconds",
    source="engine: wall time of the last completed run",
    series="C",
)


COLLECTOR_LAST_SUCCESS_TIMESTAMP_SECONDS: Final = FAMILIES.declare(
    "fleetwatch_collector_last_success_timestamp_seconds",
    "gauge",
    "Unix time at which the collector's last successful run ended.",
    ("collector",),
    unit="seconds (Unix time)",
    source="engine: end of the last successful run",
    series="C",
)


COLLECTOR_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_collector_errors_total",
    "counter",
    "Collector runs that raised or missed their deadline.",
    ("collector",),
    unit="runs",
    source="engine: runs that raised or missed their deadline",
    series="C",
)


COLLECTOR_HUNG: Final = FAMILIES.declare(
    "fleetwatch_collector_hung",
    "gauge",
    (
        "1 while a collector run has been blocked longer than --collector.hang-timeout (the "
        "liveness probe fails then)."
    ),
    ("collector",),
    unit="0/1",
    source=(
        "engine: 1 while a run has been blocked longer than "
        "`--collector.hang-timeout`, exactly when `/healthz` fails for it"
    ),
    series="C",
)


COLLECTOR_SKIPPED_RUNS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_collector_skipped_runs_total",
    "counter",
    "Runs not started because the collector's previous run was still blocked.",
    ("collector",),
    unit="runs",
    source="engine: runs not started because the previous one was still in flight",
    series="C",
)


WEB_CONFIG_RELOAD_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_web_config_reload_errors_total",
    "counter",
    (
        "Changes of --web.config.file or of a certificate, key or CA file it names that did "
        "not load; the last good configuration keeps serving."
    ),
    (),
    unit="reloads",
    source=(
        "the listener's web config watch (the exporter's and the tainter's /metrics, with "
        "`--web.config.file`)"
    ),
    series="1",
)


WEB_CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS: Final = FAMILIES.declare(
    "fleetwatch_web_config_last_reload_success_timestamp_seconds",
    "gauge",
    "When --web.config.file and the files it names last loaded (at start, then each change).",
    (),
    unit="seconds (Unix time)",
    source=(
        "the listener's web config watch (the exporter's and the tainter's /metrics, with "
        "`--web.config.file`)"
    ),
    series="1",
)
