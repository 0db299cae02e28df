"""The CLI: bad flags exit non-zero with one clear line; every flag reads FLEETWATCH_<FLAG>."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from fleetwatch.cli import build_parser, main, parse_args
from fleetwatch.collectors import COLLECTORS
from fleetwatch.collectors.podresources import PodResourcesSettings
from fleetwatch.collectors.xid import XidSettings
from fleetwatch.durations import format_duration
from fleetwatch.exporter.settings import ExportSettings
from fleetwatch.flags import (
    bounded_number,
    duration,
    env_arguments,
    env_name,
    listen_address,
    subparsers,
)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetwatch", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_env_names() -> None:
    assert env_name("--web.listen-address") == "FLEETWATCH_WEB_LISTEN_ADDRESS"
    assert env_name("--collector.gpu.interval") == "FLEETWATCH_COLLECTOR_GPU_INTERVAL"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("5s", 5),
        ("1m30s", 90),
        ("1h30m", 5400),
        ("24h", 86400),
        ("2d", 172800),
        ("1w", 604800),
        ("1y", 365 * 86400),
        ("1d12h30m15s500ms", 131415.5),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


# Prometheus's syntax: whole numbers, units from the largest down, each once.
@pytest.mark.parametrize(
    "text", ["", "5", "5x", "s", "1m 30s", "-5s", "5s1", "1.5s", "30s1m", "1m1m", "5S"]
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid duration"):
        duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"), [(60, "1m"), (90, "1m30s"), (0.5, "500ms"), (86400, "1d"), (2, "2s")]
)
def test_format_duration_reads_back(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-1", "11", "1e9", "x", ""])
def test_bounded_numbers_refuse_what_is_outside(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"invalid number {text!r}"):
        bounded_number(0, 10)(text)
    assert bounded_number(0, 10)("2.5") == 2.5


def _export_flags() -> list[argparse.Action]:
    export = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["export"]
    return [a for a in export._actions if a.option_strings]


def test_collector_flags_follow_one_naming_scheme() -> None:
    names = {spec.name for spec in COLLECTORS}
    engine = {
        "--collector.interval",
        "--collector.timeout",
        "--collector.max-staleness",
        "--collector.hang-timeout",
    }
    assert not engine & {f"--collector.{name}" for name in names}
    seen = 0
    for action in _export_flags():
        option = next(o for o in action.option_strings if not o.startswith("--no-"))
        if not option.startswith("--collector.") or option in engine:
            continue
        name, _, setting = option.removeprefix("--collector.").partition(".")
        assert name in names, option
        assert setting == "" or setting.replace("-", "").replace(".", "").isalnum(), option
        assert action.dest == option.lstrip("-").replace(".", "_").replace("-", "_"), option
        seen += 1
    assert seen > 2 * len(names)


def test_every_duration_flag_is_bounded() -> None:
    durations = [a for a in _export_flags() if a.metavar == "DURATION"]
    assert len(durations) >= 10
    for action in durations:
        assert callable(action.type)
        for bad in ("0s", "-1s", "nan", "inf", "5", "1000d"):
            with pytest.raises(argparse.ArgumentTypeError):
                action.type(bad)
        assert action.type("30s") == 30.0


def test_collector_settings_are_built_once_from_flags() -> None:
    args = parse_args(
        ["export", "--collector.xid.dedup-window=2s", "--collector.xid.source=kmsg,nvml"]
    )
    settings = ExportSettings.from_args(args, COLLECTORS)
    assert settings.collectors["xid"] == XidSettings(
        source=frozenset({"nvml", "kmsg"}), dedup_window=2.0
    )
    # Without flags, every collector's settings are its dataclass defaults.
    plain = ExportSettings.from_args(parse_args(["export"]), COLLECTORS)
    for spec in COLLECTORS:
        if spec.enabled_by_default:
            assert plain.collectors[spec.name] == spec.settings(), spec.name


def test_repeatable_flag_from_environment_is_replaced_by_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLEETWATCH_COLLECTOR_PODRESOURCES_RESOURCE_NAME", "a.io/gpu, b.io/gpu")
    monkeypatch.setenv("FLEETWATCH_COLLECTOR_XID_DEDUP_WINDOW", "3s")

    def podresources(*argv: str) -> PodResourcesSettings:
        settings = ExportSettings.from_args(parse_args(["export", *argv]), COLLECTORS)
        found: PodResourcesSettings = settings.collectors["podresources"]
        return found

    assert podresources().resource_name == ("a.io/gpu", "b.io/gpu")
    replaced = podresources("--collector.podresources.resource-name=c.io/gpu")
    assert replaced.resource_name == ("c.io/gpu",)
    separate = podresources("--collector.podresources.resource-name", "d.io/gpu")
    assert separate.resource_name == ("d.io/gpu",)
    # The other variables still apply.
    xid = ExportSettings.from_args(parse_args(["export"]), COLLECTORS).collectors["xid"]
    assert xid.dedup_window == 3.0


def test_listen_addresses() -> None:
    assert listen_address(":9842") == ("0.0.0.0", 9842)
    assert listen_address("127.0.0.1:1") == ("127.0.0.1", 1)
    assert listen_address("[::1]:9842") == ("::1", 9842)
    for bad in ("9842", "host", "1.2.3.4:99999", "[::1]9842"):
        with pytest.raises(argparse.ArgumentTypeError):
            listen_address(bad)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["export", "--collector.interval=soon"], "argument --collector.interval: invalid"),
        (["export", "--web.listen-address=nowhere"], "invalid listen address 'nowhere'"),
        (["export", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["export", "--collector.interval=0s"], "invalid duration '0s': must be between"),
        (["export", "--collector.interval=1ms"], "'1ms': must be between 100ms"),
        (["export", "--collector.gpu.interval=2d"], "'2d': must be between 100ms and 1h"),
        (["export", "--collector.hang-timeout=400d"], "must be between 1s and 1d"),
        (["export", "--collector.xid.dedup-window=-5"], "invalid duration '-5'"),
        (["export", "--collector.xid.dedup-window=nan"], "invalid duration 'nan'"),
        (["export", "--collector.xid.dedup-window=inf"], "invalid duration 'inf'"),
        (["export", "--collector.xid.dedup-window=10"], "invalid duration '10'"),
        (["export", "--collector.xid.dedup-window=0s"], "'0s': must be between 1ms and 1h"),
        (["export", "--collector.podresources.refresh-interval=15"], "invalid duration '15'"),
        (["export", "--collector.infiniband.tool-timeout=0s"], "must be between 10ms and 1m"),
        (["export", "--collector.infiniband.expected-rate=nan"], "invalid expected rate 'nan'"),
        (["export", "--collector.infiniband.expected-rate=inf"], "invalid expected rate 'inf'"),
        (["export", "--collector.infiniband.expected-rate=mlx5_0:0=400"], "'mlx5_0:0=400'"),
        (["export", "--collector.gpu.expected-count=nan"], "invalid whole number 'nan'"),
        (["export", "--collector.gpu.expected-count=2000"], "must be in 0..1024 GPUs"),
    ],
)
def test_bad_flags_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(("fleetwatch export: error:", "fleetwatch: error:"))
    assert message in err


def test_environment_fills_flags_and_command_line_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = build_parser()
    monkeypatch.setenv("FLEETWATCH_COLLECTOR_INTERVAL", "7s")
    monkeypatch.setenv("FLEETWATCH_COLLECTOR_GPU", "false")
    words = env_arguments(subparsers(parser)["export"])
    assert "--collector.interval=7s" in words
    assert "--no-collector.gpu" in words
    args = parser.parse_args(["export", *words, "--collector.interval=3s"])
    assert args.collector_interval == 3.0
    assert args.collector_gpu is False


def test_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    result = run_cli(
        "export",
        "--simulate=dgx-h100",
        env={"FLEETWATCH_COLLECTOR_INTERVAL": "often", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "--collector.interval" in result.stderr
    assert "invalid duration 'often'" in result.stderr


def test_bad_scenario_exits_2_naming_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: 8\ngpu_model: x\nnvlinks_per_gpu: 18\ninfiniband: []\nfans: 3\n")
    result = run_cli("export", f"--simulate={bad}", "--web.listen-address=127.0.0.1:0")
    assert result.returncode == 2
    assert result.stderr.strip() == f"fleetwatch export: error: {bad}: fans: unknown key"


def test_simulate_list_and_version() -> None:
    listing = run_cli("export", "--simulate", "list")
    assert listing.returncode == 0
    names = [line.split("\t")[0] for line in listing.stdout.splitlines()]
    assert {"dgx-h100", "demo"} <= set(names)
    version = run_cli("--version")
    assert version.returncode == 0
    assert version.stdout.startswith("fleetwatch ")


def test_port_in_use_is_one_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = run_cli("export", "--simulate=dgx-h100", f"--web.listen-address=127.0.0.1:{port}")
    assert result.returncode == 1
    assert "fleetwatch export: error:" in result.stderr
    assert "address already in use" in result.stderr.lower()


def test_cli_keeps_heavy_libraries_out_of_the_exporter() -> None:
    """Every process builds the whole parser; pandas & co. must load only where they run."""
    probe = (
        "import sys; from fleetwatch.cli import build_parser; build_parser(); "
        "print(','.join(m for m in ('pandas', 'matplotlib', 'pyarrow', 'numpy', "
        "'kubernetes_asyncio', 'grafanalib') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == ""
