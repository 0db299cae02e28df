"""The one module that talks to argparse: flag types, and settings dataclasses as flags.

Each type raises `argparse.ArgumentTypeError` with a message that names what was wrong, so
a bad flag or environment variable exits with one clear line. Durations are Prometheus
durations (`500ms`, `5s`, `1h30m`: `fleetwatch.durations`) and every duration or number
flag has bounds: zero, negative, NaN, infinite and absurd values are refused at start, not
discovered at run time.

A component's settings are a frozen dataclass whose fields are declared with `setting()`:
each field becomes `--PREFIX.FIELD-NAME` (or the flag the field names; default, parser and
help in one place), and `read_settings` builds the dataclass once from the parsed flags.
A subcommand is declared as data (`Subcommand`: its name, its settings dataclasses as
`Flags`, what it runs) and `build_parser` turns the declarations into the parser; no other
module adds an argument. Every long flag also reads `FLEETWATCH_<FLAG>` (`env_name`;
`parse_args` applies the variables); a flag given on the command line wins. A renamed flag
keeps its old spelling as a hidden, deprecated alias for one release
(`setting(deprecated=...)`); `deprecated_flags_used` lists those used, for the command to log.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

from fleetwatch.durations import DurationError, format_duration, parse_duration


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


def shown_address(address: tuple[str, int]) -> str:
    """A `listen_address` as `--help` shows it: `:PORT` for all interfaces."""
    host, port = address
    if host == "0.0.0.0":  # noqa: S104 - all interfaces, written ":PORT"
        return f":{port}"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
_REQUIRED_RENAMED = "required_with_old_spellings"
ENV_PREFIX: Final = "FLEETWATCH_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
S = TypeVar("S")


class _Required:
    """The default of a flag that has none: the command line (or environment) must give it."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()


@dataclass(frozen=True, kw_only=True)
class _Flag:
    """How one settings field appears on the command line."""

    help: str | None
    parse: Callable[[str], Any] | None
    metavar: str | None
    repeatable: bool
    shown: Callable[[Any], str]
    flag: str | None
    deprecated: tuple[str, ...]
    choices: tuple[str, ...] | None
    positional: bool
    negatable: bool
    required: bool


def setting(
    default: Any,
    *,
    help: str | None,
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    repeatable: bool = False,
    shown: Callable[[Any], str] = str,
    flag: str | None = None,
    deprecated: Sequence[str] = (),
    choices: Sequence[str] | None = None,
    positional: bool = False,
    negatable: bool = True,
) -> Any:
    """A settings field that is also a flag; its default is written here and nowhere else.

    A `bool` default makes an on/off switch (`--x` / `--no-x`; only `--x` when not
    `negatable`). `repeatable` collects every occurrence into a tuple (the default when none
    is given). `shown` formats the default for `--help` (`format_duration` for durations);
    None defaults are not shown. `flag` names the option (without `--`) where it is not
    `PREFIX.FIELD-NAME`, `{prefix}` in it standing for the prefix; `deprecated` lists old
    spellings still accepted, hidden from `--help`, for one release. `choices` limits the
    values; `positional` makes the field a positional argument (no variable); a `REQUIRED`
    default makes a flag the command must be given. `help=None` hides the flag from --help.
    """
    spec = _Flag(
        help=help,
        parse=parse,
        metavar=metavar,
        repeatable=repeatable,
        shown=shown,
        flag=flag,
        deprecated=tuple(deprecated),
        choices=None if choices is None else tuple(choices),
        positional=positional,
        negatable=negatable,
        required=default is REQUIRED,
    )
    if default is REQUIRED:
        return dataclasses.field(metadata={_FLAG: spec})
    return dataclasses.field(default=default, metadata={_FLAG: spec})


def duration_setting(
    default: float | None,
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


def env_name(option: str) -> str:
    """`--web.listen-address` → `FLEETWATCH_WEB_LISTEN_ADDRESS`."""
    return ENV_PREFIX + option.lstrip("-").replace(".", "_").replace("-", "_").upper()


def _dest(option: str) -> str:
    """The argparse dest of an option: `--web.listen-address` → `web_listen_address`."""
    return option.lstrip("-").replace(".", "_").replace("-", "_")


@dataclass(frozen=True, kw_only=True)
class DeclaredFlag:
    """One settings field as the command line sees it: its option (or positional name)."""

    field: dataclasses.Field[Any]
    option: str
    dest: str
    spec: _Flag

    @property
    def env(self) -> str | None:
        """The variable that sets this flag, or None for a positional argument."""
        return None if self.spec.positional else env_name(self.option)


def declared_flags(settings: type[Any], prefix: str = "") -> list[DeclaredFlag]:
    """Each flag field of `settings` with its option (`--PREFIX.NAME`) and argparse dest.

    Fields declared without `setting()` are not flags: they keep their defaults (or are
    given to `read_settings`)."""
    found = []
    for field in dataclasses.fields(settings):
        spec: _Flag | None = field.metadata.get(_FLAG)
        if spec is None:
            continue
        if spec.positional:
            found.append(DeclaredFlag(field=field, option=field.name, dest=field.name, spec=spec))
            continue
        name = field.name.replace("_", "-")
        option = "--" + (
            spec.flag.format(prefix=prefix) if spec.flag else f"{prefix}.{name}" if prefix else name
        )
        found.append(DeclaredFlag(field=field, option=option, dest=_dest(option), spec=spec))
    return found


@dataclass(frozen=True, kw_only=True)
class Flags:
    """One settings dataclass as flags of a command, under `--PREFIX.`; `title` and
    `description` make them a group in `--help` (shared by every `Flags` of that title in
    the command); `defaults` replaces field
    defaults for this use (the same dataclass declared for several collectors);
    `old_spellings` adds deprecated spellings of a field's flag for this use only (a
    shared group that one command once spelled its own way)."""

    settings: type[Any]
    prefix: str = ""
    title: str | None = None
    description: str | None = None
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    old_spellings: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def read(self, args: argparse.Namespace, **given: Any) -> Any:
        """The dataclass built from the parsed flags; `given` holds fields that are not flags."""
        return read_settings(args, self.prefix, self.settings, **given)

    def declared(self) -> list[DeclaredFlag]:
        """The flags these settings add."""
        return declared_flags(self.settings, self.prefix)


@dataclass(frozen=True, kw_only=True)
class Subcommand:
    """A `fleetwatch` subcommand as data: its flags and the function it runs.

    `run` takes the parsed namespace and returns the exit status; it builds its settings
    from `flags` (`Flags.read`). A subcommand without `help` is not listed."""

    name: str
    run: Callable[[argparse.Namespace], int]
    flags: tuple[Flags, ...]
    help: str | None = None
    description: str | None = None


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


def _add_flags(group: argparse._ActionsContainer, flags: Flags) -> None:
    """Add one argument per setting of `flags.settings`."""
    for declared in flags.declared():
        spec, option, dest = declared.spec, declared.option, declared.dest
        default: Any = flags.defaults.get(declared.field.name, declared.field.default)
        deprecated = spec.deprecated + flags.old_spellings.get(declared.field.name, ())
        text = None if spec.help is None else spec.help.replace("%", "%%")
        if isinstance(default, bool):
            if deprecated:
                raise TypeError(f"{option}: an on/off switch cannot have a deprecated spelling")
            if spec.negatable:
                shown = f" (default {'on' if default else 'off'})"
                group.add_argument(
                    option,
                    dest=dest,
                    action=argparse.BooleanOptionalAction,
                    default=default,
                    help=argparse.SUPPRESS if text is None else text + shown,
                )
            else:
                group.add_argument(
                    option,
                    dest=dest,
                    action="store_true",
                    help=argparse.SUPPRESS if text is None else text,
                )
            continue
        if text is not None and default not in (None, (), dataclasses.MISSING):
            shown = ", ".join(map(spec.shown, default)) if spec.repeatable else spec.shown(default)
            text += f" (default {shown})"
        if spec.positional:
            group.add_argument(
                dest, type=spec.parse or str, choices=spec.choices, metavar=spec.metavar, help=text
            )
            continue
        canonical = group.add_argument(
            option,
            dest=dest,
            type=spec.parse or str,
            action="append" if spec.repeatable else "store",
            default=None if spec.repeatable or spec.required else default,
            # argparse would not count an old spelling as giving a required flag: ArgParser
            # checks those itself (`_REQUIRED_RENAMED`).
            required=spec.required and not deprecated,
            choices=spec.choices,
            metavar=spec.metavar,
            help=argparse.SUPPRESS if text is None else text,
        )
        if spec.required and deprecated:
            setattr(canonical, _REQUIRED_RENAMED, True)
        for old in deprecated:
            group.add_argument(
                f"--{old}",
                dest=dest,
                action=DeprecatedSpelling,
                canonical=canonical,
                type=spec.parse or str,
                metavar=spec.metavar,
            )


def read_settings(args: argparse.Namespace, prefix: str, settings: type[S], **given: Any) -> S:
    """Build the `settings` dataclass once from the flags its `Flags` added.

    `given` holds the values of fields that are not flags (derived at start)."""
    parsed = vars(args)
    values: dict[str, Any] = dict(given)
    for declared in declared_flags(settings, prefix):
        value = parsed[declared.dest]
        if declared.spec.repeatable:
            value = tuple(value) if value else declared.field.default
        values[declared.field.name] = value
    return settings(**values)


# -- the parser -------------------------------------------------------------------------------
class ArgParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: `fleetwatch export: error: ...`."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, and a required flag that has old spellings given in one of them."""
        parsed, extras = super().parse_known_args(args, namespace)
        missing = [
            action.option_strings[0]
            for action in self._actions
            if getattr(action, _REQUIRED_RENAMED, False) and getattr(parsed, action.dest) is None
        ]
        if missing:
            self.error(f"the following arguments are required: {', '.join(missing)}")
        return parsed, extras


def build_parser(
    *,
    prog: str,
    description: str,
    version: str,
    subcommands: Sequence[Subcommand],
    common: Sequence[Flags] = (),
) -> ArgParser:
    """The parser of every subcommand, each with its own flags and the `common` ones.

    Abbreviated flags are refused: a variable names a whole flag, so must the command line."""
    parser = ArgParser(prog=prog, description=description, allow_abbrev=False)
    parser.add_argument("--version", action="version", version=version)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgParser)
    subparsers.required = True
    for command in subcommands:
        named: dict[str, Any] = {} if command.help is None else {"help": command.help}
        sub = subparsers.add_parser(
            command.name, description=command.description, allow_abbrev=False, **named
        )
        groups: dict[str | None, argparse._ActionsContainer] = {None: sub}
        for flags in (*command.flags, *common):
            if flags.title not in groups:
                groups[flags.title] = sub.add_argument_group(flags.title, flags.description)
            _add_flags(groups[flags.title], flags)
        sub.set_defaults(run=command.run)
    return parser


def parse_tool_settings(
    settings: type[S], argv: Sequence[str] | None, *, prog: str, description: str
) -> S:
    """The settings of a contributor tool run with `python -m` (a generator), from its
    command line alone: its flags are the fields of `settings`, and no variable is read."""
    parser = ArgParser(prog=prog, description=description, allow_abbrev=False)
    flags = Flags(settings=settings)
    _add_flags(parser, flags)
    built: S = flags.read(parser.parse_args(argv))
    return built


def _given(action: argparse.Action, words: Sequence[str]) -> bool:
    """Does the command line (`words`) use this flag, as `--flag`, `--flag=V` or `--no-flag`?"""
    options = action.option_strings
    return any(word.split("=", 1)[0] in options for word in words if word.startswith("--"))


def env_arguments(parser: argparse.ArgumentParser, given: Sequence[str] = ()) -> list[str]:
    """Command-line words equivalent to the FLEETWATCH_* variables that match `parser`,
    leaving out every flag that the command line words `given` already set."""
    words: list[str] = []
    for action in parser._actions:
        longs = [
            o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")
        ]
        if not longs or isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        if _given(action, given):
            continue
        if isinstance(action, DeprecatedSpelling) and (
            _given(action.canonical, given)
            or env_name(action.canonical.option_strings[0]) in os.environ
        ):
            continue  # the new spelling, given on the command line or in its variable, wins
        value = os.environ.get(env_name(longs[0]))
        if value is None:
            continue
        if action.nargs == 0:  # a switch: store_true / BooleanOptionalAction
            lowered = value.strip().lower()
            if lowered not in _TRUE | _FALSE:
                parser.error(f"{env_name(longs[0])}={value!r}: expected true or false")
            if isinstance(action, argparse.BooleanOptionalAction):
                words.append(longs[0] if lowered in _TRUE else "--no-" + longs[0][2:])
            elif (lowered in _TRUE) == (action.const is True):
                words.append(longs[0])
        elif isinstance(action, argparse._AppendAction):  # repeatable: comma-separated
            words.extend(f"{longs[0]}={item.strip()}" for item in value.split(","))
        else:
            words.append(f"{longs[0]}={value}")
    return words


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """The parsed command line, with FLEETWATCH_* variables for the flags it does not give."""
    args_list = list(argv)
    commands = subparsers(parser)
    for position, word in enumerate(args_list):
        if word in commands:
            given = args_list[position + 1 :]
            args_list[position + 1 : position + 1] = env_arguments(commands[word], given)
            break
    return parser.parse_args(args_list)
