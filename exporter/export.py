"""`fleetwatch export`: the DaemonSet process (flags, hardware or simulation, serving).

Builds the settings from flags and environment, the hardware the collectors read (real,
or the simulated node under `--simulate`: `exporter.hardware`, which loads the simulator only
then; `--simulate list` imports it here, on demand), starts the engine and the
HTTP server, and stops on SIGTERM/SIGINT within `--shutdown.timeout`: engine, HTTP server,
collectors and NVML in that order, or a log line naming what still ran and exit status 3.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator

from fleetwatch import __version__
from fleetwatch.collectors import COLLECTORS
from fleetwatch.collectors.base import Collector, CollectorContext
from fleetwatch.exporter.engine import Engine, ScheduledCollector
from fleetwatch.exporter.hardware import hardware
from fleetwatch.exporter.http import make_app
from fleetwatch.exporter.machine import Refresh
from fleetwatch.exporter.settings import EXPORT_FLAGS, ExportSettings, flags_of
from fleetwatch.exporter.shutdown import ShutdownDeadline
from fleetwatch.flags import Subcommand
from fleetwatch.listener import listen
from fleetwatch.webconfig import check_web_config
from fleetwatch.webguard import WebGuard

log = logging.getLogger(__name__)


def subcommands() -> tuple[Subcommand, ...]:
    """`fleetwatch export`, with every collector's flags."""
    return (
        Subcommand(
            name="export",
            help="run the exporter (serves /metrics)",
            description="Collect GPU and fabric telemetry and serve it to Prometheus.",
            flags=flags_of(COLLECTORS),
            run=run_export,
        ),
    )


def run_export(args: argparse.Namespace) -> int:
    """Entry point of `fleetwatch export`."""
    if EXPORT_FLAGS.read(args).simulate == "list":
        from fleetwatch.sim.exporter_hardware import list_scenarios

        print("\n".join(list_scenarios()))
        return 0
    try:
        settings = ExportSettings.from_args(args, COLLECTORS)
        if settings.listener.config_file is not None:
            check_web_config(settings.listener.config_file)  # refused before any hardware
    except ValueError as exc:
        print(f"fleetwatch export: error: {exc}", file=sys.stderr)
        return 2
    deadline = ShutdownDeadline(seconds=settings.shutdown_timeout)
    try:
        with hardware(settings) as machine:
            collectors = create_collectors(machine.context, machine.settings)
            try:
                asyncio.run(serve(machine.settings, collectors, machine.refresh, deadline))
            finally:
                deadline.step("closing collectors")
                close_collectors(collectors)
                deadline.step("closing the hardware context (NVML)")
                machine.context.close()
    except ValueError as exc:  # a bad scenario too (ScenarioError)
        print(f"fleetwatch export: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"fleetwatch export: error: {exc}", file=sys.stderr)
        return 1
    finally:
        deadline.finish()
    return 0


def create_collectors(context: CollectorContext, settings: ExportSettings) -> dict[str, Collector]:
    """Build the enabled collectors from their settings; on a failure, close those built."""
    collectors: dict[str, Collector] = {}
    try:
        for spec in COLLECTORS:
            if spec.name in settings.enabled:
                collectors[spec.name] = spec.create(context, settings.collectors[spec.name])
    except BaseException:
        close_collectors(collectors)
        raise
    return collectors


def close_collectors(collectors: dict[str, Collector]) -> None:
    """Close every collector; one failing to close does not keep the others open."""
    for name, collector in collectors.items():
        try:
            collector.close()
        except Exception:  # reported; closing continues with the next collector
            log.exception("collector failed to close", extra={"collector": name})


async def serve(
    settings: ExportSettings,
    collectors: dict[str, Collector],
    refresh: Refresh | None,
    deadline: ShutdownDeadline,
) -> None:
    """Run the engine and the HTTP server until SIGTERM or SIGINT, then stop them."""
    config_file = settings.listener.config_file
    guard = WebGuard(config_file) if config_file is not None else None
    engine = Engine(
        collectors=[
            ScheduledCollector(
                name=name,
                collector=collector,
                interval=settings.intervals[name],
                timeout=settings.timeouts[name],
            )
            for name, collector in collectors.items()
        ],
        max_staleness=settings.max_staleness,
        hang_timeout=settings.hang_timeout,
        version=__version__,
        web_config=guard,
    )
    if guard is not None:
        guard.on_reload = engine.web_config_reloaded
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    host, port = settings.listen_host, settings.listen_port
    async with listen(
        make_app(engine),
        host=host,
        port=port,
        limits=settings.listener,
        web=guard,
    ):
        log.info(
            "serving",
            extra={
                "address": f"{host}:{port}",
                "collectors": ",".join(collectors),
                # Off by flag (the chart turns off what a container may not read).
                "disabled": ",".join(
                    spec.name for spec in COLLECTORS if spec.name not in settings.enabled
                ),
                "version": __version__,
            },
        )
        try:
            # Only the InfiniBand collector reads the simulated tree: move it on as often as
            # that collector reads it, not faster (the rewrite is the simulation's cost).
            period = settings.intervals.get("infiniband")
            async with _simulation_refresh(refresh if period else None, period or 0.0):
                await engine.start()
                await stop.wait()
            deadline.begin()
            log.info("shutting down", extra={"deadline_seconds": settings.shutdown_timeout})
        finally:
            deadline.step("stopping the engine")
            abandoned = await engine.stop()
            if abandoned:
                log.warning(
                    "collector runs still blocked at shutdown, abandoned",
                    extra={"collectors": ",".join(abandoned)},
                )
            deadline.step("stopping the HTTP server")
    deadline.step("closing the event loop")


@contextlib.asynccontextmanager
async def _simulation_refresh(refresh: Refresh | None, period: float) -> AsyncIterator[None]:
    """Under simulation, call `refresh` every `period` seconds (off the event loop)."""
    if refresh is None:
        yield
        return

    async def loop() -> None:
        while True:
            await asyncio.sleep(period)
            try:
                await asyncio.to_thread(refresh)
            except OSError:
                log.exception("could not refresh the simulated sysfs tree")

    task = asyncio.create_task(loop(), name="simulated-sysfs")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
