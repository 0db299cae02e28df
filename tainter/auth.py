"""The webhook's bearer token, re-read when its file changes.

A Kubernetes Secret volume is updated atomically (a new `..data` directory and a symlink
swap) some time after the Secret changes, and Alertmanager picks up its own copy at a
different moment. A token read once at start turns a rotation into 401s, which
Alertmanager never retries: taints would be lost without a sound. So the file is
checked (one `stat`) on each request and re-read when it changed, and the previous
token stays valid for `overlap` seconds after a change.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from fleetwatch.tainter.metrics import TainterMetrics

log = logging.getLogger(__name__)


class TokenError(ValueError):
    """The token file cannot be used; the message names the file and why."""


def read_token(path: Path) -> bytes:
    """The token in `path` (surrounding whitespace stripped); TokenError when empty or
    unreadable."""
    try:
        token = path.read_bytes().strip()
    except OSError as exc:
        raise TokenError(f"token file {path}: cannot read ({exc.strerror})") from exc
    if not token:
        raise TokenError(f"token file {path} is empty")
    return token


def _identity(path: Path) -> tuple[int, int, int]:
    """What changes when the file (or the symlink it resolves through) is replaced."""
    stat = os.stat(path)
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


class TokenFile:
    """Accepts the token now in the file and, for `overlap` seconds, the one before."""

    def __init__(
        self,
        path: Path,
        *,
        overlap: float,
        metrics: TainterMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = path
        self._overlap = overlap
        self._metrics = metrics
        self._clock = clock
        self._current = read_token(path)
        self._seen = _identity(path)
        self._previous: bytes | None = None
        self._previous_until = 0.0

    def _refresh(self) -> None:
        try:
            seen = _identity(self._path)
        except OSError:
            return  # mid-swap or briefly missing: keep the tokens we have
        if seen == self._seen:
            return
        try:
            token = read_token(self._path)
        except TokenError as exc:
            self._metrics.token_reloads.labels(result="error").inc()
            log.error(
                "cannot re-read the webhook token; keeping the old one", extra={"error": str(exc)}
            )
            return
        self._seen = seen
        if token != self._current:
            self._previous, self._previous_until = self._current, self._clock() + self._overlap
            self._current = token
            self._metrics.token_reloads.labels(result="ok").inc()
            log.warning(
                "webhook token changed; the old one stays valid for a while",
                extra={"file": str(self._path), "overlap_s": self._overlap},
            )

    def accepts(self, header: str) -> bool:
        """True when `header` is `Bearer <current token>` (or the previous one, in overlap).
        Compared in constant time."""
        self._refresh()
        given = header.encode()
        ok = hmac.compare_digest(given, b"Bearer " + self._current)
        if self._previous is not None and self._clock() < self._previous_until:
            ok = hmac.compare_digest(given, b"Bearer " + self._previous) or ok
        return ok
