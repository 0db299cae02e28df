"""A program run for the length of a `with` block and stopped by PID, for the harnesses of
real servers that have no HTTP readiness endpoint (etcd, kube-apiserver, Slurm's daemons)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

STOP_TIMEOUT = 15.0


@contextlib.contextmanager
def process(
    argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` with its output appended to `log`, in a session of its own (a Ctrl-C meant
    for the tests does not reach it), with `env` added to the environment; on exit stop it by
    PID: TERM, then KILL after STOP_TIMEOUT."""
    with log.open("ab") as out:
        started = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    try:
        yield started
    finally:
        if started.poll() is None:
            started.terminate()
            try:
                started.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                started.kill()
                started.wait(timeout=STOP_TIMEOUT)
