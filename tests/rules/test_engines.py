"""The shipped rules on two engines, side by side: Prometheus and VictoriaMetrics + vmalert.

Both scrape the same simulated exporter (the demo story, its faults moved earlier) at the
shipped scrape interval and evaluate the same generated rules at the shipped evaluation
interval, `for` durations capped so the story fits in about a minute. An alert on a count
of events must fire on the count that happened, not on one engine's extrapolation, so the
same alerts, with the same labels, must fire on both.

vmalert is Debian's 1.79, which predates `keep_firing_for`: its copy of the rules has that
field stripped. The alerts are compared as the set that fired at any time during the story,
so the shorter hold changes nothing here.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetwatch.durations import format_duration
from fleetwatch.durations import parse_duration as duration
from fleetwatch.rules.config import load_config
from fleetwatch.rules.groups import alert_groups, dump_groups, recording_groups
from fleetwatch.sim.servers import (
    Server,
    alertmanager,
    fleetwatch_export,
    prom_alerts,
    prometheus,
    wait_until,
)
from testbed.victoria import (
    VICTORIA_METRICS,
    VMAGENT,
    VMALERT,
    rules_for_vmalert,
    victoria_metrics,
    vmagent,
    vmalert,
    vmalert_alerts,
    vmalert_check,
    vmalert_reads_keep_firing_for,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not all(Path(p).exists() for p in (VICTORIA_METRICS, VMAGENT, VMALERT)),
        reason="Debian's victoria-metrics is not installed (./dev.sh test installs it)",
    ),
]

NODE = "engines-node"
MAX_FOR = 10.0
# The demo story starts its faults from 20 s to 150 s. Here each starts (and ramps) four
# times sooner, keeping their order and overlaps, except the NVML hang: it blinds the GPU
# collector for two minutes, so it comes once the GPU alerts have had their chance:
# GPUThermalSlowdown needs the throttling (from 17 s) to fill `clock_event_fraction` of
# `clock_event_window` (30 s of 5 m), then its capped `for`. In an exporter's first
# `clock_event_window`, vmalert's rate() divides by the time the series has existed and
# Prometheus' by the window, so vmalert fires it sooner; both fire it.
TIME_SCALE = 4
HANG_AT = 80
# Fired on both engines by the story (InfiniBandLinkFlapping is not one: one down/up
# cycle of a port is not a flap, see below).
STORY_ALERTS = {
    "FleetwatchCollectorFailing",
    "GPUFallenOffBus",
    "GPUMemoryOverheating",
    "GPUOverheating",
    "GPUThermalSlowdown",
    "InfiniBandErrorCountHigh",
    "InfiniBandErrorRateHigh",
    "InfiniBandPortDown",
    "NVLinkErrorsRising",
}
# An alert as both engines label it: its full label set.
Key = frozenset[tuple[str, str]]


def _story() -> dict[str, Any]:
    """The shipped demo scenario, its faults sooner (TIME_SCALE, HANG_AT)."""
    demo = importlib.resources.files("fleetwatch.sim.scenarios") / "demo.yaml"
    scenario: dict[str, Any] = yaml.safe_load(demo.read_text())
    for fault in scenario["faults"]:
        fault["at"] = HANG_AT if fault["kind"] == "hang" else fault["at"] // TIME_SCALE
        if "ramp_seconds" in fault:
            fault["ramp_seconds"] = fault["ramp_seconds"] // TIME_SCALE
    return scenario


def _cap_for(name: str, default: str) -> str:
    """Every `for` at most MAX_FOR; thresholds and holds stay as shipped."""
    if name.endswith(".for"):
        return format_duration(min(duration(default), MAX_FOR))
    return default


def _flap_settled(scenario: dict[str, Any], config: Any) -> float:
    """Seconds after the exporter starts by which an alert on the port's down/up count has
    had its chance: the port is back up, its samples scraped, and a rule evaluated them,
    twice each for slack."""
    (down,) = (f for f in scenario["faults"] if f["kind"] == "ib_port_down")
    interval = duration(config.scrape_interval) + duration(config.evaluation_interval)
    return float(down["at"] + down["seconds"]) + 2 * interval


@dataclass
class Seen:
    """Every alert each engine held firing at any poll during the story: comparing what
    fired at any time makes the holds vmalert 1.79 lacks (keep_firing_for) irrelevant."""

    prometheus: set[Key] = field(default_factory=set)
    vmalert: set[Key] = field(default_factory=set)


def _firing(alerts: list[dict[str, Any]]) -> set[Key]:
    return {frozenset(a["labels"].items()) for a in alerts if a["state"] == "firing"}


def _names(keys: set[Key]) -> set[str]:
    return {dict(key)["alertname"] for key in keys}


def _scrape(exporter: Server) -> list[dict[str, Any]]:
    target = exporter.url.removeprefix("http://")
    return [
        {
            "job_name": "fleetwatch",
            "static_configs": [{"targets": [target], "labels": {"node": NODE}}],
        }
    ]


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seen]:
    """Both engines on one exporter running the story, watched until every story alert
    fired on both and the port's flap had its chance."""
    workdir = tmp_path_factory.mktemp("engines")
    config = load_config()
    rule_files = [workdir / "alerts.yaml", workdir / "recording.yaml"]
    rule_files[0].write_text(dump_groups(alert_groups(config, _cap_for)))
    rule_files[1].write_text(dump_groups(recording_groups(config)))
    scenario = _story()
    (workdir / "story.yaml").write_text(yaml.safe_dump(scenario))
    intervals = {
        "scrape_interval": config.scrape_interval,
        "evaluation_interval": config.evaluation_interval,
    }
    with contextlib.ExitStack() as stack:
        exporter = stack.enter_context(
            fleetwatch_export(
                workdir / "exporter",
                simulate=str(workdir / "story.yaml"),
                args=["--collector.interval=1s"],
            )
        )
        started = time.monotonic()
        prom = stack.enter_context(
            prometheus(
                workdir / "prometheus",
                scrape_configs=_scrape(exporter),
                rule_files=rule_files,
                scrape_interval=intervals["scrape_interval"],
                evaluation_interval=intervals["evaluation_interval"],
            )
        )
        vm = stack.enter_context(victoria_metrics(workdir / "victoria-metrics"))
        stack.enter_context(
            vmagent(
                workdir / "vmagent",
                scrape_configs=_scrape(exporter),
                remote_write_url=vm.url,
                scrape_interval=config.scrape_interval,
            )
        )
        am = stack.enter_context(
            alertmanager(
                workdir / "alertmanager",
                config={"route": {"receiver": "nobody"}, "receivers": [{"name": "nobody"}]},
            )
        )
        ruler = stack.enter_context(
            vmalert(
                workdir / "vmalert",
                rule_files=[rules_for_vmalert(p, workdir / "vmalert-rules") for p in rule_files],
                datasource_url=vm.url,
                notifier_urls=[am.url],
                remote_write_url=vm.url,
                remote_read_url=vm.url,
                evaluation_interval=config.evaluation_interval,
            )
        )
        seen = Seen()
        settled = started + _flap_settled(scenario, config)

        def story_told() -> bool:
            seen.prometheus |= _firing(prom_alerts(prom))
            seen.vmalert |= _firing(vmalert_alerts(ruler))
            return (
                time.monotonic() > settled
                and _names(seen.prometheus) >= STORY_ALERTS
                and _names(seen.vmalert) >= STORY_ALERTS
            )

        try:
            wait_until(story_told, timeout=120, what="the story's alerts on both engines")
        finally:
            print(
                f"\nafter {time.monotonic() - started:.0f} s"
                f"\nPrometheus fired: {sorted(_names(seen.prometheus))}"
                f"\nvmalert fired:    {sorted(_names(seen.vmalert))}"
            )
        yield seen


def test_shipped_rules_load_in_vmalert(tmp_path: Path) -> None:
    shipped = importlib.resources.files("fleetwatch.rules")
    paths = []
    for name in ("fleetwatch.rules.yaml", "fleetwatch.recording.yaml", "fleetwatch.global.yaml"):
        path = tmp_path / name
        path.write_text(shipped.joinpath(name).read_text())
        paths.append(rules_for_vmalert(path, tmp_path / "vmalert"))
    result = vmalert_check(paths)
    assert result.returncode == 0, result.stderr
    if not vmalert_reads_keep_firing_for():
        refused = vmalert_check([tmp_path / "fleetwatch.rules.yaml"])
        assert "unknown fields in rule: keep_firing_for" in refused.stderr


def test_the_story_fires_on_both_engines(seen: Seen) -> None:
    assert _names(seen.prometheus) >= STORY_ALERTS
    assert _names(seen.vmalert) >= STORY_ALERTS


def test_both_engines_fire_the_same_alerts(seen: Seen) -> None:
    only_prometheus = seen.prometheus - seen.vmalert
    only_vmalert = seen.vmalert - seen.prometheus
    assert (only_prometheus, only_vmalert) == (set(), set())
