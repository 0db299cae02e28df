"""Argument types shared by every subcommand: durations, listen addresses, URLs, files.

Each raises `argparse.ArgumentTypeError` with a message that names what was wrong, so
a bad flag or environment variable exits with one clear line.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from urllib.parse import urlsplit

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: str) -> float:
    """Parse a Prometheus-style duration (`500ms`, `5s`, `1m30s`, `24h`) into seconds."""
    text = text.strip()
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number with a unit, e.g. 500ms, 5s, 1m30s, 24h"
        )
    return total


def positive_duration(text: str) -> float:
    """A duration that must be greater than zero."""
    seconds = duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be greater than 0")
    return seconds


def listen_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[IPV6]:PORT`; an empty host means all interfaces."""
    match = re.fullmatch(r"(?:\[([0-9a-fA-F:.]+)\]|([^:\[\]]*)):(\d{1,5})", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(
            f"invalid listen address {text!r}: expected HOST:PORT or [IPV6]:PORT"
        )
    host = match.group(1) or match.group(2) or "0.0.0.0"  # noqa: S104 - explicit ":PORT" means all
    port = int(match.group(3))
    if port > 65535:
        raise argparse.ArgumentTypeError(f"invalid listen address {text!r}: port above 65535")
    return host, port


def http_url(text: str) -> str:
    """An http(s) URL with a host; trailing slashes are removed."""
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(
            f"invalid URL {text!r}: expected http://HOST:PORT or https://HOST:PORT"
        )
    return text.strip().rstrip("/")


def readable_file(text: str) -> Path:
    """A path to a file that exists and can be opened now."""
    path = Path(text)
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {exc.strerror}") from exc
    return path


def existing_dir(text: str) -> Path:
    """A path to a directory that exists."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a directory: {text}")
    return path
