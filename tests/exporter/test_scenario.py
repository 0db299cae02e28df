"""Scenario files: the built-ins load, and malformed files fail naming file, key and reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from fleetwatch.sim.gpu_faults import Temperature
from fleetwatch.sim.kubelet import kube_pod_labels
from fleetwatch.sim.scenario import (
    MAX_SCENARIO_BYTES,
    ScenarioError,
    builtin_names,
    load_scenario,
)
from fleetwatch.sim.world import SimulatedNode
from testbed.clock import FixedClock
from testbed.tool_servers import promtool_check_metrics

VALID = {
    "gpus": 8,
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "nvlinks_per_gpu": 18,
    "infiniband": [{"device": "mlx5_0", "ports": 1, "rate_gbps": 400}],
    "faults": [{"at": 10, "kind": "temperature", "gpu": 3, "celsius": 84, "ramp_seconds": 20}],
}


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_builtins_load() -> None:
    assert {"dgx-h100", "demo"} <= set(builtin_names())
    for name in builtin_names():
        scenario = load_scenario(name)
        assert scenario.gpus > 0
        assert scenario.description


def test_valid_file_loads(tmp_path: Path) -> None:
    scenario = load_scenario(str(write(tmp_path, VALID)))
    assert scenario.faults == (Temperature(at=10.0, gpu=3, celsius=84.0, ramp_seconds=20.0),)
    node = SimulatedNode(scenario=scenario, clock=FixedClock(40))
    assert node.gpu_temperature(3) == 84.0


def mutate(path: str, value: object) -> dict[str, object]:
    data = yaml.safe_load(yaml.safe_dump(VALID))
    target = data
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    if value is KeyError:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return data  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("gpus", KeyError, "gpus: required key is missing"),
        ("gpu", 8, "gpu: unknown key"),
        ("gpus", "eight", "gpus: expected an integer, got 'eight'"),
        ("faults.0.gpu", 9, "faults[0].gpu: 9 is out of range 0..7"),
        ("faults.0.kind", "meltdown", "faults[0].kind: 'meltdown' is not one of"),
        ("faults.0.celsius", KeyError, "faults[0].celsius: required key is missing"),
        ("faults.0.colour", "red", "faults[0].colour: unknown key"),
        ("infiniband.0.ports", 0, "infiniband[0].ports: 0 is out of range 1..4"),
        ("infiniband.0.link_layer", "Token Ring", "infiniband[0].link_layer: 'Token Ring'"),
        ("faults", {"at": 1}, "faults: expected a list of faults"),
    ],
)
def test_malformed_scenarios_name_file_key_and_reason(
    tmp_path: Path, path: str, value: object, message: str
) -> None:
    file = write(tmp_path, mutate(path, value))
    with pytest.raises(ScenarioError) as error:
        load_scenario(str(file))
    assert str(error.value).startswith(f"{file}: ")
    assert message in str(error.value)


def test_ib_fault_on_unknown_device_or_port(tmp_path: Path) -> None:
    data = mutate("faults", [{"at": 1, "kind": "ib_port_down", "device": "mlx5_9", "port": 1}])
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.device: 'mlx5_9' is not one of mlx5_0"):
        load_scenario(str(write(tmp_path, data)))
    data = mutate("faults", [{"at": 1, "kind": "ib_port_down", "device": "mlx5_0", "port": 2}])
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.port: mlx5_0 has 1 port"):
        load_scenario(str(write(tmp_path, data)))


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(str(write(tmp_path, "gpus: [8\n")))
    with pytest.raises(ScenarioError, match=r"cannot read scenario .* built-in scenarios: "):
        load_scenario(str(tmp_path / "absent.yaml"))
    with pytest.raises(ScenarioError, match=r"\(top level\): expected a mapping"):
        load_scenario(str(write(tmp_path, "- 1\n- 2\n")))


YAML_BOMB = """\
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def test_yaml_aliases_are_refused(tmp_path: Path) -> None:
    file = write(tmp_path, YAML_BOMB)
    with pytest.raises(ScenarioError, match=r"aliases \(\*a\) are not allowed") as error:
        load_scenario(str(file))
    assert str(error.value).startswith(f"{file}: not valid YAML")


def test_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    file = write(tmp_path, "# padding\n" * (MAX_SCENARIO_BYTES // 10 + 1) + yaml.safe_dump(VALID))
    with pytest.raises(ScenarioError, match=r"scenario larger than 1024 KiB") as error:
        load_scenario(str(file))
    assert str(error.value).startswith(f"{file}: ")


def test_device_is_refused_not_read_forever() -> None:
    with pytest.raises(ScenarioError, match=r"^/dev/zero: a scenario must be a regular file$"):
        load_scenario("/dev/zero")


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "scenario.yaml"
    os.mkfifo(fifo)  # no writer: a blocking open or read would never return
    with pytest.raises(ScenarioError, match=r"a scenario must be a regular file$") as error:
        load_scenario(str(fifo))
    assert str(error.value).startswith(f"{fifo}: ")


def test_binary_file_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "scenario.yaml"
    file.write_bytes(b"gpus: \xff\xfe\n")
    with pytest.raises(ScenarioError, match=r"not UTF-8 text"):
        load_scenario(str(file))


POD = {
    "namespace": "ml",
    "name": "llm-workers-0",
    "gpus": [0, 1],
    "labels": {"jobset.sigs.k8s.io/jobset-name": "llm"},
}


def test_pods_load_with_their_gpus_and_labels(tmp_path: Path) -> None:
    scenario = load_scenario(str(write(tmp_path, {**VALID, "pods": [POD]})))
    (pod,) = scenario.pods
    assert (pod.namespace, pod.name, pod.container, pod.gpus) == (
        "ml",
        "llm-workers-0",
        "main",
        (0, 1),
    )
    assert pod.labels == {"jobset.sigs.k8s.io/jobset-name": "llm"}
    assert pod.claim == ""  # from the device plugin
    assert load_scenario("dgx-h100").pods == ()
    claimed = load_scenario(str(write(tmp_path, {**VALID, "pods": [{**POD, "claim": "gpus"}]})))
    assert claimed.pods[0].claim == "gpus"


@pytest.mark.parametrize(
    ("pods", "message"),
    [
        ([{**POD, "gpus": [8]}], "pods[0].gpus[0]: 8 is out of range 0..7"),
        (
            [POD, {**POD, "name": "other", "gpus": [1], "labels": {}}],
            "pods[1].gpus[0]: GPU 1 is held by another pod",
        ),
        ([{**POD, "name": "LLM_0"}], "pods[0].name: 'LLM_0' is not a Kubernetes name"),
        ([{**POD, "labels": {"not a key": "x"}}], "pods[0].labels: 'not a key' is not a label key"),
        ([{**POD, "labels": {"app": "a b"}}], "pods[0].labels.app: 'a b' is not a label value"),
        ([{**POD, "gpus": []}], "pods[0].gpus: expected a non-empty list of GPU indices"),
        ([{**POD, "node": "n1"}], "pods[0].node: unknown key"),
        ([{**POD, "claim": "My_Claim"}], "pods[0].claim: 'My_Claim' is not a Kubernetes name"),
        ({"name": "x"}, "pods: expected a list of pods"),
    ],
)
def test_malformed_pods_name_the_key(tmp_path: Path, pods: object, message: str) -> None:
    file = write(tmp_path, {**VALID, "pods": pods})
    with pytest.raises(ScenarioError) as error:
        load_scenario(str(file))
    assert str(error.value) == f"{file}: {message}"


@pytest.mark.integration  # promtool lints the text
def test_kube_pod_labels_names_pod_labels_as_kube_state_metrics_does(tmp_path: Path) -> None:
    scenario = load_scenario(str(write(tmp_path, {**VALID, "pods": [POD]})))
    text = kube_pod_labels([scenario])
    series = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(series) == 1
    assert series[0].startswith('kube_pod_labels{namespace="ml",pod="llm-workers-0",uid="')
    assert series[0].endswith(',label_jobset_sigs_k8s_io_jobset_name="llm"} 1')
    assert promtool_check_metrics(text) == []
