"""The exporter's listener under hostile clients: slow heads, idle keep-alive, too many
connections, and Accept-Encoding weights; and its own HTTP server's answers to what it does
not serve (other methods and paths, bad or oversized heads, request bodies) and to pipelined
requests. A real listener on a real socket, raw clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator

import aiohttp
import pytest

from fleetwatch.cli import build_parser
from fleetwatch.exporter.engine import Engine
from fleetwatch.exporter.http import accepts_gzip, make_app
from fleetwatch.exporter.settings import ExportSettings
from fleetwatch.listener import Listener, ListenerSettings, listen
from fleetwatch.sim.loopback_servers import free_port

pytestmark = pytest.mark.timeout(60)

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n"
# How long a test waits for the server to act; far above every timeout configured here.
PATIENCE = 10.0


@pytest.mark.parametrize(
    ("header", "gzip"),
    [
        ("gzip", True),
        ("GZIP;Q=1", True),
        ("deflate, gzip;q=0.5", True),
        ("gzip;q=0", False),
        ("gzip; q=0.000", False),
        ("gzip;q=0, *", False),
        ("*", True),
        ("br;q=1, *;q=0.1", True),
        ("*;q=0", False),
        ("identity", False),
        ("", False),
        ("gzip;q=often", False),
    ],
)
def test_accept_encoding_weights(header: str, gzip: bool) -> None:
    assert accepts_gzip(header) is gzip


class Served:
    """A listener serving an engine without collectors (self-metrics only)."""

    def __init__(self, listener: Listener, port: int) -> None:
        self.listener = listener
        self.port = port

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@contextlib.asynccontextmanager
async def serving(limits: ListenerSettings) -> AsyncIterator[Served]:
    engine = Engine(collectors=[], max_staleness=1, hang_timeout=5, version="test")
    port = free_port()
    async with listen(make_app(engine), host="127.0.0.1", port=port, limits=limits) as listener:
        yield Served(listener, port)


def limits(**overrides: float) -> ListenerSettings:
    values = {"header_timeout": 30.0, "keepalive_timeout": 30.0, "max_connections": 16}
    values.update(overrides)
    return ListenerSettings(
        header_timeout=values["header_timeout"],
        keepalive_timeout=values["keepalive_timeout"],
        max_connections=int(values["max_connections"]),
    )


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length: (status, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), PATIENCE)
    lines = head.decode().split("\r\n")
    length = next(
        int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length:")
    )
    return int(lines[0].split()[1]), await asyncio.wait_for(reader.readexactly(length), PATIENCE)


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True when the server closes the connection (EOF) within PATIENCE seconds."""
    return await asyncio.wait_for(reader.read(), PATIENCE) == b""


async def test_a_half_sent_request_line_is_closed_after_the_header_timeout() -> None:
    async with serving(limits(header_timeout=0.3)) as served:
        reader, writer = await served.connect()
        writer.write(b"GET /metr")
        assert await closed_by_server(reader)
        assert served.listener.timed_out == 1
        writer.close()


async def test_a_trickled_head_is_closed_and_a_prompt_one_is_served() -> None:
    async with serving(limits(header_timeout=0.5)) as served:
        reader, writer = await served.connect()
        writer.write(REQUEST)
        status, body = await read_response(reader)
        assert status == 200
        assert b"fleetwatch_build_info" in body
        # A byte every 0.1 s keeps the socket busy but never completes the next head.
        for byte in b"GET /metrics HTTP/1.1\r\nHost: node\r\n":
            if reader.at_eof():
                break
            writer.write(bytes([byte]))
            await asyncio.sleep(0.1)
        assert await closed_by_server(reader)
        assert served.listener.timed_out == 1
        writer.close()


async def test_an_idle_keepalive_connection_is_closed() -> None:
    async with serving(limits(keepalive_timeout=0.5)) as served:
        reader, writer = await served.connect()
        writer.write(REQUEST)
        status, _ = await read_response(reader)
        assert status == 200
        assert await closed_by_server(reader)
        assert served.listener.timed_out == 0  # the keep-alive timeout closed it
        writer.close()


async def test_connections_beyond_the_cap_are_refused_not_held() -> None:
    async with serving(limits(max_connections=3)) as served:
        held = []
        for _ in range(3):
            reader, writer = await served.connect()
            writer.write(REQUEST)
            assert (await read_response(reader))[0] == 200
            held.append((reader, writer))
        for _ in range(20):
            reader, writer = await served.connect()
            status, body = await read_response(reader)
            assert (status, body) == (503, b"too many open connections\n")
            assert await closed_by_server(reader)
            writer.close()
        assert (served.listener.open, served.listener.peak, served.listener.refused) == (3, 3, 20)
        # A slot freed is a slot served.
        held[0][1].close()
        deadline = asyncio.get_running_loop().time() + PATIENCE
        while served.listener.open != 2:
            assert asyncio.get_running_loop().time() < deadline, "closed connection still counted"
            await asyncio.sleep(0.02)
        reader, writer = await served.connect()
        writer.write(REQUEST)
        assert (await read_response(reader))[0] == 200
        writer.close()
        for _, held_writer in held[1:]:
            held_writer.close()


async def test_metrics_honours_gzip_q_zero() -> None:
    async with serving(limits()) as served:
        url = f"http://127.0.0.1:{served.port}/metrics"
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            async with session.get(url, headers={"Accept-Encoding": "gzip;q=0"}) as plain:
                assert "Content-Encoding" not in plain.headers
                assert b"fleetwatch_build_info" in await plain.read()
            async with session.get(url, headers={"Accept-Encoding": "*"}) as zipped:
                assert zipped.headers["Content-Encoding"] == "gzip"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--web.header-timeout=0s", "invalid duration '0s': must be between 100ms and 5m"),
        ("--web.header-timeout=1h", "invalid duration '1h': must be between 100ms and 5m"),
        ("--web.keepalive-timeout=500ms", "invalid duration '500ms': must be between 1s and 1h"),
        ("--web.max-connections=0", "invalid whole number '0': must be in 1..10000"),
        ("--web.max-connections=many", "invalid whole number 'many'"),
        ("--shutdown.timeout=0s", "invalid duration '0s': must be between 1s and 5m"),
    ],
)
def test_listener_flags_are_bounded(
    flag: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["export", flag])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert flag.split("=", maxsplit=1)[0].lstrip("-") in error
    assert message in error


def test_listener_flags_reach_the_settings() -> None:
    args = build_parser().parse_args(
        ["export", "--web.header-timeout=2s", "--web.keepalive-timeout=1m",
         "--web.max-connections=8", "--shutdown.timeout=20s"]
    )  # fmt: skip
    settings = ExportSettings.from_args(args, ())
    assert settings.listener == ListenerSettings(
        header_timeout=2, keepalive_timeout=60, max_connections=8
    )
    assert settings.shutdown_timeout == 20


async def exchange(served: Served, raw: bytes) -> bytes:
    """Send `raw` on a new connection and read until the server closes it."""
    reader, writer = await served.connect()
    writer.write(raw)
    try:
        return await asyncio.wait_for(reader.read(), PATIENCE)
    finally:
        writer.close()


async def test_pipelined_requests_are_answered_in_order_and_head_has_no_body() -> None:
    async with serving(limits()) as served:
        answer = await exchange(
            served,
            b"GET /readyz HTTP/1.1\r\nHost: n\r\n\r\n"
            b"HEAD /metrics HTTP/1.1\r\nHost: n\r\n\r\n"
            b"GET /healthz?verbose=1 HTTP/1.1\r\nHost: n\r\nContent-Length: 3\r\n\r\nabc"
            b"GET /nowhere HTTP/1.1\r\nHost: n\r\nConnection: close\r\n\r\n",
        )
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert statuses == [b"503", b"200", b"200", b"404"]
    head_answer = answer.split(b"HTTP/1.1 200 OK\r\n", 1)[1].split(b"HTTP/1.1 ", 1)[0]
    assert b"Content-Type: text/plain; version=0.0.4" in head_answer
    assert head_answer.endswith(b"\r\n\r\n")  # HEAD: the head alone, though Content-Length
    assert b"fleetwatch_build_info" not in answer
    assert answer.endswith(b"404: Not Found\n")


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /metrics HTTP/1.1\r\nHost: n\r\nConnection: close\r\n\r\n", b"405"),
        (b"GET /metrics HTTP/1.0\r\n\r\n", b"200"),  # HTTP/1.0: closed after the answer
        (b"GET /metrics HTTP/2.0\r\n\r\n", b"505"),
        (b"GET metrics HTTP/1.1\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\n folded: header\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: -1\r\n\r\n", b"400"),
        (b"GET /" + b"m" * 9000 + b" HTTP/1.1\r\n\r\n", b"414"),
        (b"GET /metrics HTTP/1.1\r\n" + b"X-Big: " + b"x" * 20000 + b"\r\n\r\n", b"431"),
        (b"GET /metrics HTTP/1.1\r\n" + b"X-Big: " + b"x" * 20000, b"431"),  # never ends
    ],
)
async def test_what_the_server_does_not_serve_gets_an_answer_and_a_close(
    raw: bytes, status: bytes
) -> None:
    async with serving(limits()) as served:
        answer = await exchange(served, raw)
    assert answer.split(b" ", 2)[1] == status
    assert b"Connection: close" in answer.split(b"\r\n\r\n", 1)[0]
