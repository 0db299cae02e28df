"""The live lemon rule end to end on a real kube-apiserver (`testbed.lemon_stack`): real
Prometheus evaluating the shipped rules with the live windows shortened by a rules-config
override, real Alertmanager with the shipped route, `fleetwatch taint` on the real server.

Node gpu-0 is behind interruptions of two different jobs (a and b) within the lemon window:
it gets the `lemon-node` taint, the alert names both jobs, and the taint stays once the
alert resolves (a manual release) until `fleetwatch untaint`. gpu-1 interrupted one job
once, gpu-2 the same job twice: both are untouched.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator

import pytest

from fleetwatch.cli import main
from fleetwatch.rules.alerts.goodput import LEMON_REASON
from fleetwatch.rules.interruptions import NODE_INTERRUPTION_RECORD, POD_JOB_RECORD
from fleetwatch.sim.loopback_servers import http_get, wait_until
from fleetwatch.tainter.payload import taint_key
from testbed.kube_apiserver import ADMIN, ApiServer
from testbed.lemon_stack import LEMON_WINDOW_SECONDS, MERGE_WINDOW, LemonStack, lemon_stack
from testbed.tool_servers import prom_query
from tests.tainter.realkube import RealCluster

pytestmark = pytest.mark.integration

LEMON, ONCE, SAME_JOB_TWICE = "gpu-0", "gpu-1", "gpu-2"
ALERT = "NodeInterruptsJobs"
RESTARTS = "kube_pod_container_status_restarts_total"
KEY = taint_key(LEMON_REASON)


@pytest.fixture(scope="module")
def stack(api_server: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LemonStack]:
    RealCluster(api_server).reset(nodes=3)
    with lemon_stack(
        tmp_path_factory.mktemp("lemon-kube"),
        nodes=(LEMON, ONCE, SAME_JOB_TWICE),
        tainter_args=(f"--kubeconfig={api_server.kubeconfig(ADMIN)}",),
    ) as stack:
        yield stack


def behind(stack: LemonStack, node: str) -> set[str]:
    """The jobs `node` is behind an interruption of, as the rules record it now."""
    rows = prom_query(stack.prometheus, f'{NODE_INTERRUPTION_RECORD}{{node="{node}"}}')
    return {r["metric"]["training_job"] for r in rows}


def lemon_alerts(stack: LemonStack) -> dict[str, dict[str, str]]:
    """NodeInterruptsJobs as Alertmanager holds it, by node: its annotations."""
    assert stack.alertmanager is not None
    query = urllib.parse.quote(f'alertname="{ALERT}"')
    body = json.loads(http_get(f"{stack.alertmanager.url}/api/v2/alerts?filter={query}"))
    return {a["labels"]["node"]: a["annotations"] for a in body}


def test_a_node_behind_two_jobs_interruptions_is_taken_out_and_nothing_else(
    stack: LemonStack, api_server: ApiServer
) -> None:
    cluster = RealCluster(api_server)
    target = stack.target
    target.add_pod("a-0", job="a", node=LEMON)
    target.add_pod("b-0", job="b", node=LEMON)
    target.add_pod("d-0", job="d", node=ONCE)
    target.add_pod("c-0", job="c", node=SAME_JOB_TWICE)
    # The rules know the pods as training jobs' pods, and a restart count from a merge
    # window ago to compare with.
    wait_until(
        lambda: (
            len(prom_query(stack.prometheus, POD_JOB_RECORD)) == 4
            and len(prom_query(stack.prometheus, f"{RESTARTS} offset {MERGE_WINDOW}")) == 4
        ),
        timeout=60,
        interval=0.25,
        what="the four pods known to the rules",
    )
    for pod in ("a-0", "d-0", "c-0"):
        target.restart(pod)
    wait_until(
        lambda: (
            (behind(stack, LEMON), behind(stack, ONCE), behind(stack, SAME_JOB_TWICE))
            == ({"a"}, {"d"}, {"c"})
        ),
        timeout=30,
        interval=0.25,
        what="the first interruptions recorded on their nodes",
    )
    wait_until(
        lambda: behind(stack, SAME_JOB_TWICE) == set(),
        timeout=30,
        interval=0.25,
        what="job c's first interruption over (one run of the record)",
    )
    target.restart("c-0")
    target.restart("b-0")
    wait_until(
        lambda: behind(stack, SAME_JOB_TWICE) == {"c"},
        timeout=30,
        interval=0.25,
        what="job c's second interruption recorded on gpu-2",
    )
    wait_until(
        lambda: KEY in [t["key"] for t in cluster.taints(LEMON)],
        timeout=60,
        interval=0.25,
        what="the lemon-node taint on gpu-0",
    )
    (taint,) = cluster.taints(LEMON)
    assert (taint["value"], taint["effect"]) == (ALERT, "NoSchedule")
    (event,) = cluster.events_for(LEMON, "TaintAdded")
    assert f"for alert {ALERT}" in event["message"]
    evidence = lemon_alerts(stack)[LEMON]["description"]
    assert "2 different training jobs" in evidence
    assert "ml/a (container_restart), ml/b (container_restart)" in evidence

    # The interruptions leave the lemon window: the alert resolves, and the taint stays
    # until a person releases it.
    wait_until(
        lambda: stack.untaint_deferred("manual") > 0,
        timeout=LEMON_WINDOW_SECONDS + 60,
        interval=0.5,
        what="the resolved lemon alert's untaint deferred to a person",
    )
    assert [t["key"] for t in cluster.taints(LEMON)] == [KEY]
    assert prom_query(stack.prometheus, f'ALERTS{{alertname="{ALERT}"}}') == []
    since = f"{3 * LEMON_WINDOW_SECONDS}s"
    fired = prom_query(
        stack.prometheus, f'max by (node) (max_over_time(ALERTS{{alertname="{ALERT}"}}[{since}]))'
    )
    assert [r["metric"]["node"] for r in fired] == [LEMON]
    assert cluster.taints(ONCE) == []
    assert cluster.taints(SAME_JOB_TWICE) == []

    assert main(["untaint", f"--kubeconfig={api_server.kubeconfig(ADMIN)}", LEMON]) == 0
    assert cluster.taints(LEMON) == []
