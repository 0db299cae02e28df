"""The CLI: bad flags exit non-zero with one clear line; every flag reads FLEETWATCH_<FLAG>."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from fleetwatch.cli import build_parser, env_name, main
from fleetwatch.flags import duration, listen_address


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
    [("500ms", 0.5), ("5s", 5), ("1m30s", 90), ("24h", 86400), ("1.5s", 1.5), ("2d", 172800)],
)
def test_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5x", "s", "1m 30s", "-5s", "5s1"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid duration"):
        duration(text)


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
        (["export", "--collection-interval=soon"], "argument --collection-interval: invalid"),
        (["export", "--web.listen-address=nowhere"], "invalid listen address 'nowhere'"),
        (["export", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["export", "--collection-interval=0s"], "must be greater than 0"),
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
    monkeypatch.setenv("FLEETWATCH_COLLECTION_INTERVAL", "7s")
    monkeypatch.setenv("FLEETWATCH_COLLECTOR_GPU", "false")
    from fleetwatch import cli

    words = cli._env_arguments(cli._subparsers(parser)["export"])
    assert "--collection-interval=7s" in words
    assert "--no-collector.gpu" in words
    args = parser.parse_args(["export", *words, "--collection-interval=3s"])
    assert args.collection_interval == 3.0
    assert args.collector_gpu is False


def test_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    result = run_cli(
        "export",
        "--simulate=dgx-h100",
        env={"FLEETWATCH_COLLECTION_INTERVAL": "often", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "--collection-interval" in result.stderr
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
