"""NVIDIA's Xid catalog (`nvidia_xids.yaml`) and the lists derived from it.

One data file says, per Xid, what NVIDIA recommends doing and whether it points at
hardware; the critical list the alert rules use, the report's RMA list and docs/xid.md are
derived here, so no list of Xid numbers is written twice. A malformed catalog is refused
with an error naming the file, the entry and the key.

`python -m fleetwatch.catalog.nvidia_xids docs/xid.md` rewrites the Markdown table (`--check`
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

from fleetwatch.catalog.xid import GPU_XID_NVLINK5_ERRORS_TOTAL
from fleetwatch.flags import REQUIRED, parse_tool_settings, setting
from fleetwatch.shown import shown

CATALOG: Final = "nvidia_xids.yaml"
ACTIONS: Final = (
    "none",
    "update_software",
    "restart_application",
    "reset_gpu",
    "reboot_node",
    "check_mechanicals",
    "contact_support",
)
"""NVIDIA's immediate actions in our words, least to most disruptive (the last two need a
person at the node or at NVIDIA)."""
CRITICAL_ACTIONS: Final = frozenset(
    {"reset_gpu", "reboot_node", "check_mechanicals", "contact_support"}
)
BUCKET_ACTIONS: Final[dict[str, str]] = {
    "IGNORE": "none",
    "UPDATE_SWFW": "update_software",
    "RESTART_APP": "restart_application",
    "RESET_GPU": "reset_gpu",
    "RESTART_BM": "reboot_node",
    "RESTART_VM": "reboot_node",
    "CHECK_MECHANICALS": "check_mechanicals",
    "CONTACT_SUPPORT": "contact_support",
}
"""NVIDIA's fixed buckets and the one action each means: an entry that says otherwise is refused."""
DECISION_BUCKETS: Final = frozenset(
    {
        "WORKFLOW_XID_45",
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
        "CHECK_UVM",
        "XID_154",
    }
)
"""Buckets whose outcome NVIDIA decides over the message or the node's use: the entry writes
the action (its most severe outcome)."""
NVLINK5_XIDS: Final = range(144, 151)
DECODE_ACTIONS: Final[dict[str, str]] = {
    "IGNORE": "none",
    "RESET_GPU": "reset_gpu",
    "XID_154_EVAL": "restart_application",
}
"""Buckets of NVIDIA's "XID 144-150 Decode" sheet. XID_154_EVAL: the Xid 154 that follows
says the action (exported on its own); restart_application when none follows."""
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


_DECODE_KEYS: Final = frozenset(
    {"xid", "units", "error_status", "reason", "bucket", "fatal_bucket"}
)


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


@dataclass(frozen=True, kw_only=True)
class DecodeRule:
    """One row of NVIDIA's NVLink5 (Xid 144-150) decode table; None matches any value."""

    xid: int
    units: tuple[str, ...]
    error_status: int | None
    reason: int | None
    action: str
    fatal_action: str
    """The table's "Action 2" when the message says Fatal; `action` when it gives none."""

    def matches(self, *, xid: int, unit: str, error_status: int, reason: int) -> bool:
        """Whether this row describes the message's unit, error status and link-down reason."""
        return (
            xid == self.xid
            and unit in self.units
            and self.error_status in (None, error_status)
            and self.reason in (None, reason)
        )


@dataclass(frozen=True)
class XidCatalog:
    """The entries in code order, and the NVLink5 decode rows in file order."""

    entries: tuple[XidEntry, ...]
    nvlink5: tuple[DecodeRule, ...] = ()

    def entry(self, code: int) -> XidEntry | None:
        """The entry of Xid `code`; None when the catalog does not hold it."""
        return next((e for e in self.entries if e.code == code), None)

    def units(self, xid: int) -> frozenset[str]:
        """The NVLink5 units the decode table names for `xid`."""
        return frozenset(u for rule in self.nvlink5 if rule.xid == xid for u in rule.units)

    def decode(
        self, *, xid: int, unit: str, fatal: bool, intr_info: int, error_status: int
    ) -> str | None:
        """The action NVIDIA's decode table gives an NVLink5 Xid's message fields; None
        when no row describes them (the caller falls back to the entry's action)."""
        reason = (intr_info >> 20) & 0x3F  # link-down reason, V1 and V2 alike
        for rule in self.nvlink5:
            if rule.matches(xid=xid, unit=unit, error_status=error_status, reason=reason):
                return rule.fatal_action if fatal else rule.action
        return None

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
            raise CatalogError(f"{where}: {key}: expected {kind.__name__}, got {shown(value)}")
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
    bucket = raw["bucket"]
    if bucket not in BUCKET_ACTIONS and bucket not in DECISION_BUCKETS:
        raise CatalogError(
            f"{where}: bucket: unknown bucket {bucket!r} (expected one of "
            f"{', '.join(sorted([*BUCKET_ACTIONS, *DECISION_BUCKETS]))})"
        )
    if bucket in BUCKET_ACTIONS and raw["action"] != BUCKET_ACTIONS[bucket]:
        raise CatalogError(
            f"{where}: action: {raw['action']!r} contradicts bucket {bucket} (which means "
            f"{BUCKET_ACTIONS[bucket]!r})"
        )
    return XidEntry(**raw)


def _decode_bucket(raw: dict[str, Any], key: str, where: str) -> str:
    bucket = raw[key]
    if bucket not in DECODE_ACTIONS:
        raise CatalogError(
            f"{where}: {key}: unknown bucket {bucket!r} (expected one of "
            f"{', '.join(DECODE_ACTIONS)})"
        )
    return DECODE_ACTIONS[bucket]


def _optional_int(raw: dict[str, Any], key: str, top: int, where: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= top:
        raise CatalogError(
            f"{where}: {key}: expected null or an integer 0..{top:#x}, got {shown(value)}"
        )
    return value


def _decode_rule(raw: Any, index: int, source: str) -> DecodeRule:
    where = f"{source}: nvlink5_decode entry {index}"
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: expected a mapping with keys xid, units, bucket")
    unknown = sorted(set(raw) - _DECODE_KEYS)
    if unknown:
        raise CatalogError(f"{where}: unknown key {unknown[0]!r}")
    for key in ("xid", "units", "error_status", "bucket"):
        if key not in raw:
            raise CatalogError(f"{where}: missing key {key!r}")
    xid = raw["xid"]
    if type(xid) is not int or xid not in NVLINK5_XIDS:
        raise CatalogError(f"{where}: xid: the decode table is for Xids 144-150 only, got {xid!r}")
    units = raw["units"]
    if (
        not isinstance(units, list)
        or not units
        or not all(isinstance(u, str) and u.strip() for u in units)
    ):
        raise CatalogError(f"{where}: units: expected a list of unit names, got {units!r}")
    action = _decode_bucket(raw, "bucket", where)
    return DecodeRule(
        xid=xid,
        units=tuple(units),
        error_status=_optional_int(raw, "error_status", 0xFFFFFFFF, where),
        reason=_optional_int(raw, "reason", 0x3F, where),
        action=action,
        fatal_action=_decode_bucket(raw, "fatal_bucket", where)
        if "fatal_bucket" in raw
        else action,
    )


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
    decode = document.get("nvlink5_decode", [])
    if not isinstance(decode, list):
        raise CatalogError(f"{source}: nvlink5_decode: expected a list")
    rules = tuple(_decode_rule(raw, index, source) for index, raw in enumerate(decode))
    return XidCatalog(tuple(entries[code] for code in sorted(entries)), rules)


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
        "<!-- Generated from src/fleetwatch/catalog/nvidia_xids.yaml by "
        "`python -m fleetwatch.catalog.nvidia_xids docs/xid.md`; do not edit. -->",
        "",
        "NVIDIA's Xid catalog as fleetwatch ships it "
        "(`src/fleetwatch/catalog/nvidia_xids.yaml`). *Action* is NVIDIA's immediate action "
        "(*bucket*, as the catalog writes it) in fleetwatch's words; "
        "*hardware* marks Xids that point at the GPU's hardware rather than the application, "
        "driver or firmware.",
        "",
        "## Sources",
        "",
        "- The Xid table (codes, mnemonics, buckets): NVIDIA, [Analyzing Xid Errors with the "
        "Xid Catalog](https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), "
        "sheet *Xids*, column *Resolution Bucket (Immediate Action)*, read 2026-12-03 (the page "
        "carries no revision number), cross-checked against gpud's machine-generated copy of "
        "NVIDIA's spreadsheet (`leptonai/gpud`, "
        "`components/accelerator/nvidia/xid/catalog_generated.go`, commit `73e270e3`, "
        "generated 2025-10-29T00:35:32Z): the two agree on every code and bucket here.",
        "- The NVLink5 decode (Xids 144-150): the same page, sheet *XID 144-150 Decode* (its "
        "V1 <R575 and V2 >=R575 message layouts).",
        "- Descriptions, the *hardware* flag and the action of decision buckets (`WORKFLOW_*`, "
        "`CHECK_UVM`: their most severe outcome) are fleetwatch's.",
        "- Left out: codes the catalog marks *Unused*, DLA codes 152-153, and 162-172, which "
        "the catalog lists without a bucket; they read as unknown.",
        "",
        "## Derived lists",
        "",
        f"- Critical (`GPUXidCritical`; action reset_gpu, reboot_node, check_mechanicals or "
        f"contact_support; 79 is `GPUFallenOffBus`'s): {critical}. On a node with the "
        "kernel-log source, an NVLink5 Xid (144-150) among them alerts only when the decode "
        "below answers its message with reset_gpu; on a node with NVML events only, at the "
        "action above.",
        f"- RMA candidates in `fleetwatch report` (hardware, action reset_gpu or "
        f"contact_support): {rma}.",
        "",
        "## Xids",
        "",
        "| Xid | Name | Bucket | Action | Hardware | Description |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {e.code} | `{e.name}` | {e.bucket} | {e.action} | "
        f"{'yes' if e.hardware else 'no'} | {e.description} |"
        for e in catalog.entries
    ]
    lines += [
        "",
        "## NVLink5 decode (Xids 144-150)",
        "",
        "The driver prints `<unit> <Fatal|Nonfatal> XC<n> i<n> Link <nn> (<intrInfo> "
        "<errorStatus> ...)`. The kernel-log source looks the unit, error status and, for "
        "Xid 149 link-down rows, the link-down reason (intrInfo bits 25:20) up here and "
        f"counts the action in `{GPU_XID_NVLINK5_ERRORS_TOTAL}`; a message no row "
        "describes takes the Xid's action above. *Fatal* is the action when the message says "
        "Fatal (NVIDIA's *Action 2* for promotable errors). *Any* matches every value.",
        "",
        "| Xid | Unit | Error status | Link-down reason | Action | Fatal |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.xid} | {' / '.join(f'`{u}`' for u in r.units)} | "
        f"{'any' if r.error_status is None else f'`{r.error_status:#010x}`'} | "
        f"{'any' if r.reason is None else f'`{r.reason:06b}`'} | {r.action} | {r.fatal_action} |"
        for r in catalog.nvlink5
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, kw_only=True)
class MarkdownSettings:
    """The arguments of `python -m fleetwatch.catalog.nvidia_xids`."""

    output: Path = setting(
        REQUIRED, parse=Path, positional=True, help="the Markdown file (docs/xid.md)"
    )
    check: bool = setting(False, negatable=False, help="report drift, write nothing")


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or `--check`) the Markdown table of the shipped catalog; 1 on drift."""
    args = parse_tool_settings(
        MarkdownSettings,
        argv,
        prog="python -m fleetwatch.catalog.nvidia_xids",
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
