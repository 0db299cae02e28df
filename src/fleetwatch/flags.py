"""Argument types shared by every subcommand, and settings dataclasses declared as flags.

Each type raises `argparse.ArgumentTypeError` with a message that names what was wrong, so
a bad flag or environment variable exits with one clear line. Durations are Prometheus
durations (`500ms`, `5s`, `1h30m`: `fleetwatch.durations`) and every duration or number
flag has bounds: zero, negative, NaN, infinite and absurd values are refused at start, not
discovered at run time.

A component's settings are a frozen dataclass whose fields are declared with `setting()`:
`add_setting_flags` turns each field into `--PREFIX.FIELD-NAME` (or the flag the field
names; default, parser and help in one place) and `read_settings` builds the dataclass once
from the parsed flags. A renamed flag keeps its old spelling as a hidden, deprecated alias
for one release (`setting(deprecated=...)`); `log_deprecated_flags` logs each one used once.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from fleetwatch.durations import DurationError, format_duration, parse_duration

log = logging.getLogger(__name__)


def duration(text: str) -> float:
    """A Prometheus duration (`500ms`, `5s`, `1h30m`, `2w`) in seconds, as a flag type."""
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def bounded_duration(minimum: float, maximum: float) -> Callable[[str], float]:
    """A duration flag type accepting `minimum` to `maximum` seconds, both included."""
    bounds = f"between {format_duration(minimum)} and {format_duration(maximum)}"

    def parse(text: str) -> float:
        seconds = duration(text)
        if not minimum <= seconds <= maximum:
            raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be {bounds}")
        return seconds

    return parse


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
_DEPRECATED_USED = "fleetwatch_deprecated_flags"
S = TypeVar("S")


@dataclass(frozen=True, kw_only=True)
class _Flag:
    """How one settings field appears on the command line."""

    help: str
    parse: Callable[[str], Any] | None
    metavar: str | None
    repeatable: bool
    shown: Callable[[Any], str]
    flag: str | None
    deprecated: tuple[str, ...]


def setting(
    default: Any,
    *,
    help: str,
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    repeatable: bool = False,
    shown: Callable[[Any], str] = str,
    flag: str | None = None,
    deprecated: Sequence[str] = (),
) -> Any:
    """A settings field that is also a flag; its default is written here and nowhere else.

    A `bool` default makes an on/off switch (`--x` / `--no-x`). `repeatable` collects every
    occurrence into a tuple (the default when none is given). `shown` formats the default
    for `--help` (`format_duration` for durations); None defaults are not shown. `flag`
    names the option (without `--`) where it is not `PREFIX.FIELD-NAME`; `deprecated` lists
    old spellings still accepted, hidden from `--help`, for one release.
    """
    spec = _Flag(
        help=help,
        parse=parse,
        metavar=metavar,
        repeatable=repeatable,
        shown=shown,
        flag=flag,
        deprecated=tuple(deprecated),
    )
    return dataclasses.field(default=default, metadata={_FLAG: spec})


def duration_setting(
    default: float,
    *,
    minimum: float,
    maximum: float,
    help: str,
    flag: str | None = None,
    deprecated: Sequence[str] = (),
) -> Any:
    """A settings field that is a bounded duration flag (`5s`-style, shown so in --help)."""
    return setting(
        default,
        parse=bounded_duration(minimum, maximum),
        shown=format_duration,
        metavar="DURATION",
        help=help,
        flag=flag,
        deprecated=deprecated,
    )


def number_setting(
    default: float | None,
    *,
    minimum: float,
    maximum: float,
    help: str,
    integer: bool = False,
    unit: str = "",
    flag: str | None = None,
    deprecated: Sequence[str] = (),
) -> Any:
    """A settings field that is a bounded number flag (whole when `integer`)."""
    return setting(
        default,
        parse=bounded_number(minimum, maximum, integer=integer, unit=unit),
        metavar="N" if integer else "NUMBER",
        help=help,
        flag=flag,
        deprecated=deprecated,
    )


def _flags(settings: type[Any], prefix: str) -> list[tuple[dataclasses.Field[Any], str, str]]:
    """Each flag field of `settings` with its option (`--PREFIX.NAME`) and argparse dest.

    Fields declared without `setting()` are not flags: they keep their defaults."""
    dest_prefix = prefix.replace(".", "_").replace("-", "_")
    found = []
    for field in dataclasses.fields(settings):
        flag: _Flag | None = field.metadata.get(_FLAG)
        if flag is None:
            continue
        option = f"--{flag.flag or f'{prefix}.' + field.name.replace('_', '-')}"
        found.append((field, option, f"{dest_prefix}_{field.name}"))
    return found


class DeprecatedSpelling(argparse.Action):
    """An old spelling of a renamed flag: parsed as the new flag is, hidden from --help, and
    remembered on the namespace so that the command logs it once (`deprecated_flags_used`)."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        *,
        canonical: argparse.Action,
        type: Callable[[str], Any],
        metavar: str | None,
    ) -> None:
        super().__init__(
            option_strings,
            dest,
            type=type,
            metavar=metavar,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )
        self.canonical = canonical

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        self.canonical(parser, namespace, values, self.canonical.option_strings[0])
        used: dict[str, str] = getattr(namespace, _DEPRECATED_USED, {})
        used[self.option_strings[0]] = self.canonical.option_strings[0]
        setattr(namespace, _DEPRECATED_USED, used)


def deprecated_flags_used(args: argparse.Namespace) -> dict[str, str]:
    """Each deprecated spelling the command line or environment used, and its new name."""
    used: dict[str, str] = getattr(args, _DEPRECATED_USED, {})
    return dict(used)


def add_setting_flags(
    group: argparse._ArgumentGroup | argparse.ArgumentParser, prefix: str, settings: type[Any]
) -> None:
    """Add one `--PREFIX.FIELD-NAME` flag per setting of the `settings` dataclass."""
    for field, option, dest in _flags(settings, prefix):
        flag: _Flag = field.metadata[_FLAG]
        default: Any = field.default
        text = flag.help.replace("%", "%%")
        if isinstance(default, bool):
            if flag.deprecated:
                raise TypeError(f"{option}: an on/off switch cannot have a deprecated spelling")
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
        canonical = group.add_argument(
            option,
            dest=dest,
            type=flag.parse or str,
            action="append" if flag.repeatable else "store",
            default=None if flag.repeatable else default,
            metavar=flag.metavar,
            help=text,
        )
        for old in flag.deprecated:
            group.add_argument(
                f"--{old}",
                dest=dest,
                action=DeprecatedSpelling,
                canonical=canonical,
                type=flag.parse or str,
                metavar=flag.metavar,
            )


def read_settings(args: argparse.Namespace, prefix: str, settings: type[S], **given: Any) -> S:
    """Build the `settings` dataclass once from the flags `add_setting_flags` added.

    `given` holds the values of fields that are not flags (derived at start)."""
    parsed = vars(args)
    values: dict[str, Any] = dict(given)
    for field, _option, dest in _flags(settings, prefix):
        value = parsed[dest]
        if field.metadata[_FLAG].repeatable:
            value = tuple(value) if value else field.default
        values[field.name] = value
    return settings(**values)
