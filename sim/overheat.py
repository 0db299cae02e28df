"""The whole alerting path (`fleetwatch.sim.stack`) as the end-to-end tests, the alert-to-taint
bench and `fleetwatch demo --orchestrator=slurm` run it: a node whose GPU 3 heats past the
shipped GPUOverheating threshold (`OVERHEAT_CELSIUS`, rules/config.yaml's
`gpu_temperature_celsius`) and cools again, the shipped rules with GPUOverheating's
`keep_firing_for` shortened (`FAST_KEEP_FIRING`), and the tainter's timings given by the
caller; gpu-overheat's clear condition with its hold-down shortened (`FAST_HOLD_DOWN`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from fleetwatch.rules.config import (
    ALERTS_FILE,
    GLOBAL_FILE,
    RECORDING_FILE,
    load_config,
    shipped_text,
)
from fleetwatch.rules.contract import CLEAR
from fleetwatch.rules.groups import remediation_contract
from fleetwatch.sim.stack import Plan, Stack, start_stack

NODE = "e2e-node"
# GPUOverheating's threshold as shipped: GPU 3 heats 6 °C past it at 5 s, then cools to 60 °C
# at 35 s (seconds from the exporter's start).
OVERHEAT_CELSIUS = float(load_config().thresholds["gpu_temperature_celsius"])
HOT_GPU = 3
HOT_CELSIUS = OVERHEAT_CELSIUS + 6
HEAT_AT = 5
COOL_CELSIUS = 60
COOL_AT = 35
SCENARIO = {
    "description": f"GPU {HOT_GPU} heats to {HOT_CELSIUS:g} °C, then cools to {COOL_CELSIUS} °C",
    "gpus": 4,
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "nvlinks_per_gpu": 2,
    "infiniband": [{"device": "mlx5_0", "ports": 1, "rate_gbps": 400, "link_layer": "InfiniBand"}],
    "baseline": {"temperature_celsius": 62, "tensor_active": 0.55},
    "faults": [
        {
            "at": HEAT_AT,
            "kind": "temperature",
            "gpu": HOT_GPU,
            "celsius": HOT_CELSIUS,
            "ramp_seconds": 5,
        },
        {
            "at": COOL_AT,
            "kind": "temperature",
            "gpu": HOT_GPU,
            "celsius": COOL_CELSIUS,
            "ramp_seconds": 3,
        },
    ],
}


FAST_KEEP_FIRING = "5s"


ALERT = "GPUOverheating"


def _overheating(rules: dict[str, Any]) -> dict[str, Any]:
    """GPUOverheating's rule in the parsed alert rule file `rules`."""
    found: dict[str, Any] = next(
        rule for group in rules["groups"] for rule in group["rules"] if rule.get("alert") == ALERT
    )
    return found


def overheat_alert(node: str, gpu: str = "0") -> dict[str, str]:
    """The labels of GPUOverheating on `node`'s GPU `gpu`, as Prometheus sends them to
    Alertmanager: the alert's name, node and GPU, and the shipped rule's own labels (its
    severity and the taint it requests)."""
    rule = _overheating(yaml.safe_load(shipped_text(ALERTS_FILE.name)))
    return {"alertname": ALERT, "node": node, "gpu": gpu, **rule["labels"]}


def fast_rules(workdir: Path) -> list[Path]:
    """The shipped rule files (both scopes), with GPUOverheating's keep_firing_for shortened
    to FAST_KEEP_FIRING."""
    rules = yaml.safe_load(shipped_text(ALERTS_FILE.name))
    _overheating(rules)["keep_firing_for"] = FAST_KEEP_FIRING
    paths = [workdir / ALERTS_FILE.name, workdir / RECORDING_FILE.name, workdir / GLOBAL_FILE.name]
    paths[0].write_text(yaml.safe_dump(rules, allow_unicode=True))
    for path in paths[1:]:
        path.write_text(shipped_text(path.name))
    return paths


HOLD_DOWN_PARAMETER = "thresholds.untaint_hold_down"
FAST_HOLD_DOWN = "5s"


def fast_clear_condition() -> str:
    """gpu-overheat's clear condition from the rules, its hold-down shortened to 5s."""
    contract = remediation_contract(
        load_config(),
        lambda name, default: FAST_HOLD_DOWN if name == HOLD_DOWN_PARAMETER else default,
    )
    query: str = contract["gpu-overheat"][CLEAR]
    return query


def start_overheat_stack(
    workdir: Path,
    servers: contextlib.ExitStack,
    *,
    interval: str,
    hold: str,
    node: str = NODE,
    tainter_args: Sequence[str] = (),
) -> Stack:
    """Every server of the alerting path on the heating scenario; `servers` stops them all.
    `interval` is Prometheus' scrape and evaluation interval, `hold` the tainter's; `node`
    names the heating node, `tainter_args` add to the tainter's flags (a Slurm
    controller's)."""
    workdir.mkdir(parents=True, exist_ok=True)
    scenario = workdir / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    plan = Plan(
        scenario=str(scenario),
        node=node,
        interval=interval,
        collection_interval="1s",
        rule_files=fast_rules(workdir),
        tainter_args=(
            f"--untaint.hold={hold}",
            f"--untaint.evidence=gpu-overheat={fast_clear_condition()}",
            "--reconcile.interval=2s",
            "--breaker.max-new-taints=10",
            "--breaker.max-fraction=1",
            *tainter_args,
        ),
    )
    return start_stack(workdir, servers, plan)
