"""NVIDIA's Xid catalog (`xid_catalog.yaml`) and the lists derived from it.

One data file says, per Xid, what NVIDIA recommends doing and whether it points at
hardware; the critical list the alert rules use, the report's RMA list and docs/xid.md are
derived here, so no list of Xid numbers is written twice. A malformed catalog is refused
with an error naming the file, the entry and the key.

`python -m fleetwatch.rules.xids docs/xid.md` rewrites the Markdown table (`--check`
reports drift instead).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

import yaml

from fleetwatch.flags import REQUIRED, parse_tool_settings, setting

CATALOG: Final = "xid_catalog.yaml"
ACTIONS: Final = ("none", "restart_application", "reset_gpu", "reboot_node", "contact_support")
"""NVIDIA's immediate actions, least to most disruptive (contact_support last: a person)."""
CRITICAL_ACTIONS: Final = frozenset({"reset_gpu", "reboot_node", "contact_support"})
FALLEN_OFF_BUS: Final = 79
"""GPUFallenOffBus (and the report's drain rows) own Xid 79: the derived lists leave it out."""
_KEYS: Final[dict[str, type]] = {
    "code": int,
    "name": str,
    "bucket": str,
    "action": str,
    "hardware": bool,
    "description": str,
}


class CatalogError(ValueError):
    """The Xid catalog file is malformed; the message names the file, entry and key."""


@dataclass(frozen=True, kw_only=True)
class XidEntry:
    """One Xid: NVIDIA's mnemonic and bucket, the action in our words, hardware or not."""

    code: int
    name: str
    bucket: str
    action: str
    hardware: bool
    description: str


@dataclass(frozen=True)
class XidCatalog:
    """The entries in code order."""

    entries: tuple[XidEntry, ...]

    def critical(self) -> tuple[int, ...]:
        """Xids whose action needs more than restarting the application (79 excluded)."""
        return tuple(
            e.code
            for e in self.entries
            if e.action in CRITICAL_ACTIONS and e.code != FALLEN_OFF_BUS
        )

    def rma(self) -> tuple[int, ...]:
        """Hardware Xids that need a reset or support: repeated, the GPU goes back (RMA)."""
        return tuple(
            e.code
            for e in self.entries
            if e.hardware and e.action in {"reset_gpu", "contact_support"}
        )


def _entry(raw: Any, index: int, source: str) -> XidEntry:
    where = f"{source}: entry {index}"
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: expected a mapping with keys {', '.join(_KEYS)}")
    if type(raw.get("code")) is int:
        where += f" (xid {raw['code']})"
    for key, kind in _KEYS.items():
        if key not in raw:
            raise CatalogError(f"{where}: missing key {key!r}")
        value = raw[key]
        # bool is an int subclass: `code: true` must not pass as Xid 1.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise CatalogError(f"{where}: {key}: expected {kind.__name__}, got {value!r}")
        if isinstance(value, str) and not value.strip():
            raise CatalogError(f"{where}: {key}: must not be empty")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise CatalogError(f"{where}: unknown key {unknown[0]!r}")
    if not 1 <= raw["code"] <= 999:
        raise CatalogError(f"{where}: code: expected 1..999, got {raw['code']}")
    if raw["action"] not in ACTIONS:
        raise CatalogError(
            f"{where}: action: unknown action {raw['action']!r} (expected one of "
            f"{', '.join(ACTIONS)})"
        )
    return XidEntry(**raw)


def parse_catalog(text: str, *, source: str = CATALOG) -> XidCatalog:
    """The catalog in `text` (YAML), validated; `source` names it in errors."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("xids"), list):
        raise CatalogError(f"{source}: expected a mapping with a list under 'xids'")
    entries: dict[int, XidEntry] = {}
    for index, raw in enumerate(document["xids"]):
        entry = _entry(raw, index, source)
        if entry.code in entries:
            raise CatalogError(f"{source}: entry {index} (xid {entry.code}): duplicate code")
        entries[entry.code] = entry
    return XidCatalog(tuple(entries[code] for code in sorted(entries)))


@functools.cache
def shipped_catalog() -> XidCatalog:
    """The catalog shipped in this package."""
    text = resources.files(__package__).joinpath(CATALOG).read_text(encoding="utf-8")
    return parse_catalog(text)


def markdown(catalog: XidCatalog) -> str:
    """docs/xid.md: the catalog as a table, with the derived lists."""
    critical = ", ".join(map(str, catalog.critical()))
    rma = ", ".join(map(str, catalog.rma()))
    lines = [
        "# Xid catalog",
        "",
        "<!-- Generated from rules/xid_catalog.yaml by `python -m fleetwatch.rules.xids "
        "docs/xid.md`; do not edit. -->",
        "",
        "NVIDIA's Xid catalog as fleetwatch ships it (`rules/xid_catalog.yaml`, which cites "
        "its sources). *Action* is NVIDIA's immediate action (*bucket*, as the catalog "
        "writes it) in fleetwatch's words; *hardware* marks Xids that point at the GPU's "
        "hardware rather than the application, driver or firmware.",
        "",
        f"- Critical (`GPUXidCritical`; action reset_gpu, reboot_node or contact_support; "
        f"79 is `GPUFallenOffBus`'s): {critical}.",
        f"- RMA candidates in `fleetwatch report` (hardware, action reset_gpu or "
        f"contact_support): {rma}.",
        "",
        "| Xid | Name | Bucket | Action | Hardware | Description |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {e.code} | `{e.name}` | {e.bucket} | {e.action} | "
        f"{'yes' if e.hardware else 'no'} | {e.description} |"
        for e in catalog.entries
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, kw_only=True)
class MarkdownSettings:
    """The arguments of `python -m fleetwatch.rules.xids`."""

    output: Path = setting(
        REQUIRED, parse=Path, positional=True, help="the Markdown file (docs/xid.md)"
    )
    check: bool = setting(False, negatable=False, help="report drift, write nothing")


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or `--check`) the Markdown table of the shipped catalog; 1 on drift."""
    args = parse_tool_settings(
        MarkdownSettings,
        argv,
        prog="python -m fleetwatch.rules.xids",
        description="Write docs/xid.md from the Xid catalog.",
    )
    text = markdown(shipped_catalog())
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: regenerate it", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
