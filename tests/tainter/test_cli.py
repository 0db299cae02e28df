"""Flag handling of `fleetwatch taint` / `untaint` / `breaker`: clear errors, sane settings."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from fleetwatch.tainter import cli


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fleetwatch")
    cli.add_subcommands(parser.add_subparsers(dest="command"))
    return parser.parse_args(list(argv))


def test_token_or_explicit_insecure_flag_is_required(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"--web\.token-file is required"):
        cli.settings_from_args(parse("taint"))
    settings = cli.settings_from_args(parse("taint", "--web.insecure-no-token"))
    assert settings.token == b""
    token = tmp_path / "token"
    token.write_text("abc\n")
    settings = cli.settings_from_args(parse("taint", f"--web.token-file={token}"))
    assert settings.token == b"abc"
    token.write_text("  \n")
    with pytest.raises(SystemExit, match="is empty"):
        cli.settings_from_args(parse("taint", f"--web.token-file={token}"))


def test_defaults_and_overrides() -> None:
    settings = cli.settings_from_args(
        parse(
            "taint",
            "--web.insecure-no-token",
            "--untaint.clear-celsius=70",
            '--untaint.evidence=nvlink-down=max(fleetwatch_nvlink_up{node="$node"}) == 1',
            "--untaint.manual-reason=xid",
            "--breaker.max-fraction=0.5",
            "--dry-run",
        )
    )
    assert "< 70" in settings.evidence_queries["gpu-overheat"]
    assert settings.evidence_queries["nvlink-down"].startswith("max(fleetwatch_nvlink_up")
    assert settings.controller.manual_reasons == {"xid"}
    assert settings.controller.dry_run
    assert settings.breaker.max_fraction == 0.5
    assert cli.settings_from_args(
        parse("taint", "--web.insecure-no-token")
    ).controller.manual_reasons == {"gpu-lost", "xid", "xid-critical", "row-remap-failed"}


@pytest.mark.parametrize(
    ("flag", "problem"),
    [
        ("--breaker.max-fraction=1.5", "invalid fraction '1.5'"),
        ("--untaint.evidence=nonsense", "expected REASON=PROMQL"),
        ("--untaint.hold=soon", "invalid duration 'soon'"),
        ("--untaint.manual-reason=bad reason", "not a valid taint key name"),
        ("--breaker.max-nodes=-1", "invalid count '-1'"),
    ],
)
def test_bad_flags_name_the_problem(
    flag: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse("taint", "--web.insecure-no-token", flag)
    assert problem in capsys.readouterr().err


def test_untaint_and_breaker_parse() -> None:
    args = parse("untaint", "gpu-1", "--reason=xid", "--reason=gpu-lost")
    assert (args.node, args.reason) == ("gpu-1", ["xid", "gpu-lost"])
    args = parse("breaker", "reset", "--tainter-url=http://127.0.0.1:9848/")
    assert args.tainter_url == "http://127.0.0.1:9848"
