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
    assert settings.token_file is None
    token = tmp_path / "token"
    token.write_text("abc\n")
    settings = cli.settings_from_args(parse("taint", f"--web.token-file={token}"))
    assert settings.token_file == token
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
    assert settings.controller.manual_reasons == ("xid",)
    assert settings.controller.dry_run
    assert settings.breaker.max_fraction == 0.5
    assert cli.settings_from_args(
        parse("taint", "--web.insecure-no-token")
    ).controller.manual_reasons == ("gpu-lost", "xid", "xid-critical", "row-remap-failed")


@pytest.mark.parametrize(
    ("flag", "problem"),
    [
        ("--breaker.max-fraction=1.5", "invalid number '1.5': must be in 0..1"),
        ("--breaker.max-fraction=nan", "invalid number 'nan': must be in 0..1"),
        ("--untaint.evidence=nonsense", "expected REASON=PROMQL"),
        ("--untaint.hold=soon", "invalid duration 'soon'"),
        ("--untaint.manual-reason=bad reason", "not a valid taint key name"),
        ("--breaker.max-nodes=-1", "invalid whole number '-1': must be in 0..100000"),
        ("--web.max-body-bytes=0", "invalid whole number '0': must be in 1..67108864 bytes"),
        ("--taint.max-per-node=0", "invalid whole number '0': must be in 1..100"),
        ("--taint.allow-noexecute=gpu-lost,bad reason", "not a valid taint key name"),
        ("--leader-elect.retry-period=0s", "invalid duration '0s'"),
        ("--web.header-timeout=never", "invalid duration 'never'"),
        ("--web.max-connections=0", "invalid whole number '0': must be in 1..10000"),
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
    args = parse("breaker", "reset", "--leader-elect.namespace=monitoring")
    assert (args.leader_elect_namespace, args.leader_elect_name) == (
        "monitoring",
        "fleetwatch-tainter",
    )
    with pytest.raises(SystemExit):  # the webhook is no way to reset the breaker any more
        parse("breaker", "reset", "--tainter-url=http://127.0.0.1:9848")


def test_policy_defaults_are_safe_and_come_from_the_shipped_rules() -> None:
    settings = cli.settings_from_args(parse("taint", "--web.insecure-no-token"))
    policy = settings.policy
    assert policy.declared_reasons is not None
    assert {"gpu-overheat", "gpu-lost", "xid-critical"} <= policy.declared_reasons
    assert "made-up-reason" not in policy.declared_reasons
    assert (policy.allow_noexecute, policy.max_per_node) == (frozenset(), 8)
    assert not settings.election.enabled
    assert settings.max_body_bytes == 1 << 20
    chart = cli.settings_from_args(
        parse(
            "taint",
            "--web.insecure-no-token",
            "--taint.declared-reasons=gpu-overheat,custom",
            "--taint.allow-noexecute=gpu-lost",
            "--taint.max-per-node=3",
        )
    ).policy
    assert chart.declared_reasons == frozenset({"gpu-overheat", "custom"})
    assert (chart.allow_noexecute, chart.max_per_node) == (frozenset({"gpu-lost"}), 3)
    anything = cli.settings_from_args(
        parse("taint", "--web.insecure-no-token", "--taint.allow-undeclared-reasons")
    ).policy
    assert anything.declared_reasons is None


def test_leader_election_flags_and_their_rules() -> None:
    settings = cli.settings_from_args(
        parse("taint", "--web.insecure-no-token", "--leader-elect", "--leader-elect.namespace=fw")
    )
    election = settings.election
    assert settings.election.enabled
    assert (election.namespace, election.name) == ("fw", "fleetwatch-tainter")
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == (
        15.0,
        10.0,
        2.0,
    )
    with pytest.raises(SystemExit, match="lease-duration must be longer"):
        cli.settings_from_args(
            parse("taint", "--web.insecure-no-token", "--leader-elect.lease-duration=10s")
        )
    with pytest.raises(SystemExit, match=r"1\.2 x"):
        cli.settings_from_args(
            parse("taint", "--web.insecure-no-token", "--leader-elect.retry-period=9s")
        )
