"""infiniband-diags (`perfquery`, `ibstat`) run through `sh`, and parsers for their output.

Every call has a timeout, runs without a shell, and takes device/port arguments only
after checking them against the sysfs listing, so nothing from outside reaches a command
line unchecked. A non-zero exit, a timeout, or `ibwarn`/`iberror`/`ibpanic` on stderr
becomes an `IbToolError` whose message is the tool's own reason.

The parsers are whitespace-tolerant and cover the variants seen on real hosts:
perfquery with and without `-x`, with and without CapMask2 (older tools print zeros that
look real for the 64-bit error counters, so those are only trusted when CapMask2 bit 1
is set); ibstat with string-sorted devices, `Effective speed:` lines, down ports whose
rate means nothing, and output cut short by `ibpanic`.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

# perfquery field names (both spellings) -> error name used by the collector.
PERFQUERY_ERRORS: Final[Mapping[str, str]] = {
    "SymbolErrorCounter": "symbol",
    "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed",
    "PortRcvErrors": "rcv",
    "PortRcvRemotePhysicalErrors": "rcv_remote_physical",
    "PortRcvRemPhysErrors": "rcv_remote_physical",
    "PortRcvSwitchRelayErrors": "rcv_switch_relay",
    "PortXmitDiscards": "xmit_discards",
    "PortXmitConstraintErrors": "xmit_constraint",
    "PortRcvConstraintErrors": "rcv_constraint",
    "LocalLinkIntegrityErrors": "local_link_integrity",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun",
    "VL15Dropped": "vl15_dropped",
    "PortXmitWait": "xmit_wait",
}
_CAPMASK2_64BIT_ERRORS: Final = 0x2
# Environment variable naming the sysfs root, for tools that can use it (the fake tools).
SYSFS_ROOT_ENV: Final = "FLEETWATCH_SYSFS_ROOT"
_HEADER = re.compile(
    r"#\s*Port\s+(?P<kind>extended\s+)?counters:.*?"
    r"\(\s*CapMask:\s*(?P<cap>0x[0-9a-fA-F]+)(?:\s+CapMask2:\s*(?P<cap2>0x[0-9a-fA-F]+))?",
    re.IGNORECASE,
)
# The value starts at its first character that is no padding dot: a value that could start
# with a dot backtracks quadratically over a long run of dots.
_FIELD = re.compile(r"\s*([A-Za-z0-9_]+)\s*:[.\s]*([^.\s]\S*)\s*")
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.]*")
_TOOL_MARKERS: Final = ("ibwarn", "iberror", "ibpanic")


class IbToolError(Exception):
    """A tool call failed; the message says why (the tool's own stderr where it has one)."""


@dataclass(frozen=True, kw_only=True)
class PerfqueryCounters:
    """One perfquery listing: values by field name, plus the capability masks."""

    extended: bool
    cap_mask: int | None
    cap_mask2: int | None
    values: Mapping[str, int]

    @property
    def has_64bit_errors(self) -> bool:
        """True when the error fields are real 64-bit counters (CapMask2 bit 1)."""
        return (
            self.extended
            and self.cap_mask2 is not None
            and bool(self.cap_mask2 & _CAPMASK2_64BIT_ERRORS)
        )

    def error_counters(self) -> dict[str, int]:
        """64-bit error counters by error name; empty unless `has_64bit_errors`."""
        if not self.has_64bit_errors:
            return {}
        return {
            error: self.values[name]
            for name, error in PERFQUERY_ERRORS.items()
            if name in self.values
        }


def parse_perfquery(text: str) -> PerfqueryCounters:
    """Parse `perfquery [-x]` stdout; raises IbToolError when there is no header."""
    header = None
    values: dict[str, int] = {}
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            header = header or _HEADER.search(line)
            continue
        match = _FIELD.fullmatch(line)
        if match is None:
            continue
        try:
            value = int(match.group(2), 0)
        except ValueError:
            continue
        if value >= 0:  # no counter is negative: "-1" is garbage, not a reading
            values[match.group(1)] = value
    if header is None:
        raise IbToolError(f"perfquery printed no counters header: {text.strip()[:120]!r}")
    cap2 = header.group("cap2")
    return PerfqueryCounters(
        extended=header.group("kind") is not None,
        cap_mask=int(header.group("cap"), 16),
        cap_mask2=int(cap2, 16) if cap2 else None,
        values=values,
    )


@dataclass(frozen=True, kw_only=True)
class IbstatPort:
    """One `Port N:` block. `rate_gbps` is None unless the port is Active."""

    port: int
    state: str | None = None
    physical_state: str | None = None
    rate_gbps: float | None = None
    base_lid: int | None = None
    sm_lid: int | None = None
    port_guid: str | None = None
    link_layer: str | None = None


@dataclass(frozen=True, kw_only=True)
class IbstatCa:
    """One `CA 'mlx5_0'` block."""

    name: str
    ca_type: str | None = None
    number_of_ports: int | None = None
    firmware_version: str | None = None
    hardware_version: str | None = None
    node_guid: str | None = None
    system_image_guid: str | None = None
    ports: tuple[IbstatPort, ...] = ()

    @property
    def complete(self) -> bool:
        """Every announced port was listed down to its `Link layer` line."""
        return (
            self.number_of_ports is not None
            and len(self.ports) == self.number_of_ports
            and all(port.link_layer is not None for port in self.ports)
        )


@dataclass
class _CaBuilder:
    fields: dict[str, str]
    ports: list[dict[str, str]] = field(default_factory=list)


def _number(text: str | None) -> int | None:
    try:
        number = int(text, 0) if text is not None else None
    except ValueError:
        return None
    return None if number is None or number < 0 else number


def _port(fields: dict[str, str], number: int) -> IbstatPort:
    state = fields.get("State")
    rate = fields.get("Rate")
    active = state is not None and state.lower() == "active"
    try:
        rate_gbps = float(rate.split()[0]) if active and rate else None
    except ValueError:
        rate_gbps = None
    if rate_gbps is not None and not 0 <= rate_gbps < math.inf:  # "-1", "inf", "nan"
        rate_gbps = None
    return IbstatPort(
        port=number,
        state=state,
        physical_state=fields.get("Physical state"),
        rate_gbps=rate_gbps,
        base_lid=_number(fields.get("Base lid")),
        sm_lid=_number(fields.get("SM lid")),
        port_guid=fields.get("Port GUID"),
        link_layer=fields.get("Link layer"),
    )


def parse_ibstat(text: str) -> list[IbstatCa]:
    """Parse `ibstat` stdout into CAs in the order printed (tools sort names as strings).

    A listing cut short (a device vanished: `ibpanic`) yields its complete CAs; the
    incomplete last one is kept with `complete == False` so callers can tell.
    """
    cas: list[tuple[str, _CaBuilder]] = []
    current: dict[str, str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(_TOOL_MARKERS):
            continue
        ca = re.fullmatch(r"CA\s+'([^']+)'", line)
        if ca:
            cas.append((ca.group(1), _CaBuilder(fields={})))
            current = cas[-1][1].fields
            continue
        port = re.fullmatch(r"Port\s+([0-9]{1,9})\s*:", line)
        if port and cas:
            current = {"#": port.group(1)}
            cas[-1][1].ports.append(current)
            continue
        key, sep, value = line.partition(":")
        if sep and current is not None:
            current[key.strip()] = value.strip()
    result = []
    for name, built in cas:
        f = built.fields
        result.append(
            IbstatCa(
                name=name,
                ca_type=f.get("CA type"),
                number_of_ports=_number(f.get("Number of ports")),
                firmware_version=f.get("Firmware version"),
                hardware_version=f.get("Hardware version"),
                node_guid=f.get("Node GUID"),
                system_image_guid=f.get("System image GUID"),
                ports=tuple(_port(p, int(p["#"])) for p in built.ports),
            )
        )
    return result


def tool_reason(printed: str) -> str | None:
    """The `ibwarn`/`iberror`/`ibpanic` lines of tool output, last first; None if none. Cut
    at 500 characters: the last line says why the tool failed, and a reason is logged."""
    lines = [line.strip() for line in printed.splitlines() if any(m in line for m in _TOOL_MARKERS)]
    return " | ".join(reversed(lines))[:500] if lines else None


@dataclass(frozen=True, kw_only=True)
class ToolOutput:
    """What a tool printed and whether it said it failed."""

    stdout: str
    error: str | None


class IbTools:
    """perfquery and ibstat found on a search path, called with a timeout and no shell."""

    def __init__(
        self,
        *,
        perfquery: str | None,
        ibstat: str | None,
        timeout_seconds: float,
        listing: Callable[[], Mapping[str, tuple[int, ...]]],
        env: Mapping[str, str],
    ) -> None:
        self._perfquery = perfquery
        self._ibstat = ibstat
        self._timeout = timeout_seconds
        self._listing = listing
        self._env = dict(env)

    @classmethod
    def find(
        cls,
        *,
        search_path: str | None,
        timeout_seconds: float,
        listing: Callable[[], Mapping[str, tuple[int, ...]]],
        sysfs_root: str,
    ) -> IbTools | None:
        """Tools on `search_path` (None: PATH); None when neither tool is installed."""
        perfquery = shutil.which("perfquery", path=search_path)
        ibstat = shutil.which("ibstat", path=search_path)
        if perfquery is None and ibstat is None:
            return None
        return cls(
            perfquery=perfquery,
            ibstat=ibstat,
            timeout_seconds=timeout_seconds,
            listing=listing,
            env={**os.environ, SYSFS_ROOT_ENV: sysfs_root},
        )

    def _check(self, device: str, port: int) -> None:
        ports = self._listing().get(device)
        if not _SAFE_NAME.fullmatch(device) or ports is None:
            raise IbToolError(f"device {device!r} is not in the sysfs listing")
        if port not in ports:
            raise IbToolError(f"port {port} of {device} is not in the sysfs listing")

    def run(self, program: str | None, *args: str) -> ToolOutput:
        """Run a tool; raise IbToolError on a missing tool, timeout or non-zero exit."""
        if program is None:
            raise IbToolError("tool is not installed")
        name = os.path.basename(program)
        import sh  # about 3 MiB: loaded by the first run of a tool, not by every exporter

        try:
            done = sh.Command(program)(
                *args,
                _timeout=self._timeout,
                _env=self._env,
                _tty_out=False,
                _return_cmd=True,
                _decode_errors="replace",
            )
        except sh.TimeoutException as exc:
            raise IbToolError(f"{name} timed out after {self._timeout:g}s") from exc
        except sh.ErrorReturnCode as exc:
            # Debian's tools print `iberror` on stdout and `ibwarn` on stderr.
            printed = exc.stderr.decode(errors="replace") + exc.stdout.decode(errors="replace")
            reason = tool_reason(printed) or printed.strip()[:200] or "no message"
            raise IbToolError(f"{name} exited with {exc.exit_code}: {reason}") from exc
        except OSError as exc:
            raise IbToolError(f"{name} could not run: {exc.strerror}") from exc
        return ToolOutput(
            stdout=str(done.stdout.decode(errors="replace")),
            error=tool_reason(done.stderr.decode(errors="replace")),
        )

    def perfquery_extended(self, device: str, port: int) -> PerfqueryCounters:
        """`perfquery -x -C DEVICE -P PORT` for the local port, parsed."""
        self._check(device, port)
        output = self.run(self._perfquery, "-x", "-C", device, "-P", str(port))
        if output.error is not None:
            raise IbToolError(f"perfquery: {output.error}")
        return parse_perfquery(output.stdout)

    def ibstat(self) -> tuple[list[IbstatCa], str | None]:
        """Every CA `ibstat` lists, and the reason when the listing was cut short.

        A truncated listing (`ibpanic`, exit 255) still returns its complete CAs.
        """
        try:
            output = self.run(self._ibstat)
        except IbToolError as exc:
            import sh  # loaded by `run` already

            partial = exc.__cause__
            if isinstance(partial, sh.ErrorReturnCode):
                cas = parse_ibstat(partial.stdout.decode(errors="replace"))
                return [ca for ca in cas if ca.complete], str(exc)
            raise
        return parse_ibstat(output.stdout), output.error
