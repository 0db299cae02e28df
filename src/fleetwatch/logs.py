"""Structured logging: one JSON object per line by default, a human format on request."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Final

from fleetwatch.flags import setting

# Attributes every LogRecord has; anything else was passed through `extra=` and is a field.
_STANDARD_ATTRS: Final = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)

# Loggers of the libraries fleetwatch uses; their INFO lines are routine, not news.
THIRD_PARTY_LOGGERS: Final = (
    "sh",
    "aiohttp",
    "asyncio",
    "grpc",
    "pyudev",
)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a caller attached with `extra=`."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(record_fields(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...` for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in record_fields(record).items())
        line = (
            f"{time.strftime('%H:%M:%S', time.localtime(record.created))} "
            f"{record.levelname:<7} {record.name}: {record.getMessage()}"
        )
        if fields:
            line += f" {fields}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


@dataclass(frozen=True, kw_only=True)
class LogSettings:
    """How a command logs (`--log.*`, every subcommand has them)."""

    format: str = setting(
        "json",
        choices=("json", "text"),
        help="log line format: one JSON object per line, or text for people",
    )
    level: str = setting(
        "info", choices=("debug", "info", "warning", "error"), help="minimum level logged"
    )


def configure_logging(*, fmt: str, level: str) -> None:
    """Install one stderr handler with the chosen format on the root logger.

    Libraries we call log routine events at INFO (`sh` logs every process it starts, nine
    lines every 30 s on a host with pinned InfiniBand counters), which would drown our own
    lines; they are held at WARNING unless the operator asks for `debug`.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    third_party = logging.NOTSET if level.lower() == "debug" else logging.WARNING
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(third_party)


class LogOnce:
    """Logs each key's message once, until the key is forgotten: news, not a repeat per cycle.

    A stuck file, a failing tool, a GPU without GPM or a lost GPU is said once; `forget`
    re-arms a key whose condition ended (a lost GPU that came back), so it is said again
    if it returns. Both the hardware sources and the collectors use it.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._said: set[Hashable] = set()

    def log(self, level: int, key: Hashable, message: str, **fields: object) -> bool:
        """Log `message` with `fields` at `level` unless `key` was already said; True if it was
        logged now."""
        if key in self._said:
            return False
        self._said.add(key)
        self._log.log(level, message, extra=fields)
        return True

    def warning(self, key: Hashable, message: str, **fields: object) -> bool:
        return self.log(logging.WARNING, key, message, **fields)

    def forget(self, key: Hashable) -> None:
        """Re-arm `key`: its message is logged again the next time."""
        self._said.discard(key)
