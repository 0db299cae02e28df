"""Flag handling of `fleetwatch taint` / `untaint` / `breaker`: clear errors, sane settings."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from fleetwatch.cli import build_parser, main, parse_args
from fleetwatch.flags import deprecated_flags_used
from fleetwatch.rules.contract import load_contract
from fleetwatch.tainter import cli


def parse(*argv: str) -> argparse.Namespace:
    """The command line alone, without FLEETWATCH_* variables."""
    return build_parser().parse_args(list(argv))


def test_node_events_go_where_the_api_server_accepts_them() -> None:
    assert cli.settings_from_args(parse("taint", "--web.insecure-no-token")).event_namespace == (
        "default"
    )
    with pytest.raises(SystemExit, match=r"accepted only in 'default'"):
        cli.settings_from_args(
            parse("taint", "--web.insecure-no-token", "--events.namespace=monitoring")
        )


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


def test_untaint_defaults_are_the_rules_contract_and_flags_add_to_it() -> None:
    contract = load_contract()
    defaults = cli.settings_from_args(parse("taint", "--web.insecure-no-token"))
    assert defaults.evidence_queries == contract.clear
    assert set(defaults.controller.manual_reasons) == set(contract.manual)
    assert {"xid-critical", "gpu-lost", "row-remap-failed"} <= set(contract.manual)
    settings = cli.settings_from_args(
        parse(
            "taint",
            "--web.insecure-no-token",
            '--untaint.evidence=nvlink-down=max(fleetwatch_nvlink_up{node="$node"}) == 1',
            "--untaint.manual-reason=custom-check",
            "--breaker.max-fraction=0.5",
            "--dry-run",
        )
    )
    # --untaint.evidence replaces one reason's clear condition; the others stay the rules'.
    assert settings.evidence_queries["nvlink-down"].startswith("max(fleetwatch_nvlink_up")
    assert settings.evidence_queries["gpu-overheat"] == contract.clear["gpu-overheat"]
    # --untaint.manual-reason adds to the reasons the contract declares manual.
    assert settings.controller.manual_reasons == (*sorted(contract.manual), "custom-check")
    assert settings.controller.dry_run
    assert settings.breaker.max_fraction == 0.5


def test_the_retired_clear_celsius_flag_is_refused_with_what_replaces_it() -> None:
    with pytest.raises(
        SystemExit,
        match=r"--untaint\.clear-celsius is no longer read.*"
        r"thresholds\.untaint_gpu_temperature_celsius.*--untaint\.evidence",
    ):
        cli.settings_from_args(
            parse("taint", "--web.insecure-no-token", "--untaint.clear-celsius=70")
        )


@pytest.mark.parametrize(
    ("flag", "problem"),
    [
        ("--breaker.max-fraction=1.5", "invalid number '1.5': must be in 0..1"),
        ("--breaker.max-fraction=nan", "invalid number 'nan': must be in 0..1"),
        ("--untaint.evidence=nonsense", "expected REASON=PROMQL"),
        ("--untaint.hold=soon", "invalid duration 'soon'"),
        ("--untaint.manual-reason=bad reason", "not a valid taint key name"),
        ("--breaker.max-new-taints=-1", "invalid whole number '-1': must be in 0..100000"),
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


def test_breaker_and_quarantine_flags_and_the_old_breaker_spelling() -> None:
    settings = cli.settings_from_args(parse("taint", "--web.insecure-no-token"))
    assert (settings.breaker.max_new_taints, settings.breaker.window) == (10, 3600.0)
    quarantine = settings.controller.quarantine
    assert (quarantine.after, quarantine.window) == (3, 86400.0)
    args = parse_args(
        [
            "taint",
            "--web.insecure-no-token",
            "--breaker.max-nodes=4",
            "--breaker.window=30m",
            "--quarantine.after=5",
            "--quarantine.window=2d",
        ]
    )
    settings = cli.settings_from_args(args)
    assert (settings.breaker.max_new_taints, settings.breaker.window) == (4, 1800.0)
    assert deprecated_flags_used(args) == {"--breaker.max-nodes": "--breaker.max-new-taints"}
    quarantine = settings.controller.quarantine
    assert (quarantine.after, quarantine.window) == (5, 172800.0)


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
    assert (election.advertise_url, election.forward_timeout) == (None, 5.0)
    handing_over = cli.settings_from_args(
        parse(
            "taint",
            "--web.insecure-no-token",
            "--leader-elect",
            "--leader-elect.advertise-url=http://10.0.0.7:9848/",
            "--leader-elect.forward-timeout=2s",
        )
    ).election
    assert (handing_over.advertise_url, handing_over.forward_timeout) == (
        "http://10.0.0.7:9848",
        2.0,
    )
    with pytest.raises(SystemExit, match="advertise-url needs --leader-elect"):
        cli.settings_from_args(
            parse("taint", "--web.insecure-no-token", "--leader-elect.advertise-url=http://a:1")
        )
    for bad in ("--leader-elect.advertise-url=10.0.0.7:9848", "--leader-elect.forward-timeout=2m"):
        with pytest.raises(SystemExit):
            parse("taint", "--web.insecure-no-token", "--leader-elect", bad)


def test_renamed_listener_flag_keeps_its_old_spelling_for_one_release(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse_args(["taint", "--web.insecure-no-token", "--web.read-header-timeout=3s"])
    assert cli.settings_from_args(args).listener.header_timeout == 3.0
    assert deprecated_flags_used(args) == {"--web.read-header-timeout": "--web.header-timeout"}
    assert deprecated_flags_used(parse_args(["taint", "--web.header-timeout=3s"])) == {}
    # Its environment variable too; the new spelling's variable wins over the old one's.
    monkeypatch.setenv("FLEETWATCH_WEB_READ_HEADER_TIMEOUT", "4s")
    args = parse_args(["taint", "--web.insecure-no-token"])
    assert cli.settings_from_args(args).listener.header_timeout == 4.0
    monkeypatch.setenv("FLEETWATCH_WEB_HEADER_TIMEOUT", "5s")
    args = parse_args(["taint", "--web.insecure-no-token"])
    assert cli.settings_from_args(args).listener.header_timeout == 5.0
    assert deprecated_flags_used(args) == {}
    # Used on the command line and in the environment, it is logged once, as a warning.
    monkeypatch.delenv("FLEETWATCH_WEB_HEADER_TIMEOUT")
    ran: list[float] = []

    def run(args: argparse.Namespace) -> int:
        ran.append(cli.settings_from_args(args).listener.header_timeout)
        return 0

    monkeypatch.setattr(cli, "_run_taint", run)
    monkeypatch.setenv("FLEETWATCH_WEB_READ_HEADER_TIMEOUT", "7s")
    assert main(["taint", "--web.insecure-no-token", "--web.read-header-timeout=6s"]) == 0
    assert ran == [6.0]
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    warnings = [line for line in lines if "deprecated" in line["msg"]]
    assert len(warnings) == 1, lines
    assert warnings[0]["level"] == "warning"
    assert warnings[0]["flag"] == "--web.read-header-timeout"
    assert "use --web.header-timeout (FLEETWATCH_WEB_HEADER_TIMEOUT)" in warnings[0]["msg"]


@pytest.mark.parametrize(
    ("flag", "problem"),
    [
        ("--untaint.hold=8d", "invalid duration '8d': must be between 0s and 7d"),
        ("--untaint.hold=-1s", "invalid duration '-1s'"),
        ("--reconcile.interval=0s", "invalid duration '0s': must be between 1s and 1h"),
        ("--reconcile.interval=2h", "invalid duration '2h': must be between 1s and 1h"),
        ("--kube.concurrency=0", "invalid whole number '0': must be in 1..1000"),
        ("--kube.concurrency=5000", "invalid whole number '5000': must be in 1..1000"),
        ("--untaint.clear-celsius=0", "invalid number '0': must be in 1..150"),
        ("--untaint.clear-celsius=-5", "invalid number '-5': must be in 1..150"),
        ("--untaint.clear-celsius=1e6", "invalid number '1e6': must be in 1..150"),
        ("--leader-elect.lease-duration=0s", "invalid duration '0s': must be between 1s and 1h"),
        ("--web.keepalive-timeout=2h", "invalid duration '2h': must be between 1s and 1h"),
        ("--web.read-header-timeout=0s", "invalid duration '0s': must be between 100ms and 5m"),
        ("--breaker.max-fraction=-0.1", "invalid number '-0.1': must be in 0..1"),
        ("--breaker.window=0s", "invalid duration '0s': must be between 1m and 7d"),
        ("--quarantine.after=0", "invalid whole number '0': must be in 2..100"),
        ("--quarantine.after=-3", "invalid whole number '-3': must be in 2..100"),
        ("--quarantine.after=1000", "invalid whole number '1000': must be in 2..100"),
        ("--quarantine.window=abc", "invalid duration 'abc'"),
        ("--quarantine.window=90d", "invalid duration '90d': must be between 1m and 30d"),
    ],
)
def test_out_of_bounds_values_exit_2_with_one_line(
    flag: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["taint", "--web.insecure-no-token", flag])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("fleetwatch taint: error: argument ")
    assert problem in err


@pytest.mark.parametrize("command", ["taint", "report"])
def test_every_duration_and_number_flag_is_bounded(command: str) -> None:
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    actions = [a for a in subparsers.choices[command]._actions if a.option_strings]
    durations = [a for a in actions if a.metavar == "DURATION"]
    numbers = [a for a in actions if a.metavar in ("N", "NUMBER")]
    assert len(durations) >= 4
    assert len(numbers) >= 2
    for action in durations:
        assert callable(action.type)
        for bad in ("-1s", "nan", "inf", "5", "1000d", "1.5s"):
            with pytest.raises(argparse.ArgumentTypeError):
                action.type(bad)
    for action in numbers:
        assert callable(action.type)
        for bad in ("-1", "nan", "inf", "1e12", "x"):
            with pytest.raises(argparse.ArgumentTypeError):
                action.type(bad)


def test_the_prometheus_client_group_reaches_the_tainter(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    settings = cli.settings_from_args(
        parse(
            "taint",
            "--web.insecure-no-token",
            "--prometheus.url=https://prometheus:9090",
            f"--prometheus.bearer-token-file={token}",
            "--prometheus.tls.server-name=prometheus.monitoring.svc",
        )
    )
    assert settings.prometheus.url == "https://prometheus:9090"
    assert settings.prometheus.bearer_token_file == token
    assert settings.prometheus.tls_server_name == "prometheus.monitoring.svc"
    assert cli.settings_from_args(parse("taint", "--web.insecure-no-token")).prometheus.url is None


@pytest.mark.parametrize(
    ("words", "problem"),
    [
        (["--prometheus.basic-auth.username=u"], "--prometheus.url is needed"),
        (
            ["--prometheus.url=http://p:9090", "--prometheus.basic-auth.username=u", "BEARER"],
            "--prometheus.bearer-token-file and --prometheus.basic-auth.* exclude each other",
        ),
        (
            ["--prometheus.url=http://p:9090", "--prometheus.tls.server-name=p"],
            "--prometheus.tls.* needs an https:// --prometheus.url",
        ),
    ],
)
def test_a_client_option_that_cannot_be_honoured_stops_the_start(
    tmp_path: Path, words: list[str], problem: str
) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    bearer = f"--prometheus.bearer-token-file={token}"
    argv = ["taint", "--web.insecure-no-token", *(bearer if w == "BEARER" else w for w in words)]
    with pytest.raises(SystemExit) as exit_:
        cli.settings_from_args(parse(*argv))
    message = str(exit_.value)
    assert message.startswith("fleetwatch taint: error: ")
    assert problem in message
    assert "\n" not in message


def test_the_renamed_tainter_flags_keep_their_old_spellings() -> None:
    args = parse_args(
        [
            "taint",
            "--web.insecure-no-token",
            "--prometheus-url=http://p:9090",
            "--alertmanager-url=http://a:9093",
            "--reconcile-interval=1m",
            "--node-selector=gpu=true",
        ]
    )
    settings = cli.settings_from_args(args)
    assert settings.prometheus.url == "http://p:9090"
    assert settings.alertmanager_url == "http://a:9093"
    assert settings.reconcile_interval == 60.0
    assert settings.controller.node_selector == "gpu=true"
    assert deprecated_flags_used(args) == {
        "--prometheus-url": "--prometheus.url",
        "--alertmanager-url": "--alertmanager.url",
        "--reconcile-interval": "--reconcile.interval",
        "--node-selector": "--breaker.node-selector",
    }
