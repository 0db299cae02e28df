"""Argument types shared by every subcommand, and settings dataclasses declared as flags.

Each type raises `argparse.ArgumentTypeError` with a message that names what was wrong, so
a bad flag or environment variable exits with one clear line. Durations are
Prometheus-style (`500ms`, `5s`, `1m30s`) and every duration or number flag has bounds:
zero, negative, NaN, infinite and absurd values are refused at start, not discovered at
run time.

A component's settings are a frozen dataclass whose fields are declared with `setting()`:
`add_setting_flags` turns each field into `--PREFIX.FIELD-NAME` (default, parser and help
in one place) and `read_settings` builds the dataclass once from the parsed flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SHOWN_UNITS = (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 0.001))


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


def format_duration(seconds: float) -> str:
    """Seconds as the shortest duration text `duration` reads back: 90 → `1m30s`."""
    parts: list[str] = []
    rest = max(0, round(seconds * 1000))
    for unit, size in _SHOWN_UNITS:
        step = round(size * 1000)
        count, rest = divmod(rest, step)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def bounded_duration(minimum: float, maximum: float) -> Callable[[str], float]:
    """A duration flag type accepting `minimum` to `maximum` seconds, both included."""
    bounds = f"between {format_duration(minimum)} and {format_duration(maximum)}"

    def parse(text: str) -> float:
        seconds = duration(text)
        if not minimum <= seconds <= maximum:
            raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be {bounds}")
        return seconds

    return parse


positive_duration = bounded_duration(0.001, 366 * 86400.0)
"""A duration from 1ms to 366 days: zero, negative and absurd lengths are refused."""


def bounded_number(
    minimum: float, maximum: float, *, integer: bool = False, unit: str = ""
) -> Callable[[str], float]:
    """A number flag type (whole when `integer`) from `minimum` to `maximum`, both included.

    NaN and infinities are refused: neither compares inside any bounds.
    """
    kind = "whole number" if integer else "number"
    bounds = f"{int(minimum)}..{int(maximum)}" if integer else f"{minimum:g}..{maximum:g}"
    shown = bounds + (f" {unit}" if unit else "")

    def parse(text: str) -> float:
        try:
            value: float = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind} {text!r}") from None
        if math.isnan(value) or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"invalid {kind} {text!r}: must be in {shown}")
        return value

    return parse


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


# -- settings dataclasses as flags ------------------------------------------------------------
_FLAG = "fleetwatch.flag"
S = TypeVar("S")


@dataclass(frozen=True, kw_only=True)
class _Flag:
    """How one settings field appears on the command line."""

    help: str
    parse: Callable[[str], Any] | None
    metavar: str | None
    repeatable: bool
    shown: Callable[[Any], str]


def setting(
    default: Any,
    *,
    help: str,
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    repeatable: bool = False,
    shown: Callable[[Any], str] = str,
) -> Any:
    """A settings field that is also a flag; its default is written here and nowhere else.

    A `bool` default makes an on/off switch (`--x` / `--no-x`). `repeatable` collects every
    occurrence into a tuple (the default when none is given). `shown` formats the default
    for `--help` (`format_duration` for durations); None defaults are not shown.
    """
    flag = _Flag(help=help, parse=parse, metavar=metavar, repeatable=repeatable, shown=shown)
    return dataclasses.field(default=default, metadata={_FLAG: flag})


def duration_setting(default: float, *, minimum: float, maximum: float, help: str) -> Any:
    """A settings field that is a bounded duration flag (`5s`-style, shown so in --help)."""
    return setting(
        default,
        parse=bounded_duration(minimum, maximum),
        shown=format_duration,
        metavar="DURATION",
        help=help,
    )


def _flags(settings: type[Any], prefix: str) -> list[tuple[dataclasses.Field[Any], str, str]]:
    """Each field of `settings` with its option (`--PREFIX.NAME`) and argparse dest."""
    dest_prefix = prefix.replace(".", "_").replace("-", "_")
    return [
        (field, f"--{prefix}.{field.name.replace('_', '-')}", f"{dest_prefix}_{field.name}")
        for field in dataclasses.fields(settings)
    ]


def add_setting_flags(
    group: argparse._ArgumentGroup | argparse.ArgumentParser, prefix: str, settings: type[Any]
) -> None:
    """Add one `--PREFIX.FIELD-NAME` flag per field of the `settings` dataclass."""
    for field, option, dest in _flags(settings, prefix):
        flag: _Flag = field.metadata[_FLAG]
        default: Any = field.default
        text = flag.help.replace("%", "%%")
        if isinstance(default, bool):
            group.add_argument(
                option,
                dest=dest,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f"{text} (default {'on' if default else 'off'})",
            )
            continue
        if default is not None and default != ():
            shown = ", ".join(map(flag.shown, default)) if flag.repeatable else flag.shown(default)
            text += f" (default {shown})"
        group.add_argument(
            option,
            dest=dest,
            type=flag.parse or str,
            action="append" if flag.repeatable else "store",
            default=None if flag.repeatable else default,
            metavar=flag.metavar,
            help=text,
        )


def read_settings(args: argparse.Namespace, prefix: str, settings: type[S]) -> S:
    """Build the `settings` dataclass once from the flags `add_setting_flags` added."""
    given = vars(args)
    values: dict[str, Any] = {}
    for field, _option, dest in _flags(settings, prefix):
        value = given[dest]
        if field.metadata[_FLAG].repeatable:
            value = tuple(value) if value else field.default
        values[field.name] = value
    return settings(**values)
