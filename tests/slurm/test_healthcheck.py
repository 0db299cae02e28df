"""The health check's conditions on one scrape, without Slurm: GPUOverheating follows the
per-model overheat policy of config.yaml as the rules do (an absolute limit by default, a
margin to the slowdown limit for the models listed with one), from the shipped config or
an operator's override file."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwatch.catalog.gpu import GPU_INFO, GPU_TEMPERATURE_CELSIUS, GPU_TEMPERATURE_MARGIN_CELSIUS
from fleetwatch.cli import parse_args
from fleetwatch.flags import deprecated_flags_used
from fleetwatch.rules.config import Config, load_config, shipped_text
from fleetwatch.slurm.cli import COMMAND
from fleetwatch.slurm.healthcheck import findings, parse_exposition
from tests.rules.overrides import H100, write


def scrape(model: str, celsius: float, margin: float | None) -> str:
    """One GPU's identity, temperature and (where given) margin, as the exporter serves them."""
    labels = 'gpu="0",uuid="GPU-a"'
    lines = [
        f'{GPU_INFO}{{{labels},name="{model}",pci_bus_id="0000:18:00.0",serial="1",'
        'driver_version="570.1"} 1',
        f'{GPU_TEMPERATURE_CELSIUS}{{{labels},sensor="gpu"}} {celsius}',
    ]
    if margin is not None:
        lines.append(f"{GPU_TEMPERATURE_MARGIN_CELSIUS}{{{labels}}} {margin}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    """The shipped config plus an absolute policy for one model, to cover all three kinds."""
    text = shipped_text("config.yaml").replace(
        "  overheat_policy:\n",
        '  overheat_policy:\n    - {model: "NVIDIA H200", celsius: 83}\n',
    )
    path = tmp_path_factory.mktemp("config") / "config.yaml"
    path.write_text(text)
    loaded = load_config(path)
    assert loaded.overheat_policy[0].model == "NVIDIA H200"
    return loaded


@pytest.mark.parametrize(
    ("model", "celsius", "margin", "detail"),
    [
        # No policy of its own: the fleet's 78 °C.
        ("NVIDIA H100 80GB HBM3", 79, 8, "GPU 0 (GPU-a) at 79 °C, above 78 °C"),
        ("NVIDIA H100 80GB HBM3", 78, 1, None),
        # An absolute policy of its own.
        ("NVIDIA H200", 82, 2, None),
        ("NVIDIA H200", 84, 2, "GPU 0 (GPU-a) at 84 °C, above 83 °C"),
        # A margin policy: 85 °C is fine 7 °C from the limit, 80 °C is not 4 °C from it.
        ("NVIDIA B200", 85, 7, None),
        (
            "NVIDIA B200",
            80,
            4,
            "GPU 0 (GPU-a) at 80 °C, 4 °C from its slowdown limit, closer than NVIDIA B200's "
            "policy of 5 °C",
        ),
        # A margin policy without a margin reading judges nothing (as the rules: no series).
        ("NVIDIA B200", 95, None, None),
    ],
)
def test_overheating_follows_the_models_policy(
    config: Config, model: str, celsius: float, margin: float | None, detail: str | None
) -> None:
    found = findings(parse_exposition(scrape(model, celsius, margin)), config)
    overheating = [f.detail for f in found if f.alert == "GPUOverheating"]
    assert overheating == ([] if detail is None else [detail])
    assert all(f.drain_reason == "fleetwatch:gpu-overheat GPUOverheating" for f in found)


def test_the_shipped_policy_is_the_one_read() -> None:
    """Without an override the shipped config judges a B200 by its margin, not by 78 °C."""
    shipped = load_config()
    assert shipped.overheat_headroom("NVIDIA B200", 90, 7) == 2
    assert shipped.overheat_headroom("NVIDIA H100 80GB HBM3", 80, 7) == -2


@pytest.mark.parametrize("flag", ["--rules.config-file", "--healthcheck.rules-config"])
def test_the_override_file_sets_the_policy_the_check_reads(tmp_path: Path, flag: str) -> None:
    """`--rules.config-file` (the tainter's and the report's flag; the old
    `--healthcheck.rules-config` its deprecated spelling) names an override file merged over
    the shipped config: an H100 listed at 80 °C is judged by it, not by the shipped 78 °C."""
    override = write(tmp_path / "override.yaml")
    args = parse_args(["slurm", "healthcheck", f"{flag}={override}"])
    command = COMMAND.read(args)
    assert command.rules_config == override
    assert bool(deprecated_flags_used(args)) is (flag == "--healthcheck.rules-config")
    config = load_config(override=command.rules_config)
    judged = {
        celsius: [
            f.detail
            for f in findings(parse_exposition(scrape(H100, celsius, 8)), config)
            if f.alert == "GPUOverheating"
        ]
        for celsius in (79, 81)
    }
    assert judged == {79: [], 81: ["GPU 0 (GPU-a) at 81 °C, above 80 °C"]}
