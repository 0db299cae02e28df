"""A real kernel mount that hangs, under the real exporter process (FUSE, needs root).

`testbed.fuse` serves an in-memory filesystem the test can make stop answering, answer
slowly or fail writes. The exporter is `fleetwatch export --simulate dgx-h100` with the
FUSE mount named by `--collector.storage.mounts` (under simulation, named mounts are the
real ones). While the mount hangs, /metrics keeps answering with every other collector's
series, the mount turns hung, at most one stuck call is counted whatever the number of
cycles, and SIGTERM ends the process within --shutdown.timeout; when the server answers
again the mount recovers. Wall times are printed, never asserted.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.collectors import storage
from fleetwatch.sim.servers import Server, fleetwatch_export, http_get, wait_until
from testbed.fuse import FuseMount, fuse_mount, fuse_unavailable

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(fuse_unavailable() is not None, reason=str(fuse_unavailable())),
]

HUNG_TIMEOUT = 1.0
SHUTDOWN_TIMEOUT = 3.0
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(server: Server) -> tuple[Samples, float]:
    """/metrics as samples, and how long the scrape took."""
    started = time.perf_counter()
    text = http_get(server.url + "/metrics", timeout=30).decode()
    took = time.perf_counter() - started
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return samples, took


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def _scrape_until(server: Server, ready: Callable[[Samples], bool], what: str) -> Samples:
    """Scrape until `ready` holds for the samples (30 s at most); those samples."""

    def attempt() -> Samples | None:
        samples, _ = _scrape(server)
        return samples if ready(samples) else None

    return wait_until(attempt, timeout=30, what=what)


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[FuseMount]:
    with fuse_mount(tmp_path / "fuse") as mounted:
        (mounted.mountpoint / "fleetwatch").mkdir()
        yield mounted


def _export(tmp_path: Path, mount: FuseMount, *extra: str) -> list[str]:
    return [
        "--collector.interval=500ms",
        f"--collector.storage.mounts={mount.mountpoint}",
        f"--collector.storage.hung-timeout={HUNG_TIMEOUT:g}s",
        f"--shutdown.timeout={SHUTDOWN_TIMEOUT:g}s",
        *extra,
    ]


def test_a_hung_mount_delays_nothing_is_counted_once_and_recovers(
    tmp_path: Path, mount: FuseMount
) -> None:
    point = str(mount.mountpoint)
    args = _export(tmp_path, mount)
    with fleetwatch_export(tmp_path / "exporter", simulate="dgx-h100", args=args) as server:
        wait_until(
            lambda: _value(_scrape(server)[0], storage.SIZE, mountpoint=point),
            timeout=30,
            what="the FUSE mount's size",
        )
        mount.set_mode("hang")
        samples = _scrape_until(
            server, lambda found: _value(found, storage.HUNG, mountpoint=point) == 1, "hung"
        )
        # Many cycles (500 ms) pass while the call stays stuck: still one stuck call.
        scrapes = []
        for _ in range(15):
            samples, took = _scrape(server)
            scrapes.append(took)
            assert _value(samples, storage.HUNG, mountpoint=point) == 1
            time.sleep(0.2)  # let collection cycles pass between scrapes
        print(f"scrapes while hung: max {max(scrapes) * 1000:.1f} ms")
        assert _value(samples, storage.STUCK, mountpoint=point) == 1
        assert _value(samples, storage.SIZE, mountpoint=point) is None
        assert _value(samples, "fleetwatch_collector_up", collector="storage") == 1
        assert _value(samples, "fleetwatch_collector_up", collector="gpu") == 1
        assert any(name == "fleetwatch_gpu_temperature_celsius" for name, _ in samples)
        mount.set_mode("ok")
        samples = _scrape_until(
            server,
            lambda found: (
                _value(found, storage.HUNG, mountpoint=point) == 0
                and _value(found, storage.SIZE, mountpoint=point) is not None
            ),
            "the mount recovered",
        )
        assert _value(samples, storage.STUCK, mountpoint=point) == 1
        assert '"mount answered again"' in server.log()


def test_sigterm_stops_the_exporter_while_a_call_is_stuck(tmp_path: Path, mount: FuseMount) -> None:
    point = str(mount.mountpoint)
    args = _export(tmp_path, mount)
    with fleetwatch_export(tmp_path / "exporter", simulate="dgx-h100", args=args) as server:
        mount.set_mode("hang")
        wait_until(
            lambda: _value(_scrape(server)[0], storage.HUNG, mountpoint=point) == 1,
            timeout=30,
            what="the mount marked hung",
        )
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        try:
            status = server.process.wait(timeout=SHUTDOWN_TIMEOUT + 5)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit {SHUTDOWN_TIMEOUT + 5}s after SIGTERM:\n{server.log()}")
        print(f"exited {time.monotonic() - started:.2f}s after SIGTERM")
        assert status == 0, server.log()[-3000:]


@pytest.mark.parametrize(("mode", "reason"), [("erofs", "read_only"), ("enospc", "no_space")])
def test_failing_writes_count_a_probe_failure_with_the_reason(
    tmp_path: Path, mount: FuseMount, mode: str, reason: str
) -> None:
    point = str(mount.mountpoint)
    args = _export(
        tmp_path,
        mount,
        f"--collector.storage.probe-dir={mount.mountpoint / 'fleetwatch'}",
        "--collector.storage.probe-interval=1s",
        "--collector.storage.probe-bytes=1048576",
    )
    with fleetwatch_export(tmp_path / "exporter", simulate="dgx-h100", args=args) as server:
        wait_until(
            lambda: _value(_scrape(server)[0], storage.PROBES, mountpoint=point),
            timeout=30,
            what="a successful probe",
        )
        mount.set_mode(mode)
        wait_until(
            lambda: _value(_scrape(server)[0], storage.PROBE_FAILURES, mountpoint=point,
                           reason=reason),
            timeout=30,
            what=f"a probe failure with reason {reason}",
        )  # fmt: skip
        samples, _ = _scrape(server)
        assert _value(samples, storage.HUNG, mountpoint=point) == 0


def test_a_missing_probe_directory_is_reported_not_created(
    tmp_path: Path, mount: FuseMount
) -> None:
    point = str(mount.mountpoint)
    absent = mount.mountpoint / "absent"
    args = _export(tmp_path, mount, f"--collector.storage.probe-dir={absent}")
    with fleetwatch_export(tmp_path / "exporter", simulate="dgx-h100", args=args) as server:
        wait_until(
            lambda: _value(_scrape(server)[0], storage.PROBE_FAILURES, mountpoint=point,
                           reason="missing"),
            timeout=30,
            what="the missing probe directory reported",
        )  # fmt: skip
    assert not absent.exists()


def test_a_fuse_server_dying_mid_probe_is_a_counted_failure(
    tmp_path: Path, mount: FuseMount
) -> None:
    point = str(mount.mountpoint)
    args = _export(
        tmp_path,
        mount,
        f"--collector.storage.probe-dir={mount.mountpoint / 'fleetwatch'}",
        "--collector.storage.probe-interval=1s",
        "--collector.storage.probe-bytes=1048576",
    )
    with fleetwatch_export(tmp_path / "exporter", simulate="dgx-h100", args=args) as server:
        wait_until(
            lambda: _value(_scrape(server)[0], storage.PROBES, mountpoint=point),
            timeout=30,
            what="a successful probe",
        )
        mount.set_mode("die")
        samples = _scrape_until(
            server,
            lambda found: (
                _value(found, storage.PROBE_FAILURES, mountpoint=point, reason="disconnected")
                is not None
                and _value(found, storage.CALL_ERRORS, mountpoint=point, reason="ENOTCONN")
                is not None
            ),
            "the dead server's probe failure and statvfs error",
        )
        assert _value(samples, storage.HUNG, mountpoint=point) == 0
        assert _value(samples, "fleetwatch_collector_up", collector="storage") == 1
        assert _value(samples, "fleetwatch_collector_up", collector="gpu") == 1
