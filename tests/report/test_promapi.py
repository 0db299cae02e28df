"""The report's Prometheus client and bad input, against an in-process fake API.

The fake speaks the parts of the Prometheus HTTP API the report uses and can be told to
fail in the ways real deployments fail: 5xx, refused credentials, rejected queries, and, for
one node batch only, an error, a request that never answers, or a partial answer
(Prometheus `warnings`, VictoriaMetrics `isPartial`).
"""

from __future__ import annotations

import asyncio
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from fleetwatch.cli import main
from fleetwatch.promclient import PrometheusAccess, PrometheusClientSettings
from fleetwatch.report import render
from fleetwatch.report.analysis import analyse
from fleetwatch.report.dataset import fetch
from fleetwatch.report.promapi import (
    MAX_POINTS,
    PrometheusAuthError,
    PrometheusClient,
    PrometheusUnreachable,
    chunks,
)
from fleetwatch.report.query import Window
from fleetwatch.report.query_table import QUERIES
from fleetwatch.sim.loopback_servers import free_port
from tests.promtls import NAMED_HOST, basic, guarded_api, server_context, write_pki

NAMES = [name for q in QUERIES for name in (*q.required, *(q.any_of() if q.any_of else ()))]


def access(url: str, *, token: Path | None = None) -> PrometheusAccess:
    """How the client reaches `url`, with a bearer token file or without credentials."""
    return PrometheusAccess(PrometheusClientSettings(url=url, bearer_token_file=token))


@dataclass
class FakePrometheus:
    """What the fake answers, and what it was asked."""

    names: list[str] = field(default_factory=lambda: list(NAMES))
    fail_first: int = 0
    status: int = 200
    reject: str = ""
    nodes: list[str] = field(default_factory=lambda: ["n1"])
    faults: dict[str, str] = field(default_factory=dict)
    """node -> "error" | "hang" | "warnings" | "partial", for the batches naming it."""
    requests: list[dict[str, str]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def values_handler(self, request: web.Request) -> web.Response:
        values = {"__name__": self.names, "node": self.nodes}.get(request.match_info["label"], [])
        return web.json_response({"status": "success", "data": values})

    def fault(self, query: str) -> str:
        return next((f for node, f in self.faults.items() if f'"{node}"' in query), "")

    async def range_handler(self, request: web.Request) -> web.Response:
        q = dict(request.query)
        self.requests.append(q)
        self.tokens.append(request.headers.get("Authorization", ""))
        if self.status != 200:
            return web.json_response({"status": "error"}, status=self.status)
        if len(self.requests) <= self.fail_first:
            return web.Response(status=503, text="overloaded")
        if self.reject and self.reject in q["query"]:
            return web.json_response(
                {
                    "status": "error",
                    "errorType": "bad_data",
                    "error": "parse error: unexpected character",
                },
                status=400,
            )
        fault = self.fault(q["query"])
        if fault == "error":
            return web.Response(status=503, text="vmselect: cannot fetch from vmstorage")
        if fault == "hang":
            await self.release.wait()  # set after the client timed out
        start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
        points = int((end - start) // step) + 1
        assert points <= MAX_POINTS
        values = [[start + i * step, "1"] for i in range(points)]
        node = re.search(r'node=~"([^"]*)"', q["query"])
        body: dict[str, object] = {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [{"metric": {"node": node[1] if node else "n1"}, "values": values}],
            },
        }
        if fault == "warnings":
            body["warnings"] = ["store 10.0.0.7:10901 did not answer"]
        if fault == "partial":
            body["isPartial"] = True
        return web.json_response(body)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/label/{label}/values", self.values_handler)
        app.router.add_get("/api/v1/query_range", self.range_handler)
        return app


@pytest.fixture
async def fake(aiohttp_server: object) -> tuple[FakePrometheus, TestServer]:
    state = FakePrometheus()
    server = await aiohttp_server(state.app())  # type: ignore[operator]
    return state, server


def url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


def test_chunks_respect_the_point_limit_and_cover_the_range() -> None:
    pieces = chunks(0, 29_999 * 60, 60)
    assert len(pieces) == 3
    assert [int((b - a) / 60) + 1 for a, b in pieces] == [MAX_POINTS, MAX_POINTS, 8000]
    assert pieces[0][0] == 0
    assert pieces[-1][1] == 29_999 * 60
    assert all(b + 60 == c for (_, b), (c, _) in itertools.pairwise(pieces))
    with pytest.raises(ValueError, match="invalid range"):
        chunks(10, 0, 60)


async def test_long_range_is_chunked_and_merged(
    fake: tuple[FakePrometheus, TestServer], tmp_path: Path
) -> None:
    state, server = fake
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    async with PrometheusClient(access=access(url(server), token=token), concurrency=2) as c:
        answer = await c.query_range("up", start=0, end=25_000 * 60, step=60)
    assert len(state.requests) == 3
    assert len(answer.series) == 1
    assert answer.warnings == []
    assert c.bytes_fetched > 25_000 * len('[0,"1"]')
    series = answer.series
    assert series[0].timestamps == [i * 60.0 for i in range(25_001)]
    assert state.tokens == ["Bearer s3cret"] * 3


async def test_5xx_is_retried(fake: tuple[FakePrometheus, TestServer]) -> None:
    state, server = fake
    state.fail_first = 2
    async with PrometheusClient(access=access(url(server)), retries=3, backoff_s=0.01) as c:
        answer = await c.query_range("up", start=0, end=60, step=60)
    assert len(state.requests) == 3
    assert len(answer.series) == 1


async def test_persistent_5xx_names_the_url(fake: tuple[FakePrometheus, TestServer]) -> None:
    state, server = fake
    state.fail_first = 100
    async with PrometheusClient(access=access(url(server)), retries=2, backoff_s=0.01) as c:
        with pytest.raises(PrometheusUnreachable, match=r"after 3 attempts: HTTP 503"):
            await c.query_range("up", start=0, end=60, step=60)


async def test_auth_failure_is_not_retried(fake: tuple[FakePrometheus, TestServer]) -> None:
    state, server = fake
    state.status = 401
    async with PrometheusClient(access=access(url(server)), backoff_s=0.01) as c:
        with pytest.raises(PrometheusAuthError, match="refused the credentials"):
            await c.query_range("up", start=0, end=60, step=60)
    assert len(state.requests) == 1


async def test_a_rejected_query_fails_only_its_own_tables(
    fake: tuple[FakePrometheus, TestServer],
) -> None:
    state, server = fake
    state.reject = "quantile_over_time(0.99"
    state.names.remove("fleetwatch_infiniband_port_errors_total")
    window = Window(start=0, end=7200, step=60, bucket=3600, threshold_celsius=78)
    async with PrometheusClient(access=access(url(server))) as c:
        dataset = await fetch(c, window)
    assert dataset.problems["temp_p99"] == (
        "query 'max by (node,gpu,uuid) (quantile_over_time(0.99, "
        'fleetwatch_gpu_temperature_celsius{sensor="gpu",node=~"n1"}[7200s]))\' failed: '
        "bad_data: parse error: unexpected character"
    )
    assert "fleetwatch_infiniband_port_errors_total has no samples" in dataset.problems["ib_errors"]
    report = analyse(dataset)
    thermal, activity = report.sections[0], report.sections[1]
    assert thermal.tables == {}
    assert "temp_p99: query" in thermal.notes[0]
    assert "tensor_active" not in " ".join(activity.notes)
    assert activity.tables


WINDOW = Window(start=0, end=7200, step=60, bucket=3600, threshold_celsius=78)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("error", "after 1 attempts: HTTP 503: vmselect: cannot fetch from vmstorage"),
        ("hang", "after 1 attempts: "),
        ("warnings", "the store answered partially: store 10.0.0.7:10901 did not answer"),
        ("partial", "the store answered partially: partial response: some storage nodes"),
    ],
)
async def test_a_failed_or_partial_batch_is_named_in_every_section_it_feeds(
    fake: tuple[FakePrometheus, TestServer],
    fault: str,
    reason: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The page's notes are what this test reads: its plots (matplotlib, two thirds of the
    # test's time) are left out; tests/report/test_render*.py draws them.
    monkeypatch.setattr(render, "_img", lambda plot, report: "")
    state, server = fake
    state.nodes = ["n1", "n2", "n3"]
    state.faults = {"n2": fault}
    # Only the hung batch should time out: the others answer at once, but a loaded machine took
    # more than half a second to serve some (seen failing in fast lanes at load 10-15), so the
    # timeout is 1 s where a batch hangs and one no answer needs elsewhere.
    timeout_s = 1.0 if fault == "hang" else 30.0
    # Every hung batch waits out its timeout: at 4 queries at a time, nine seconds of waits.
    async with PrometheusClient(
        access=access(url(server)), retries=0, timeout_s=timeout_s, concurrency=32
    ) as c:
        dataset = await fetch(c, WINDOW, batch_nodes=1)
    state.release.set()
    batched = [q.name for q in QUERIES if q.batched]
    # Every per-node query keeps the batches that answered, and names the one that did not.
    assert sorted(dataset.missing) == sorted(batched)
    for name in batched:
        assert [part.split(": ", 1)[0] for part in dataset.missing[name]] == ["n2"], name
        assert reason in dataset.missing[name][0]
        if "node" not in dataset.frames[name]:
            continue  # the fleet's full sample count: one row per batch, no node label
        nodes = set(dataset.frames[name]["node"])
        assert nodes == ({"n1", "n2", "n3"} if fault in ("warnings", "partial") else {"n1", "n3"})
    assert dataset.problems == {}
    report = analyse(dataset)
    for section in report.sections[:-1]:  # Remediation reads fleet-wide series only
        assert section.missing, section.title
        assert all(": n2: " in part for part in section.missing)
    page = render.to_html(report)
    assert "Incomplete data in Thermal, Activity, Training jobs, Fabric, Reliability" in page
    assert page.count("class='missing'>Missing data: ") == sum(
        len(s.missing) for s in report.sections
    )
    assert "**Incomplete data**" in render.to_markdown(report)


async def test_batches_cover_every_node_once_and_keep_one_node_per_regex(
    fake: tuple[FakePrometheus, TestServer],
) -> None:
    state, server = fake
    state.nodes = [f"n{i}.rack" for i in range(5)]
    async with PrometheusClient(access=access(url(server)), concurrency=2) as c:
        dataset = await fetch(c, WINDOW, batch_nodes=2)
    regexes = {m for r in state.requests for m in re.findall(r'node=~"([^"]*)"', r["query"])}
    # A node name's regex metacharacters are escaped (and the escape itself, for PromQL).
    assert regexes == {"n0\\\\.rack|n1\\\\.rack", "n2\\\\.rack|n3\\\\.rack", "n4\\\\.rack"}
    assert set(dataset.frames["temp_max"]["node"]) == regexes
    assert dataset.missing == {}


async def test_unreachable_prometheus() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with PrometheusClient(access=access(dead), retries=1, backoff_s=0.01) as c:
        with pytest.raises(PrometheusUnreachable, match=f"cannot reach Prometheus at {dead}"):
            await c.metric_names(start=0, end=60, match=None)


def test_cli_unreachable_exits_1_with_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    status = main(
        [
            "report",
            f"--prometheus.url={dead}",
            "--query.retries=0",
            f"--out={tmp_path}",
            "--log.format=text",
        ]
    )
    assert status == 1
    assert f"cannot reach Prometheus at {dead}" in capsys.readouterr().err
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ('--query.node-selector=node=="x"', "invalid node selector"),
        ("--since=yesterday", "invalid duration"),
        ("--until=noon", "invalid time 'noon'"),
        ("--prometheus.url=localhost:9090", "invalid URL"),
    ],
)
def test_bad_flags_exit_2_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--prometheus.url=http://127.0.0.1:1", f"--out={tmp_path}", flag])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_snapshot_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "snap").mkdir()
    assert main(["report", f"--snapshot.load={tmp_path / 'snap'}", f"--out={tmp_path}"]) == 1
    assert "not a fleetwatch report snapshot" in capsys.readouterr().err


def test_window_shorter_than_a_bucket_is_refused_before_any_query(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    status = main(
        [
            "report",
            f"--prometheus.url={dead}",
            "--since=5m",
            f"--out={tmp_path}",
            "--log.format=text",
        ]
    )
    assert status == 1
    err = capsys.readouterr().err
    assert "--since (5m) is shorter than one --bucket (1h)" in err
    assert "cannot reach Prometheus" not in err
    assert not (tmp_path / "report.html").exists()


async def test_the_report_reads_over_tls_with_basic_auth_and_names_refused_credentials(
    tmp_path: Path,
) -> None:
    pki = write_pki(tmp_path / "pki")
    password = tmp_path / "password"
    password.write_text("hunter2\n")
    context = server_context(pki.named_cert, pki.named_key)
    with guarded_api(context, lambda: basic("report", "hunter2")) as api:
        settings = PrometheusClientSettings(
            url=api.url,
            basic_auth_username="report",
            basic_auth_password_file=password,
            tls_ca_file=pki.ca,
            tls_server_name=NAMED_HOST,
        )
        async with PrometheusClient(access=PrometheusAccess(settings)) as client:
            answer = await client.query_range("up", start=0, end=60, step=60)
            assert [s.labels for s in answer.series] == [{"node": "gpu-1"}]
            password.write_text("wrong")
            with pytest.raises(PrometheusAuthError, match=r"--prometheus\.basic-auth"):
                await client.query_range("up", start=0, end=60, step=60)
        assert api.queries == ["up"]


def test_the_old_report_flags_still_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    status = main(
        [
            "report",
            f"--prometheus-url={dead}",
            '--node-selector=node="a"',
            "--query.retries=0",
            f"--out={tmp_path}",
            "--log.format=text",
        ]
    )
    assert status == 1
    err = capsys.readouterr().err
    assert f"cannot reach Prometheus at {dead}" in err
    assert "use --prometheus.url (FLEETWATCH_PROMETHEUS_URL)" in err
    assert "use --query.node-selector (FLEETWATCH_QUERY_NODE_SELECTOR)" in err
