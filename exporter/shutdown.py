"""A deadline on shutdown: once begun, the process is gone within it, whatever blocks.

Stopping the engine, the HTTP server, the collectors and NVML each could block (a wedged
driver call, a client not reading). In a DaemonSet a process that does not exit holds its
pod in Terminating until the kubelet kills it on every rollout, with nothing in the log
saying why. The deadline runs on its own thread, so it fires even if the event loop or the
main thread is stuck; it logs the step that was running and the threads still alive, then
exits with EXIT_SHUTDOWN_TIMEOUT.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Final

log = logging.getLogger(__name__)

EXIT_SHUTDOWN_TIMEOUT: Final = 3


class ShutdownDeadline:
    """Bounds a shutdown to `seconds` once `begin()` is called; `finish()` disarms it."""

    def __init__(self, *, seconds: float, exit_process: Callable[[int], object] = os._exit) -> None:
        self._seconds = seconds
        self._exit = exit_process
        self._step = "starting"
        self._timer: threading.Timer | None = None

    def step(self, name: str) -> None:
        """Record what shutdown is doing now, for the log line if the deadline passes."""
        self._step = name

    def begin(self) -> None:
        """Start the clock (once; later calls keep the first deadline)."""
        if self._timer is not None:
            return
        self._timer = threading.Timer(self._seconds, self._expire)
        self._timer.name = "shutdown-deadline"
        self._timer.daemon = True
        self._timer.start()

    def finish(self) -> None:
        """Shutdown completed in time: disarm (on return, the deadline can no longer fire)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()

    def _expire(self) -> None:
        current = threading.current_thread()
        running = sorted(
            t.name
            for t in threading.enumerate()
            if t is not current and t is not threading.main_thread()
        )
        log.error(
            "shutdown deadline exceeded, exiting",
            extra={
                "deadline_seconds": self._seconds,
                "step": self._step,
                "threads": ",".join(running),
                "exit_status": EXIT_SHUTDOWN_TIMEOUT,
            },
        )
        for handler in logging.getLogger().handlers:
            try:
                handler.flush()
            except (OSError, ValueError):  # a closed or broken stream must not stop the exit
                pass
        self._exit(EXIT_SHUTDOWN_TIMEOUT)
