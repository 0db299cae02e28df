"""`fleetwatch demo` tells the story of the scenario it runs, not a fixed one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetwatch.sim.demo import print_banner, story
from fleetwatch.sim.scenario import load_scenario


def test_the_demo_scenario_tells_the_straggler_story() -> None:
    lines = story(load_scenario("demo"), Path("/tmp/demo"))
    text = "\n".join(lines)
    assert "Pod ml/llm-pretrain-workers-0 (training job llm-pretrain) holds GPUs 0, 1" in text
    straggler = next(line for line in lines if "GPUStraggler" in line)
    assert straggler.startswith("  t=70s   GPU 1 slows its clocks (hw_thermal_slowdown)")
    assert "(after 5m)" in straggler
    idle = next(line for line in lines if "GPUIdleInJob" in line)
    assert idle.startswith("  t=80s   GPU 4's tensor cores drop to 5%")
    assert "GPU 3 heats to 84 °C" in text
    assert "fleetwatch untaint demo-node --reason gpu-lost" in text


def test_another_scenario_tells_its_own_story(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "hot-a100.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "description": "an A100 node that only runs hot",
                "gpus": 4,
                "gpu_model": "NVIDIA A100-SXM4-80GB",
                "nvlinks_per_gpu": 12,
                "infiniband": [],
                "faults": [{"at": 5, "kind": "temperature", "gpu": 2, "celsius": 90}],
            }
        )
    )
    scenario = load_scenario(str(path))
    print_banner({"exporter": "http://127.0.0.1:1"}, tmp_path, scenario)
    banner = capsys.readouterr().out
    assert "scenario hot-a100, a simulated node named demo-node with 4 x NVIDIA A100" in banner
    assert "t=5s    GPU 2 heats to 90 °C" in banner
    for other in ("GPU 3", "NVLink", "InfiniBand", "Xid", "GPUStraggler", "Pod "):
        assert other not in banner
    healthy = story(load_scenario("dgx-h100"), tmp_path)
    assert "  No faults: every GPU, link and port stays healthy." in healthy
