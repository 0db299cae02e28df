"""The demo's stack watches itself as a deployment would: no fleetwatch self-health alert goes
pending while every component it started is up, and the report over its window computes
every section.

One stack per module runs the demo's plan on the `demo` scenario (Prometheus evaluating
every second instead of every 5 s) until its story has the node tainted. An alert is checked
for going pending, not firing, so its `for` need not pass: a missing scrape job shows on
the first evaluation. The last test stops the tainter and sees FleetwatchTainterDown go
pending, so the quiet before it is the stack's health, not a rule that cannot fire.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetwatch.cli import main
from fleetwatch.demo import demo_plan
from fleetwatch.report.dataset import load_snapshot
from fleetwatch.rules.config import load_config
from fleetwatch.sim.servers import (
    ALERTMANAGER,
    PROMETHEUS,
    http_get,
    prom_alerts,
    require_binary,
    wait_until,
)
from fleetwatch.sim.stack import Stack, start_stack

pytestmark = pytest.mark.integration

# The alerts saying a component is not there or not working; the demo's story faults
# (an NVML call that hangs, a GPU that overheats) may rightly raise the others
# (FleetwatchCollectorFailing, the taint alerts).
SELF_HEALTH = (
    "FleetwatchExporterDown",
    "FleetwatchExporterAbsent",
    "FleetwatchTainterDown",
    "FleetwatchTainterWebhookFailing",
)


@dataclasses.dataclass
class Demo:
    stack: Stack
    started: float
    seen: set[str]  # self-health alerts seen pending or firing while the story ran


def _targets(stack: Stack) -> dict[str, str]:
    """The health of each scrape target, by job."""
    assert stack.prometheus is not None
    body = json.loads(http_get(f"{stack.prometheus.url}/api/v1/targets"))
    return {t["labels"]["job"]: t["health"] for t in body["data"]["activeTargets"]}


def _evaluated_since(stack: Stack, since: float) -> bool:
    """Whether every rule group holding a self-health alert has been evaluated after
    `since` (epoch seconds)."""
    assert stack.prometheus is not None
    body = json.loads(http_get(f"{stack.prometheus.url}/api/v1/rules"))
    # lastEvaluation is RFC 3339 in UTC; whole seconds are precise enough here.
    evaluated = [
        datetime.fromisoformat(group["lastEvaluation"][:19]).replace(tzinfo=UTC).timestamp()
        for group in body["data"]["groups"]
        if any(rule["name"] in SELF_HEALTH for rule in group["rules"])
    ]
    return bool(evaluated) and min(evaluated) > since


def _self_health(stack: Stack) -> set[str]:
    assert stack.prometheus is not None
    return {a["labels"]["alertname"] for a in prom_alerts(stack.prometheus)} & set(SELF_HEALTH)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    require_binary(PROMETHEUS)
    require_binary(ALERTMANAGER)
    plan = dataclasses.replace(demo_plan("demo"), interval="1s", ports={})
    assert plan.with_tainter, "the test needs the tainter's extra installed"
    with contextlib.ExitStack() as servers:
        stack = start_stack(tmp_path_factory.mktemp("demo"), servers, plan)
        started = time.time()
        # Until every target is scraped and every group evaluated since, absent(up) is
        # rightly pending: watch from then.
        wait_until(
            lambda: set(_targets(stack).values()) == {"up"},
            timeout=30,
            what="a first scrape of every target",
        )
        scraped = time.time() + 1
        wait_until(lambda: _evaluated_since(stack, scraped), timeout=30, what="a rule evaluation")
        seen: set[str] = set()

        def tainted_a_while() -> bool:
            """Whether GPU 3's overheat taint has stood for 10 s, noting any self-health
            alert on the way."""
            seen.update(_self_health(stack))
            if "fleetwatch.io/gpu-overheat" not in stack.taint_keys():
                tainted_since.clear()
                return False
            tainted_since.setdefault("at", time.monotonic())
            return time.monotonic() - tainted_since["at"] > 10

        tainted_since: dict[str, float] = {}
        wait_until(tainted_a_while, timeout=180, what="the demo's overheat taint", interval=1)
        yield Demo(stack=stack, started=started, seen=seen)


def test_no_self_health_alert_while_every_component_is_up(demo: Demo) -> None:
    assert demo.seen == set()
    assert _self_health(demo.stack) == set()


def test_every_component_is_scraped_under_its_rules_job(demo: Demo) -> None:
    assert _targets(demo.stack) == dict.fromkeys(load_config().scrape_jobs().values(), "up")


def test_the_report_over_the_demo_computes_every_section(demo: Demo, tmp_path: Path) -> None:
    assert demo.stack.prometheus is not None
    # The report's shortest window is a minute: round the story's length up to whole ones.
    since = (int(time.time() - demo.started) // 60 + 1) * 60
    status = main(
        [
            "report",
            f"--prometheus.url={demo.stack.prometheus.url}",
            f"--since={since}s",
            "--step=5s",
            "--bucket=1m",
            f"--out={tmp_path / 'out'}",
            f"--snapshot.save={tmp_path / 'snapshot'}",
            "--log.format=text",
        ]
    )
    assert status == 0
    dataset = load_snapshot(tmp_path / "snapshot")
    assert dataset.problems == {}
    assert dataset.missing == {}
    operations = dataset.frame("taint_operations")
    assert operations is not None
    assert len(operations) > 0


def test_stopping_the_tainter_raises_tainter_down(demo: Demo) -> None:
    """Last in the module: the stack runs on without its tainter."""
    assert demo.stack.tainter is not None
    demo.stack.tainter.stop()
    wait_until(
        lambda: "FleetwatchTainterDown" in _self_health(demo.stack),
        timeout=30,
        what="FleetwatchTainterDown pending once the tainter stopped",
    )
