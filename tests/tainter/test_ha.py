"""High availability with real processes: two `fleetwatch taint --leader-elect` replicas
against one simulated API, and a real Alertmanager that sends every notification to both.

Exactly one replica leads (`/readyz` 200, `fleetwatch_tainter_leader 1`); the other
writes nothing and hands the notifications it receives to the leader, at the URL the
leader advertises on the Lease. The leader opens the breaker, then is killed with SIGKILL
(no graceful release); the other takes over within 20 s, keeps the breaker open, and taints from an
alert sent after the kill; `fleetwatch breaker reset`, run with an operator's kubeconfig,
closes the breaker. Every node and Event write in the cluster is by whoever led then.
Shorter Lease timings than the defaults keep the test short (bench/bench_tainter.py
measures failover with the defaults).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.sim.kubeapi import FakeCluster, make_app, write_kubeconfig
from fleetwatch.sim.servers import (
    Server,
    alertmanager,
    fleetwatch_command,
    free_port,
    http_get,
    http_status,
    wait_until,
)
from testbed.servers import served_in_thread

pytestmark = pytest.mark.integration

USERS = {"token-a": "tainter-a", "token-b": "tainter-b"}
LEASE_FLAGS = [
    "--leader-elect",
    "--leader-elect.namespace=fleetwatch",
    "--leader-elect.lease-duration=6s",
    "--leader-elect.renew-deadline=4s",
    "--leader-elect.retry-period=1s",
]


@dataclass
class Replica:
    user: str
    server: Server

    def metric(self, name: str) -> float | None:
        for line in http_get(f"{self.server.url}/metrics").decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def ready(self) -> bool:
        return http_status(f"{self.server.url}/readyz") == 200


@dataclass
class HaStack:
    cluster: FakeCluster
    replicas: list[Replica]
    alertmanager: Server
    workdir: Path
    operator_kubeconfig: Path


def alertmanager_config(replicas: list[Server], token_file: Path) -> dict[str, Any]:
    hooks = [
        {
            "url": f"{r.url}/alerts",
            "send_resolved": True,
            "http_config": {
                "authorization": {"type": "Bearer", "credentials_file": str(token_file)}
            },
        }
        for r in replicas
    ]
    return {
        "route": {
            "receiver": "tainter",
            "group_by": ["alertname", "node"],
            "group_wait": "1s",
            "group_interval": "2s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "tainter", "webhook_configs": hooks}],
    }


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HaStack]:
    workdir = tmp_path_factory.mktemp("ha")
    cluster = FakeCluster(token="operator-token", users=USERS)
    for index in range(4):
        cluster.add_node(f"gpu-{index}", labels={"nvidia.com/gpu.present": "true"})
    token = workdir / "webhook-token"
    token.write_text("ha-webhook-token\n")
    with served_in_thread(make_app(cluster)) as api, contextlib.ExitStack() as stack:
        replicas = []
        for token_value, user in USERS.items():
            kubeconfig = write_kubeconfig(
                workdir / f"{user}.kubeconfig", server=api, token=token_value
            )
            port = free_port(0)
            server = stack.enter_context(
                fleetwatch_command(
                    workdir / user,
                    command="taint",
                    port=port,
                    args=[
                        f"--leader-elect.advertise-url=http://127.0.0.1:{port}",
                        f"--web.token-file={token}",
                        f"--kubeconfig={kubeconfig}",
                        "--breaker.max-new-taints=1",
                        "--breaker.max-fraction=1",
                        "--reconcile.interval=2s",
                        "--taint.declared-reasons=gpu-overheat,gpu-lost",
                        *LEASE_FLAGS,
                    ],
                )
            )
            replicas.append(Replica(user=user, server=server))
        am = stack.enter_context(
            alertmanager(
                workdir / "alertmanager",
                config=alertmanager_config([r.server for r in replicas], token),
            )
        )
        yield HaStack(
            cluster=cluster,
            replicas=replicas,
            alertmanager=am,
            workdir=workdir,
            operator_kubeconfig=write_kubeconfig(
                workdir / "operator.kubeconfig", server=api, token="operator-token"
            ),
        )


def send_alert(am: Server, node: str, reason: str, *, resolve: bool = False) -> None:
    """Post an alert to Alertmanager's API as Prometheus would."""
    now = datetime.now(UTC)
    alert: dict[str, Any] = {
        "labels": {
            "alertname": "GPUOverheating" if reason == "gpu-overheat" else "GPUFallenOffBus",
            "node": node,
            "fleetwatch_taint": reason,
        },
        "annotations": {"summary": "test"},
        "startsAt": (now - timedelta(minutes=1)).isoformat(),
    }
    if resolve:
        alert["endsAt"] = now.isoformat()
    request = urllib.request.Request(
        f"{am.url}/api/v2/alerts",
        data=json.dumps([alert]).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def keys(cluster: FakeCluster, node: str) -> list[str]:
    return sorted(t["key"] for t in cluster.taints(node))


def non_lease_writers(cluster: FakeCluster) -> list[str]:
    return [user for user, what in list(cluster.writers) if not what.startswith("lease/")]


def test_two_replicas_fail_over_with_the_breaker_kept(ha: HaStack) -> None:
    leader = wait_until(
        lambda: next((r for r in ha.replicas if r.ready()), None),
        timeout=30,
        what="one replica to lead",
    )
    follower = next(r for r in ha.replicas if r is not leader)
    assert not follower.ready()
    assert (
        leader.metric("fleetwatch_tainter_leader"),
        follower.metric("fleetwatch_tainter_leader"),
    ) == (1.0, 0.0)
    lease = ha.cluster.leases[("fleetwatch", "fleetwatch-tainter")]
    assert lease["spec"]["leaseDurationSeconds"] == 6
    assert lease["metadata"]["annotations"]["fleetwatch.io/leader-url"] == leader.server.url

    send_alert(ha.alertmanager, "gpu-1", "gpu-overheat")
    wait_until(
        lambda: keys(ha.cluster, "gpu-1") == ["fleetwatch.io/gpu-overheat"],
        timeout=30,
        what="gpu-1 tainted",
    )
    # Alertmanager sent the notification to both: the follower handed its copy over.
    wait_until(
        lambda: follower.metric('fleetwatch_tainter_webhook_forwards_total{result="delivered"}'),
        timeout=10,
        what="the follower to hand its copy to the leader",
    )
    assert follower.metric("fleetwatch_tainter_standby_webhook_requests_total") == 0.0
    send_alert(ha.alertmanager, "gpu-2", "gpu-overheat")  # past the cap of 1: opens the breaker
    wait_until(
        lambda: leader.metric("fleetwatch_tainter_breaker_open") == 1.0,
        timeout=30,
        what="breaker open",
    )
    wait_until(
        lambda: '"open": true' in lease_annotation(ha),
        timeout=10,
        what="the open breaker stored on the Lease",
    )
    assert keys(ha.cluster, "gpu-2") == []
    wait_until(  # a follower shows the cluster's breaker state, and writes nothing for it
        lambda: follower.metric("fleetwatch_tainter_breaker_open") == 1.0,
        timeout=10,
        what="the follower to show the stored breaker state",
    )
    assert set(non_lease_writers(ha.cluster)) == {leader.user}  # the follower never wrote
    lease_writers = {user for user, what in ha.cluster.writers if what.startswith("lease/")}
    assert lease_writers == {leader.user}
    writes_before_kill = len(non_lease_writers(ha.cluster))

    leader.server.process.kill()  # SIGKILL: no release, the Lease must expire
    leader.server.process.wait(timeout=10)
    killed_at = time.monotonic()
    wait_until(follower.ready, timeout=20, what="the follower to take over within 20 s")
    takeover_s = time.monotonic() - killed_at
    assert follower.metric("fleetwatch_tainter_leader") == 1.0
    assert ha.cluster.leases[("fleetwatch", "fleetwatch-tainter")]["spec"]["leaseTransitions"] == 1
    assert follower.metric("fleetwatch_tainter_breaker_open") == 1.0  # inherited, still open

    send_alert(ha.alertmanager, "gpu-1", "gpu-lost")  # sent after the kill; node already ours
    wait_until(
        lambda: (
            keys(ha.cluster, "gpu-1") == ["fleetwatch.io/gpu-lost", "fleetwatch.io/gpu-overheat"]
        ),
        timeout=30,
        what="the new leader to taint from an alert sent after the kill",
    )
    assert keys(ha.cluster, "gpu-3") == []
    writers = non_lease_writers(ha.cluster)
    assert set(writers[:writes_before_kill]) == {leader.user}
    assert set(writers[writes_before_kill:]) == {follower.user}

    send_alert(ha.alertmanager, "gpu-2", "gpu-overheat", resolve=True)  # nothing re-opens it
    reset = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetwatch",
            "breaker",
            "reset",
            f"--kubeconfig={ha.operator_kubeconfig}",
            "--leader-elect.namespace=fleetwatch",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert reset.returncode == 0, reset.stderr
    wait_until(
        lambda: follower.metric("fleetwatch_tainter_breaker_open") == 0.0,
        timeout=20,
        what="the leader to close the breaker after `fleetwatch breaker reset`",
    )
    assert "circuit breaker reset" in follower.server.log()
    assert ("admin", "lease/update/fleetwatch-tainter") in ha.cluster.writers
    print(f"takeover after SIGKILL: {takeover_s:.1f}s")


def lease_annotation(ha: HaStack) -> str:
    lease = ha.cluster.leases.get(("fleetwatch", "fleetwatch-tainter")) or {}
    return str(
        (lease.get("metadata") or {}).get("annotations", {}).get("fleetwatch.io/breaker", "")
    )
