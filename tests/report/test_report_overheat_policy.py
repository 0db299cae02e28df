"""The report judges heat by each GPU model's overheat policy, as the rules do, on both
stores: a GPU of a model with no policy of its own by `gpu_temperature_celsius` (78 °C), a
B200 by its margin to the slowdown limit (the shipped policy: 5 °C), whatever its absolute
reading.

Three hours of one-minute samples, three nodes of one GPU each: an H100 above 78 °C for
30 minutes; a B200 at 85 °C throughout (7 °C from its limit: within its policy, though
above 78 °C) and 3 °C from its limit for 20 minutes; a B200 at 85 °C with no margin series
(a driver that reports none), which its policy cannot judge, so no time past it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from fleetwatch.catalog.gpu import (
    GPU_INFO,
    GPU_TEMPERATURE_CELSIUS,
    GPU_TEMPERATURE_MARGIN_CELSIUS,
    GPUS_VISIBLE,
)
from fleetwatch.cli import main
from testbed.servers import history_store

pytestmark = pytest.mark.integration

END = 1_767_225_600  # 2026-01-01T00:00:00Z, on a whole minute
HOURS = 3
STEP = 60
TIMES = [END - HOURS * 3600 + STEP * i for i in range(HOURS * 3600 // STEP + 1)]
HOT_FROM = END - 2 * 3600  # the hot spells start an hour into the window


def during(minutes: int, hot: float, cool: float) -> list[float]:
    """`hot` for `minutes` from HOT_FROM, `cool` otherwise."""
    return [hot if HOT_FROM <= t < HOT_FROM + minutes * 60 else cool for t in TIMES]


GPUS = {
    # node: (model, temperatures, margins or None)
    "h100-1": ("NVIDIA H100 80GB HBM3", during(30, 81.0, 70.0), during(30, 6.0, 17.0)),
    "b200-1": ("NVIDIA B200", [85.0] * len(TIMES), during(20, 3.0, 7.0)),
    "b200-2": ("NVIDIA B200", [85.0] * len(TIMES), None),
}


def series() -> Iterator[tuple[str, dict[str, str], list[float]]]:
    """(metric, labels, one value per TIMES) of the three nodes, as the exporter labels them."""
    for node, (model, temperatures, margins) in GPUS.items():
        gpu = {"job": "fleetwatch", "node": node, "gpu": "0", "uuid": f"GPU-{node}"}
        yield GPUS_VISIBLE.name, {"job": "fleetwatch", "node": node}, [1.0] * len(TIMES)
        info = {**gpu, "name": model, "pci_bus_id": "00000000:18:00.0", "serial": "1"}
        yield GPU_INFO.name, info, [1.0] * len(TIMES)
        yield GPU_TEMPERATURE_CELSIUS.name, {**gpu, "sensor": "gpu"}, temperatures
        if margins is not None:
            yield GPU_TEMPERATURE_MARGIN_CELSIUS.name, gpu, margins


def openmetrics() -> str:
    lines = []
    for name in dict.fromkeys(name for name, _, _ in series()):
        lines.append(f"# TYPE {name} gauge")
        for metric, labels, values in series():
            if metric != name:
                continue
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines += [f"{name}{{{text}}} {v:g} {t}" for t, v in zip(TIMES, values, strict=True)]
    return "\n".join([*lines, "# EOF", ""])


def victoria_lines() -> Iterator[dict[str, Any]]:
    for name, labels, values in series():
        yield {
            "metric": {"__name__": name, **labels},
            "values": values,
            "timestamps": [t * 1000 for t in TIMES],
        }


def report(url: str, out: Path) -> Path:
    status = main(
        [
            "report",
            f"--prometheus.url={url}",
            f"--since={HOURS}h",
            f"--until={END}",
            "--step=60s",
            f"--out={out}",
            "--log.format=text",
        ]
    )
    assert status == 0
    return out


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The report of the history from each engine (one store at a time)."""
    root = tmp_path_factory.mktemp("overheat-policy")
    out = {}
    for engine in ("prometheus", "victoriametrics"):
        with history_store(
            engine,
            root / engine,
            openmetrics=lambda path: path.write_text(openmetrics()),
            victoria=victoria_lines,
        ) as server:
            out[engine] = report(server.url, root / engine / "out")
    return out


def table(out: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(out / "tables" / f"{name}.csv", keep_default_na=False)


@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_minutes_past_the_policy_follow_each_model(outputs: dict[str, Path], engine: str) -> None:
    temperatures = table(outputs[engine], "gpu_temperatures").set_index("node")
    minutes = temperatures["minutes_above"].to_dict()
    # Each hot spell's minutes, give or take the sample on an edge of the window's steps.
    assert math.isclose(minutes["h100-1"], 30, abs_tol=1), minutes
    assert math.isclose(minutes["b200-1"], 20, abs_tol=1), minutes  # not 180: 85 °C is fine
    assert minutes["b200-2"] == 0, minutes  # no margin: its policy judges nothing
    assert temperatures.loc["b200-2", "max_celsius"] == 85  # read, not dropped


@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_the_drain_actions_name_the_policy(outputs: dict[str, Path], engine: str) -> None:
    actions = table(outputs[engine], "actions")
    drains = actions[actions["action"] == "drain"].set_index("target")["reason"].to_dict()
    assert sorted(drains) == ["b200-1", "h100-1"], drains
    for why in drains.values():
        assert why.startswith(
            "GPU 0 past its model's overheat policy (above 78 °C; "
            "NVIDIA B200: within 5 °C of its slowdown limit; "
        ), why
