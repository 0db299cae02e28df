"""The collection engine under fault injection: raising, hanging, slow and healthy collectors.

Collectors here are small fakes with the real Collector protocol; the engine runs them in
real worker threads on a real event loop, served through the exporter's real HTTP server.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp
import pytest

from fleetwatch.catalog.spec import MetricSpec
from fleetwatch.collectors.families import FamilyBuilder, SeriesFamily
from fleetwatch.exporter.engine import Engine, ScheduledCollector
from fleetwatch.exporter.http import make_app
from fleetwatch.listener import ListenerSettings, listen
from fleetwatch.sim.loopback_servers import free_port

pytestmark = pytest.mark.timeout(60)


@dataclass(frozen=True)
class Reply:
    """A response read whole."""

    status: int
    headers: dict[str, str]
    body: bytes

    async def read(self) -> bytes:
        return self.body

    async def text(self) -> str:
        return self.body.decode()


class Client:
    """The exporter's HTTP server for `engine` on a loopback port, and an aiohttp client."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._port = free_port()
        self._stack = contextlib.AsyncExitStack()
        self._session: aiohttp.ClientSession | None = None

    async def start_server(self) -> None:
        await self._stack.enter_async_context(
            listen(
                make_app(self._engine),
                host="127.0.0.1",
                port=self._port,
                limits=ListenerSettings(),
            )
        )
        self._session = await self._stack.enter_async_context(aiohttp.ClientSession())

    async def get(
        self, path: str, *, headers: dict[str, str] | None = None, auto_decompress: bool = True
    ) -> Reply:
        """The response to `GET path`, its body read."""
        assert self._session is not None
        url = f"http://127.0.0.1:{self._port}{path}"
        async with self._session.get(
            url, headers=headers, auto_decompress=auto_decompress
        ) as response:
            return Reply(response.status, dict(response.headers), await response.read())

    async def close(self) -> None:
        await self._stack.aclose()


class Steady:
    """Always succeeds with one gauge."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    def collect(self) -> Iterable[SeriesFamily]:
        self.calls += 1
        name = f"fleetwatch_test_{self.name}_value"
        builder = FamilyBuilder([MetricSpec(name, "gauge", "A test value.", ("k",))])
        builder.add(name, ("a",), 1.0)
        return builder.families()

    def close(self) -> None:
        return None


class Raising(Steady):
    """Succeeds once, then raises on every later run."""

    def collect(self) -> Iterable[SeriesFamily]:
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("NVML returned Unknown Error")
        return Steady.collect(self)


class Hanging(Steady):
    """Succeeds once, then blocks like a wedged driver until released."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.release = threading.Event()
        self.entered = 0
        self.lock = threading.Lock()

    def collect(self) -> Iterable[SeriesFamily]:
        with self.lock:
            self.entered += 1
            first = self.entered == 1
        if not first:
            self.release.wait(30)
        return Steady.collect(self)


class Slow(Steady):
    """Takes longer than a scrape would tolerate, but finishes inside its deadline."""

    def __init__(self, name: str, seconds: float) -> None:
        super().__init__(name)
        self.seconds = seconds

    def collect(self) -> Iterable[SeriesFamily]:
        threading.Event().wait(self.seconds)
        return Steady.collect(self)


def scheduled(
    collector: Steady, *, interval: float = 0.2, timeout: float = 0.15
) -> ScheduledCollector:
    return ScheduledCollector(
        name=collector.name, collector=collector, interval=interval, timeout=timeout
    )


async def poll(predicate, *, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    """Await `predicate()` becoming truthy, or fail."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met before the deadline")


def sample_value(text: str, prefix: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_failing_and_hung_collectors_do_not_disturb_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    steady, raising, hanging = Steady("steady"), Raising("raising"), Hanging("hanging")
    slow = Slow("slow", 0.1)
    engine = Engine(
        collectors=[
            scheduled(steady),
            scheduled(raising),
            scheduled(hanging),
            scheduled(slow, interval=0.3, timeout=0.25),
        ],
        max_staleness=60.0,
        hang_timeout=0.6,
        version="test",
    )
    caplog.set_level(logging.INFO)
    client = Client(engine)
    await client.start_server()
    try:
        await engine.start()
        await poll(lambda: engine.ready, timeout=5)
        assert (await client.get("/readyz")).status == 200

        # The hung collector is reported down, and no second run is stacked behind it.
        async def hung_reported() -> bool:
            text = await (await client.get("/metrics")).text()
            return sample_value(text, 'fleetwatch_collector_up{collector="hanging"}') == 0.0

        deadline = asyncio.get_running_loop().time() + 5
        while not await hung_reported():
            assert asyncio.get_running_loop().time() < deadline, "hung collector never reported"
            await asyncio.sleep(0.05)
        await poll(lambda: engine.states[2].skipped >= 2)
        assert hanging.entered == 2, "a second call was stacked behind the hung one"

        text = await (await asyncio.wait_for(client.get("/metrics"), 2)).text()
        # Other collectors' series are intact and their self-metrics say up.
        assert 'fleetwatch_test_steady_value{k="a"} 1.0' in text
        assert 'fleetwatch_test_slow_value{k="a"} 1.0' in text
        assert sample_value(text, 'fleetwatch_collector_up{collector="steady"}') == 1.0
        assert sample_value(text, 'fleetwatch_collector_up{collector="slow"}') == 1.0
        assert sample_value(text, 'fleetwatch_collector_up{collector="raising"}') == 0.0
        errors = sample_value(text, 'fleetwatch_collector_errors_total{collector="raising"}')
        assert errors is not None
        assert errors >= 1
        # Failing collectors' last good series are served until they go stale.
        assert 'fleetwatch_test_raising_value{k="a"} 1.0' in text

        # The reason is logged with the collector's name.
        reasons = [r for r in caplog.records if getattr(r, "collector", None) == "raising"]
        assert any("NVML returned Unknown Error" in str(getattr(r, "reason", "")) for r in reasons)
        deadlines = [r for r in caplog.records if getattr(r, "collector", None) == "hanging"]
        assert any("deadline" in str(getattr(r, "reason", "")) for r in deadlines)
        # Skipped runs are counted each time but logged once a minute, not every interval.
        blocked = [r for r in deadlines if r.getMessage().startswith("collector still blocked")]
        assert engine.states[2].skipped >= 2
        assert len(blocked) == 1

        # Liveness fails once the hang outlasts the hang timeout, and the metric says so.
        await poll(engine.hung)
        response = await client.get("/healthz")
        assert response.status == 503
        assert "hanging blocked for" in await response.text()
        text = await (await client.get("/metrics")).text()
        assert sample_value(text, 'fleetwatch_collector_hung{collector="hanging"}') == 1.0

        # Released, the collector recovers and liveness passes again.
        hanging.release.set()
        await poll(lambda: engine.states[2].up)
        assert (await client.get("/healthz")).status == 200
    finally:
        hanging.release.set()
        await engine.stop()
        await client.close()


async def test_stale_series_are_dropped_after_max_staleness() -> None:
    raising = Raising("raising")
    now = [1000.0]
    engine = Engine(
        collectors=[scheduled(raising, interval=0.05, timeout=1.0)],
        max_staleness=30.0,
        hang_timeout=5.0,
        version="test",
        clock=lambda: now[0],
    )
    await engine.start()
    try:
        await poll(lambda: engine.states[0].errors >= 1)
        # Failing, but its last good series are younger than max_staleness: still served.
        assert b'fleetwatch_test_raising_value{k="a"} 1.0' in engine.exposition()
        assert b'fleetwatch_collector_up{collector="raising"} 0.0' in engine.exposition()
        now[0] += 29.0
        assert b"fleetwatch_test_raising_value" in engine.exposition()
        now[0] += 2.0
        assert b"fleetwatch_test_raising_value" not in engine.exposition()
        assert b'fleetwatch_collector_up{collector="raising"} 0.0' in engine.exposition()
    finally:
        await engine.stop()


async def test_metrics_is_gzipped_when_asked_and_identical() -> None:
    engine = Engine(
        collectors=[scheduled(Steady("steady"))], max_staleness=1, hang_timeout=5, version="9.9"
    )
    client = Client(engine)
    await client.start_server()
    try:
        assert (await client.get("/readyz")).status == 503
        await engine.start()
        await poll(lambda: engine.ready, timeout=5)
        plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        zipped = await client.get(
            "/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False
        )
        assert zipped.headers["Content-Encoding"] == "gzip"
        assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        body = await plain.read()
        assert gzip.decompress(await zipped.read()) == body
        assert b'fleetwatch_build_info{python_version="' in body
        assert b'version="9.9"} 1.0' in body
        landing = await (await client.get("/")).text()
        assert "fleetwatch exporter" in landing
        assert "steady" in landing
    finally:
        await engine.stop()
        await client.close()


def collector_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"collector-{name}"]


async def test_each_collector_runs_on_one_long_lived_thread() -> None:
    first, second = Steady("first"), Steady("second")
    engine = Engine(
        collectors=[scheduled(first, interval=0.02), scheduled(second, interval=0.02)],
        max_staleness=1,
        hang_timeout=5,
        version="test",
    )
    await engine.start()
    try:
        await poll(lambda: first.calls >= 10 and second.calls >= 10)
        assert len(collector_threads("first")) == 1
        assert len(collector_threads("second")) == 1
    finally:
        assert await engine.stop() == []
    assert collector_threads("first") == []
    assert collector_threads("second") == []


async def test_stop_returns_with_a_hung_run_and_names_it() -> None:
    steady, hanging = Steady("steady"), Hanging("hanging")
    engine = Engine(
        collectors=[scheduled(steady, interval=0.05), scheduled(hanging, interval=0.05)],
        max_staleness=60.0,
        hang_timeout=5.0,
        version="test",
    )
    await engine.start()
    try:
        await poll(lambda: hanging.entered >= 2)
        assert await engine.stop(grace=0.2) == ["hanging"]
        assert collector_threads("steady") == []
    finally:
        hanging.release.set()


@pytest.mark.parametrize("attempt", range(20))
async def test_stop_while_runs_are_in_flight(attempt: int) -> None:
    """Stopping races with runs settling (many collectors, 10 ms intervals): it always ends."""
    collectors = [Slow(f"slow{i}", 0.002 * (attempt % 3)) for i in range(8)]
    engine = Engine(
        collectors=[scheduled(c, interval=0.01, timeout=0.008) for c in collectors],
        max_staleness=60.0,
        hang_timeout=5.0,
        version="test",
    )
    await engine.start()
    await poll(lambda: all(c.calls >= 3 for c in collectors))
    stopping = asyncio.ensure_future(engine.stop())
    done, _ = await asyncio.wait({stopping}, timeout=5)
    assert stopping in done, "engine.stop() did not return"
    assert stopping.result() == []
    calls = [c.calls for c in collectors]
    await asyncio.sleep(0.05)  # a scheduler that survived stop() would start more runs here
    assert [c.calls for c in collectors] == calls


async def test_hung_means_the_same_to_the_metric_and_to_healthz() -> None:
    """Blocked past its deadline is down; hung is blocked past the hang timeout, for
    `fleetwatch_collector_hung` and `/healthz` alike, at every instant."""
    now = [1000.0]
    hanging = Hanging("hanging")
    engine = Engine(
        collectors=[scheduled(hanging, interval=0.1, timeout=0.05)],
        max_staleness=600.0,
        hang_timeout=30.0,
        version="test",
        clock=lambda: now[0],
    )
    client = Client(engine)
    await client.start_server()

    async def hung_now() -> tuple[float | None, int]:
        text = await (await client.get("/metrics")).text()
        metric = sample_value(text, 'fleetwatch_collector_hung{collector="hanging"}')
        return metric, (await client.get("/healthz")).status

    try:
        await engine.start()
        await poll(lambda: hanging.entered == 2 and not engine.states[0].up)
        assert await hung_now() == (0.0, 200)  # down (deadline missed), not hung
        now[0] += 29.0
        assert await hung_now() == (0.0, 200)
        now[0] += 2.0
        assert await hung_now() == (1.0, 503)
        hanging.release.set()
        await poll(lambda: engine.states[0].up)
        assert await hung_now() == (0.0, 200)
    finally:
        hanging.release.set()
        await engine.stop()
        await client.close()


def alone(
    collector: Steady,
    *,
    interval: float,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
) -> Engine:
    """An engine running `collector` alone (staleness and hang limits out of the way)."""
    return Engine(
        collectors=[scheduled(collector, interval=interval, timeout=timeout)],
        max_staleness=60.0,
        hang_timeout=5.0,
        version="test",
        clock=clock,
    )


async def test_a_steady_run_does_not_wake_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The workers wait for their due times themselves and queue their runs: the loop is
    woken for each collector's first run only, and one timer for the whole engine takes
    the rest (no deadline timer a run, no timer to start one)."""
    collectors = [Steady(f"steady{i}") for i in range(4)]
    engine = Engine(
        collectors=[scheduled(c, interval=0.02, timeout=5.0) for c in collectors],
        max_staleness=60.0,
        hang_timeout=5.0,
        version="test",
    )
    loop = asyncio.get_running_loop()
    woken: list[str] = []
    armed: list[str] = []
    call_soon_threadsafe, call_later = loop.call_soon_threadsafe, loop.call_later

    def waking(callback, *args, **kwargs):  # type: ignore[no-untyped-def]
        woken.append(callback.__name__)
        return call_soon_threadsafe(callback, *args, **kwargs)

    def counting(delay, callback, *args, **kwargs):  # type: ignore[no-untyped-def]
        armed.append(callback.__name__)
        return call_later(delay, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", waking)
    monkeypatch.setattr(loop, "call_later", counting)
    await engine.start()
    try:
        await poll(lambda: all(state.runs >= 10 for state in engine.states))
        runs = sum(state.runs for state in engine.states)
        assert woken == ["_drain"] * len(collectors)  # the first runs: readiness
    finally:
        await engine.stop()
    engine_timers = [name for name in armed if name != "_set_result_unless_cancelled"]
    assert set(engine_timers) == {"_tick"}  # the poll's own sleeps aside
    assert len(engine_timers) < runs / 2  # one timer for four collectors, not one a run
    assert all(state.errors == 0 and state.up for state in engine.states)


async def test_a_run_taken_later_counts_from_when_it_ended() -> None:
    """A steady run waits in the queue for the loop's next drain; its series' age counts
    from when it ended, not from when the loop took it (the engine's clock stands still
    here, so any age is the wait in the queue)."""
    engine = alone(Steady("steady"), interval=0.05, timeout=1.0, clock=lambda: 1000.0)
    await engine.start()
    try:
        await poll(lambda: engine.states[0].runs >= 3)
        later = engine.states[0].body_time
    finally:
        await engine.stop()
    assert later is not None
    assert later < 1000.0  # taken some time after it ended, dated when it ended
    assert 1000.0 - later < 1.0


async def test_runs_nobody_reads_are_taken_by_the_timer() -> None:
    """Without a scrape or any other read, the engine's timer still takes the queued runs
    (what the queue holds stays bounded) and finds a run blocked past its deadline."""
    steady, hanging = Steady("steady"), Hanging("hanging")
    engine = Engine(
        collectors=[
            scheduled(steady, interval=0.02, timeout=0.5),
            scheduled(hanging, interval=0.02, timeout=0.015),
        ],
        max_staleness=60.0,
        hang_timeout=5.0,
        version="test",
    )
    await engine.start()
    try:
        # `_states`, not `states`: reading `states` would take the queue itself.
        deadline = time.monotonic() + 5
        while steady.calls < 30 or hanging.entered < 2 or engine._states[1].up:
            assert time.monotonic() < deadline, "the timer never took the runs"
            await asyncio.sleep(0.01)
            assert len(engine._handed) <= 15  # a few intervals' runs at most, not all 30
        assert engine._states[1].errors >= 1  # found blocked with nobody reading
        assert engine._states[0].runs >= 20
    finally:
        hanging.release.set()
        await engine.stop()


async def test_stop_does_not_wait_for_a_run_that_is_not_due() -> None:
    steady = Steady("steady")
    engine = alone(steady, interval=3600.0, timeout=1.0)
    await engine.start()
    await poll(lambda: engine.states[0].runs == 1)
    # The next run is due in an hour: its worker is waiting for it, and stops at once.
    assert await engine.stop(grace=1.0) == []
    assert collector_threads("steady") == []
    assert steady.calls == 1


async def test_a_run_due_after_a_missed_deadline_waits_for_the_blocked_one() -> None:
    """After a missed deadline the runs due while the last is blocked are counted skipped on
    the loop, none stacked behind it; once it returns the worker resumes on the cadence."""
    hanging = Hanging("hanging")
    engine = alone(hanging, interval=0.05, timeout=0.03)
    await engine.start()
    try:
        await poll(lambda: engine.states[0].skipped >= 2)
        assert hanging.entered == 2
        hanging.release.set()
        await poll(lambda: engine.states[0].up and hanging.entered >= 4)
    finally:
        hanging.release.set()
        await engine.stop()
    assert engine.states[0].errors >= 1
