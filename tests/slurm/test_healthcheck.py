"""The health check's judgement without Slurm: one scrape judged by the remediation
contract's local checks (the overheat policy per model, lost GPUs, a failed row remap, NVLink
down, a degraded fabric, a hung checkpoint mount), the alerts that need Prometheus left
unjudged and named, and the firing alerts Prometheus answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwatch.catalog.gpu import (
    GPU_FABRIC_DEGRADED,
    GPU_FABRIC_STATE_ID,
    GPU_INFO,
    GPU_ROW_REMAP_FAILED,
    GPU_TEMPERATURE_CELSIUS,
    GPU_TEMPERATURE_MARGIN_CELSIUS,
    GPUS_EXPECTED,
    GPUS_VISIBLE,
)
from fleetwatch.catalog.infiniband import INFINIBAND_PORT_UP
from fleetwatch.catalog.nvlink import NVLINK_UP
from fleetwatch.catalog.pci import GPUS_PCI_PRESENT
from fleetwatch.catalog.storage import STORAGE_HUNG, STORAGE_READ_ONLY
from fleetwatch.catalog.xid import GPU_XID_ERRORS_TOTAL
from fleetwatch.cli import parse_args
from fleetwatch.flags import deprecated_flags_used
from fleetwatch.rules.config import Config, load_config, shipped_text
from fleetwatch.rules.contract import Contract, LocalCheck, Threshold, load_contract
from fleetwatch.slurm.cli import read_command
from fleetwatch.slurm.findings import Judgement, from_alerts, from_scrape, parse_exposition
from fleetwatch.slurm.healthcheck import firing_alerts_query
from tests.rules.overrides import H100, write

GPU_A = 'gpu="0",uuid="GPU-a"'
NEEDS_PROMETHEUS = {
    "GPUXidCritical",
    "GPUFabricNotRegistered",
    "CheckpointMountReadOnly",
    "NodeInterruptsJobs",
}


def scrape(model: str, celsius: float, margin: float | None) -> str:
    """One GPU's identity, temperature and (where given) margin, as the exporter serves them."""
    lines = [
        f'{GPU_INFO}{{{GPU_A},name="{model}",pci_bus_id="0000:18:00.0",serial="1",'
        'driver_version="570.1"} 1',
        f'{GPU_TEMPERATURE_CELSIUS}{{{GPU_A},sensor="gpu"}} {celsius}',
    ]
    if margin is not None:
        lines.append(f"{GPU_TEMPERATURE_MARGIN_CELSIUS}{{{GPU_A}}} {margin}")
    return "\n".join(lines) + "\n"


def judge(text: str, config: Config | None = None) -> Judgement:
    """`text` judged by the shipped contract, with `config` (the shipped one by default)."""
    return from_scrape(parse_exposition(text), load_contract(), config or load_config())


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
        (
            "NVIDIA H100 80GB HBM3",
            79,
            8,
            "GPU 0 (GPU-a): fleetwatch_gpu_temperature_celsius 79 > 78 "
            "(thresholds.gpu_temperature_celsius)",
        ),
        ("NVIDIA H100 80GB HBM3", 78, 1, None),
        # An absolute policy of its own.
        ("NVIDIA H200", 82, 2, None),
        (
            "NVIDIA H200",
            84,
            2,
            "GPU 0 (GPU-a): fleetwatch_gpu_temperature_celsius 84 > 83 (NVIDIA H200's policy)",
        ),
        # A margin policy: 85 °C is fine 7 °C from the limit, 80 °C is not 4 °C from it.
        ("NVIDIA B200", 85, 7, None),
        (
            "NVIDIA B200",
            80,
            4,
            "GPU 0 (GPU-a): fleetwatch_gpu_temperature_celsius 80 > 79 (NVIDIA B200's policy: "
            "5 °C from its slowdown limit, 4 °C now)",
        ),
        # A margin policy without a margin reading judges nothing (as the rules: no series).
        ("NVIDIA B200", 95, None, None),
    ],
)
def test_overheating_follows_the_models_policy(
    config: Config, model: str, celsius: float, margin: float | None, detail: str | None
) -> None:
    found = judge(scrape(model, celsius, margin), config).findings
    assert [f.detail for f in found if f.alert == "GPUOverheating"] == (
        [] if detail is None else [detail]
    )
    assert all(f.drain_reason == "fleetwatch:gpu-overheat GPUOverheating" for f in found)


def test_the_shipped_policy_is_the_one_read() -> None:
    """Without an override the shipped config judges a B200 by its margin, not by 78 °C."""
    shipped = load_config()
    assert shipped.overheat_headroom("NVIDIA B200", 90, 7) == 2
    assert shipped.overheat_headroom("NVIDIA H100 80GB HBM3", 80, 7) == -2


@pytest.mark.parametrize(
    ("lines", "drain", "detail"),
    [
        (
            [f"{GPUS_VISIBLE} 7", f"{GPUS_EXPECTED} 8"],
            "fleetwatch:gpu-lost GPUFallenOffBus",
            "the node: fleetwatch_gpus_visible 7 < fleetwatch_gpus_expected 8",
        ),
        (
            [f"{GPUS_VISIBLE} 7", f"{GPUS_PCI_PRESENT} 8"],
            "fleetwatch:gpu-lost GPUFallenOffBus",
            "the node: fleetwatch_gpus_visible 7 < fleetwatch_gpus_pci_present 8",
        ),
        (
            [f"{GPU_ROW_REMAP_FAILED}{{{GPU_A}}} 1"],
            "fleetwatch:row-remap-failed GPURowRemapFailed",
            "GPU 0 (GPU-a): fleetwatch_gpu_row_remap_failed 1 > 0",
        ),
        (
            [f'{NVLINK_UP}{{{GPU_A},link="3"}} 0', f'{NVLINK_UP}{{{GPU_A},link="4"}} 1'],
            "fleetwatch:nvlink-down NVLinkDown",
            "NVLink 3 of GPU 0 (GPU-a): fleetwatch_nvlink_up 0 == 0",
        ),
        (
            [f"{GPU_FABRIC_DEGRADED}{{{GPU_A}}} 1"],
            "fleetwatch:gpu-fabric GPUFabricDegraded",
            "GPU 0 (GPU-a): fleetwatch_gpu_fabric_degraded 1 == 1",
        ),
        (
            [f'{STORAGE_HUNG}{{mountpoint="/ckpt"}} 1'],
            "fleetwatch:checkpoint-mount-hung CheckpointMountHung",
            "mount /ckpt: fleetwatch_storage_hung 1 == 1",
        ),
    ],
)
def test_each_local_check_of_the_contract_drains(lines: list[str], drain: str, detail: str) -> None:
    found = judge("\n".join(lines) + "\n").findings
    assert [(f.drain_reason, f.detail) for f in found] == [(drain, detail)]


def test_a_healthy_scrape_finds_nothing_and_names_what_needs_prometheus() -> None:
    """Counters and states whose meaning is history (an Xid since the exporter started, a
    fabric still registering, a mount read-only by design) drain nothing from one scrape."""
    text = "\n".join(
        [
            scrape("NVIDIA H100 80GB HBM3", 60, 20).rstrip("\n"),
            f"{GPUS_VISIBLE} 8",
            f"{GPUS_EXPECTED} 8",
            f"{GPUS_PCI_PRESENT} 8",
            f"{GPU_ROW_REMAP_FAILED}{{{GPU_A}}} 0",
            f'{NVLINK_UP}{{{GPU_A},link="0"}} 1',
            f"{GPU_FABRIC_DEGRADED}{{{GPU_A}}} 0",
            f"{GPU_FABRIC_STATE_ID}{{{GPU_A}}} 2",
            f'{GPU_XID_ERRORS_TOTAL}{{{GPU_A},xid="79"}} 1',
            f'{STORAGE_HUNG}{{mountpoint="/ckpt"}} 0',
            f'{STORAGE_READ_ONLY}{{mountpoint="/ckpt"}} 1',
        ]
    )
    judgement = judge(text + "\n")
    assert judgement.findings == []
    assert set(judgement.not_judged) == NEEDS_PROMETHEUS
    assert "exporter started" in judgement.not_judged["GPUXidCritical"]


def test_a_person_lifted_reason_names_the_drain_before_one_that_clears() -> None:
    text = f"{GPU_FABRIC_DEGRADED}{{{GPU_A}}} 1\n{GPU_ROW_REMAP_FAILED}{{{GPU_A}}} 1\n"
    found = judge(text).findings
    assert [f.alert for f in found] == ["GPURowRemapFailed", "GPUFabricDegraded"]


def test_an_alert_the_config_takes_no_node_out_on_is_not_judged(tmp_path: Path) -> None:
    """The config the check runs with decides, as it decides the alert's taint label."""
    text = shipped_text("config.yaml")
    line = "  NVLinkDown: {severity: warning, for: 1m, taint: nvlink-down}\n"
    assert line in text
    path = tmp_path / "config.yaml"
    path.write_text(text.replace(line, "  NVLinkDown: {severity: warning, for: 1m}\n"))
    found = judge(f'{NVLINK_UP}{{{GPU_A},link="3"}} 0\n', load_config(path)).findings
    assert found == []


def test_a_threshold_the_config_lacks_is_named_not_judged() -> None:
    """A local check that reads a threshold the running config does not have judges nothing
    and says which key is missing."""
    shipped = load_contract()
    contract = Contract(
        clear=shipped.clear,
        manual=shipped.manual,
        alerts={"row-remap-failed": ("GPURowRemapFailed",)},
        local={
            "GPURowRemapFailed": (
                LocalCheck(
                    family=GPU_ROW_REMAP_FAILED.name, op=">", limit=Threshold(name="no_such")
                ),
            )
        },
    )
    text = f"{GPU_ROW_REMAP_FAILED}{{{GPU_A}}} 1\n"
    judgement = from_scrape(parse_exposition(text), contract, load_config())
    assert judgement.findings == []
    assert "thresholds.no_such" in judgement.not_judged["GPURowRemapFailed"]


def test_firing_alerts_drain_for_the_reasons_the_contract_declares() -> None:
    result = [
        (
            {
                "__name__": "ALERTS",
                "alertname": "GPUXidCritical",
                "alertstate": "firing",
                "fleetwatch_taint": "xid-critical",
                "node": "gpu01",
                "gpu": "2",
                "xid": "48",
            },
            1.0,
        ),
        (
            {
                "alertname": "SomeoneElsesAlert",
                "alertstate": "firing",
                "fleetwatch_taint": "not-declared",
                "node": "gpu01",
            },
            1.0,
        ),
    ]
    judgement = from_alerts(result, load_contract())
    assert [(f.drain_reason, f.detail) for f in judgement.findings] == [
        (
            "fleetwatch:xid-critical GPUXidCritical",
            "firing in Prometheus (gpu=2, node=gpu01, xid=48)",
        )
    ]
    assert (
        "'not-declared' is not in the remediation contract"
        in (judgement.not_judged["SomeoneElsesAlert"])
    )


def test_the_query_asks_for_this_nodes_firing_tainting_alerts() -> None:
    assert firing_alerts_query('gpu"01') == (
        'ALERTS{alertstate="firing", fleetwatch_taint!="", node="gpu\\"01"}'
    )


def test_a_taint_the_contract_does_not_know_is_named_not_judged(tmp_path: Path) -> None:
    """A config that opts an alert into tainting, read with the shipped contract (generated
    without it), says the contract must be generated from those rules."""
    text = shipped_text("config.yaml")
    line = "  InfiniBandPortDown: {severity: warning, for: 1m}\n"
    assert line in text
    path = tmp_path / "config.yaml"
    path.write_text(text.replace(line, line.replace("}", ", taint: infiniband-port-down}")))
    judgement = judge(f'{INFINIBAND_PORT_UP}{{device="mlx5_0",port="1"}} 0\n', load_config(path))
    assert judgement.findings == []
    assert "--healthcheck.contract" in judgement.not_judged["InfiniBandPortDown"]


@pytest.mark.parametrize("flag", ["--rules.config-file", "--healthcheck.rules-config"])
def test_the_override_file_sets_the_policy_the_check_reads(tmp_path: Path, flag: str) -> None:
    """`--rules.config-file` (the tainter's and the report's flag; the old
    `--healthcheck.rules-config` its deprecated spelling) names an override file merged over
    the shipped config, and the contract follows it: an H100 listed at 80 °C is judged by it,
    not by the shipped 78 °C."""
    override = write(tmp_path / "override.yaml")
    args = parse_args(["slurm", "healthcheck", f"{flag}={override}"])
    command = read_command(args)
    assert command.rules.config_file == override
    assert bool(deprecated_flags_used(args)) is (flag == "--healthcheck.rules-config")
    config = command.rules.load()
    judged = {
        celsius: [
            f.detail
            for f in from_scrape(
                parse_exposition(scrape(H100, celsius, 8)), command.rules.contract(config), config
            ).findings
            if f.alert == "GPUOverheating"
        ]
        for celsius in (79, 81)
    }
    assert [len(found) for found in judged.values()] == [0, 1]
    assert "80" in judged[81][0]
