"""The lean profile (`LEAN_PROFILE_FLAGS`): it drops exactly the series it says, and the
alerts on what it thins out still fire.

The lean exposition must be the full one less the InfiniBand hw_counters, the saturation
flags at 0, the NVLink error counters still at 0 and the storage per-operation series beyond
the data path's counts and times (`LEAN_OPERATIONS`), and nothing else. An NVLink error
counter under lean appears at its first error, so NVLinkErrorsRising is checked with
promtool on the shipped rules against a series that is absent until then.

Lean also means what the exporter loads: on a node (no `--simulate`) a real `fleetwatch
export` process imports no module of the simulator and none of the rules, and none of the
libraries only some nodes or other roles need.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetwatch.catalog.storage import (
    FAMILIES,
    STORAGE_OPERATION_ERRORS_TOTAL,
    STORAGE_OPERATION_QUEUE_SECONDS_TOTAL,
    STORAGE_OPERATION_RECEIVED_BYTES_TOTAL,
    STORAGE_OPERATION_SENT_BYTES_TOTAL,
)
from fleetwatch.collectors.nvlink import has_erred
from fleetwatch.collectors.storage import LEAN_OPERATIONS
from fleetwatch.exporter.settings import LEAN_PROFILE_FLAGS
from fleetwatch.sim.loopback_servers import free_port
from testbed.tool_servers import promtool
from tests.exporter.node import collect_node

RULES = Path(__file__).parents[2] / "rules"
HW_STAT = "fleetwatch_infiniband_port_hw_stat_total{"
SATURATED = "fleetwatch_infiniband_port_error_saturated{"
NVLINK_ERRORS = "fleetwatch_nvlink_errors_total{"
STORAGE_PER_OPERATION = tuple(f"{spec.name}{{" for spec in FAMILIES if "operation" in spec.labels)
STORAGE_LEAN_DROPS = tuple(
    f"{spec.name}{{"
    for spec in (
        STORAGE_OPERATION_ERRORS_TOTAL,
        STORAGE_OPERATION_QUEUE_SECONDS_TOTAL,
        STORAGE_OPERATION_RECEIVED_BYTES_TOTAL,
        STORAGE_OPERATION_SENT_BYTES_TOTAL,
    )
)


def samples(text: str) -> dict[str, float]:
    """Each sample's `name{labels}` and its value."""
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {series: float(value) for series, value in pairs}


def dropped_by_lean(series: str, value: float) -> bool:
    """What the lean profile says it leaves out."""
    if series.startswith((HW_STAT, *STORAGE_LEAN_DROPS)):
        return True
    if series.startswith(STORAGE_PER_OPERATION):
        return series.split('operation="', 1)[1].split('"', 1)[0] not in LEAN_OPERATIONS
    return series.startswith((SATURATED, NVLINK_ERRORS)) and value == 0


# gb200 at 60 s and demo at 56 s: one link has been counting NVLink errors since 30 s.
@pytest.mark.parametrize(("scenario", "at"), [("dgx-h100", 600.0), ("gb200", 60.0), ("demo", 56.0)])
def test_lean_drops_exactly_what_it_says(scenario: str, at: float, tmp_path: Path) -> None:
    full = samples(collect_node(scenario, at, tmp_path / "full"))
    lean = samples(collect_node(scenario, at, tmp_path / "lean", *LEAN_PROFILE_FLAGS))
    kept = {s: v for s, v in full.items() if not dropped_by_lean(s, v)}
    assert lean == kept
    assert len(lean) < len(full) / 2, "the lean profile should at least halve the series"
    erring = [s for s, v in lean.items() if s.startswith(NVLINK_ERRORS)]
    assert all(lean[s] > 0 for s in erring)
    if scenario != "dgx-h100":
        assert erring, "the erring link's counter is exported"


def test_an_error_series_stays_once_it_has_counted() -> None:
    """After its first error a counter is exported even at 0 again (a reset), so Prometheus
    sees a counter reset, not a series that vanished."""
    erred: set[tuple[str, int | None, str]] = set()
    key = ("GPU-1", 17, "crc_data")
    assert [has_erred(erred, key, count) for count in (0, 0, 3, 5, 0)] == [
        False, False, True, True, True,
    ]  # fmt: skip
    assert has_erred(None, key, 0), "full profile: every counter is exported"


def promtool_test(series_values: str, eval_time: str, firing: bool) -> dict[str, Any]:
    """A promtool test of NVLinkErrorsRising on the shipped rules, for one crc_data counter."""
    ids = {"job": "fleetwatch", "instance": "10.0.0.1:9400", "node": "node-1", "gpu": "1"}
    ids |= {"uuid": "GPU-1", "link": "17"}
    selector = ",".join(f'{k}="{v}"' for k, v in ids.items())
    alert = {
        "exp_labels": {"severity": "warning", **ids, "error": "crc_data"},
        "exp_annotations": {
            "summary": "NVLink crc_data errors rising on node node-1",
            "description": "NVLink 17 of GPU 1 on node node-1 counts 2.00 crc_data errors "
            "per second.",
            "runbook_url": "https://github.com/fleetwatch/fleetwatch/blob/main/rules/runbooks/"
            "NVLinkErrorsRising.md",
        },
    }
    return {
        "rule_files": [
            str(RULES / "fleetwatch.rules.yaml"),
            str(RULES / "fleetwatch.recording.yaml"),
        ],
        "evaluation_interval": "5s",
        "tests": [
            {
                "interval": "5s",
                "input_series": [
                    {"series": f"fleetwatch_nvlink_up{{{selector}}}", "values": "1x100"},
                    {
                        "series": f'fleetwatch_nvlink_errors_total{{{selector},error="crc_data"}}',
                        "values": series_values,
                    },
                ],
                "alert_rule_test": [
                    {
                        "eval_time": eval_time,
                        "alertname": "NVLinkErrorsRising",
                        "exp_alerts": [alert] if firing else [],
                    }
                ],
            }
        ],
    }


@pytest.mark.integration
@pytest.mark.parametrize(
    ("values", "eval_time", "firing"),
    [
        # Lean: absent for a minute, then the first errors and 2 a second (10 a scrape).
        ("_x11 4+10x80", "4m", True),
        # Before `for` has passed since the second sample, it is pending, not firing.
        ("_x11 4+10x80", "2m", False),
        # One burst that never grows again fires neither under lean nor under full.
        ("_x11 400x80", "4m", False),
        ("0x11 400x80", "4m", False),
    ],
)
def test_nvlink_error_alert_fires_on_a_series_that_appears_at_its_first_error(
    values: str, eval_time: str, firing: bool, tmp_path: Path
) -> None:
    test_file = tmp_path / "lean.test.yaml"
    test_file.write_text(yaml.safe_dump(promtool_test(values, eval_time, firing)))
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


EXPORT_ON_A_NODE = """
import os, signal, socket, sys, threading, time
from fleetwatch.cli import main

port, root = sys.argv[1], sys.argv[2]
ready = threading.Event()


def readyz():
    # A bare socket: urllib would load http.client and email into the process looked at.
    with socket.create_connection(("127.0.0.1", int(port)), timeout=2) as conn:
        conn.sendall(b"GET /readyz HTTP/1.0\\r\\n\\r\\n")
        return conn.recv(64).startswith(b"HTTP/1.1 200 ")


def stop_when_ready():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not ready.is_set():
        try:
            if readyz():
                ready.set()
                break
        except OSError:
            pass
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)


threading.Thread(target=stop_when_ready, daemon=True).start()
status = main([
    "export",
    f"--web.listen-address=127.0.0.1:{port}",
    f"--path.sysfs={root}/sys",
    f"--path.procfs={root}/proc",
    f"--path.rootfs={root}",
    f"--collector.xid.kmsg-path={root}/kmsg",
])
print("status", status, "ready", ready.is_set())
print("\\n".join(sorted(sys.modules)))
"""


def test_the_exporter_on_a_node_loads_neither_the_simulator_nor_the_rules(
    tmp_path: Path,
) -> None:
    """`fleetwatch export` without `--simulate`, through the console script's entry point
    (`fleetwatch.cli.main`) in a process of its own, on an empty node (no GPU, no fabric):
    it serves until /readyz answers after the first cycle, stops on SIGTERM as in a pod, and
    then lists every module it loaded. An import of the simulator or the rules anywhere on
    that path (the parser, the hardware set-up, a collector, the Xid catalog) fails here."""
    for folder in ("sys", "proc"):
        (tmp_path / folder).mkdir()
    done = subprocess.run(
        [sys.executable, "-c", EXPORT_ON_A_NODE, str(free_port()), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    status, *modules = done.stdout.splitlines()
    assert status == "status 0 ready True", done.stderr
    assert {"fleetwatch.exporter.export", "fleetwatch.collectors.xid"} <= set(modules)
    assert "fleetwatch.catalog.nvidia_xids" in modules, "the Xid collector reads the catalog"
    loaded = [
        m for m in modules if m.split(".")[:2] in (["fleetwatch", "sim"], ["fleetwatch", "rules"])
    ]
    assert loaded == []
    # Libraries no collector of an empty node needs: aiohttp (the exporter serves HTTP
    # itself), prometheus_client, sh (until a tool runs), grpc (until a kubelet socket),
    # bcrypt (until a basic-auth check), http.client and email (until DRA attribution
    # watches ResourceSlices; not without a node name), importlib.metadata (the version is a
    # constant) and uuid (one formatting).
    heavy = {"aiohttp", "prometheus_client", "sh", "grpc", "bcrypt", "email", "uuid"}
    assert heavy & {m.split(".")[0] for m in modules} == set()
    assert {"http.client", "importlib.metadata"} & set(modules) == set()
