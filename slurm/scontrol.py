"""A small `scontrol` wrapper: every call under a deadline, node state parsed from
`scontrol show node -o`, drain and resume, and every failure classified and counted.

Slurm has no stable library API for Python; `scontrol` is what administrators and NHC use,
and its one-line output (`-o`) is stable across releases. A failure raises ScontrolError
whose `kind` says what went wrong (`missing`: no binary; `timeout`: past the deadline, the
process killed; `auth`: munge is down or refuses; `unreachable`: slurmctld does not answer;
`unknown_node`: no such node; `failed`: any other non-zero exit; `malformed`: output this
module cannot read) and whose message names the command and Slurm's own words. `Scontrol.errors`
counts failures by kind for the caller to export; a failed call changes nothing.

The calls are blocking (one short subprocess each); an asyncio caller runs them in a thread.
"""

from __future__ import annotations

import collections
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

DEFAULT_TIMEOUT = 10.0  # seconds; scontrol answers in milliseconds when slurmctld is up
ERROR_KINDS = ("missing", "timeout", "auth", "unreachable", "unknown_node", "failed", "malformed")

# A `gpu` entry of a node's comma-separated `Gres` (name, then `:type:count`, `:count` or a
# socket list in parentheses).
GPU_GRES = re.compile(r"(?:^|,)gpu(?:[:(]|,|$)")
# Node fields that 22.05 and later may print after `Reason=`; the reason runs up to one.
_REASON = " Reason="
_AFTER_REASON = re.compile(" (?:Comment|Extra|InstanceId|InstanceType|ResumeAfterTime)=")


class ScontrolError(Exception):
    """An `scontrol` call failed; `kind` is one of ERROR_KINDS, the message says what."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_line(line: str) -> dict[str, str]:
    """One line of `scontrol show ... -o` as field -> value. A node's `Reason=` (free text
    with spaces, `[user@time]` at its end) runs to the end of the line, or to a field Slurm
    prints after it; other values end at the next space. A field seen twice keeps its last
    value.

    One pass over the line, in time linear in its length (found by the fuzzer: a line of
    384 KB of words took 1.9 s, and 3,000 `Reason=` fields, each followed by a field printed
    after it, recursed past Python's limit)."""
    words: dict[str, list[str]] = {}
    at = 0
    while True:
        reason_at = line.find(_REASON, at)
        _add_words(words, line[at : len(line) if reason_at < 0 else reason_at])
        if reason_at < 0:
            return {name: " ".join(parts) for name, parts in words.items()}
        start = reason_at + len(_REASON)
        after = _AFTER_REASON.search(line, start)
        end = len(line) if after is None else after.start()
        words["Reason"] = [line[start:end].strip()]
        if after is None:
            return {name: " ".join(parts) for name, parts in words.items()}
        at = end + 1


def _add_words(words: dict[str, list[str]], text: str) -> None:
    """`text`'s `Key=value` fields into `words`, each value as its words: a token without
    `=` continues the field before it (OS=Linux 6.1 #1 ...)."""
    value_words: list[str] | None = None
    for token in text.split():
        name, has_value, value = token.partition("=")
        if has_value and name and name.replace("_", "").isalnum():
            value_words = words[name] = [value]
        elif value_words is not None:
            value_words.append(token)


@dataclass(frozen=True)
class Node:
    """One node as `scontrol show node` reports it."""

    name: str
    state: str  # e.g. IDLE, IDLE+DRAIN, MIXED+DRAIN, DOWN*+DRAIN
    reason: str  # the free text without Slurm's `[user@time]` suffix; "" when none
    reason_by: str  # who set the reason (`root`), "" when none
    fields: Mapping[str, str] = field(repr=False)

    @property
    def flags(self) -> frozenset[str]:
        """The state's words (`IDLE`, `DRAIN`, ...), without the not-responding `*`."""
        return frozenset(word.rstrip("*") for word in self.state.split("+"))

    @property
    def drained(self) -> bool:
        """Drained or draining: Slurm schedules nothing new on it."""
        return bool({"DRAIN", "DRAINING", "DRAINED"} & self.flags)

    @property
    def has_gpus(self) -> bool:
        """Its `Gres` names a `gpu` GRES (`gpu:8`, `gpu:h100:8(S:0-1)`, `nic:1,gpu:4`); a
        node configured without GPUs shows `Gres=(null)`."""
        return GPU_GRES.search(self.fields.get("Gres", "")) is not None

    @classmethod
    def parse(cls, line: str) -> Node:
        """A node from one line of `scontrol show node -o`; ScontrolError(malformed) when the
        line has no NodeName or State."""
        fields = parse_line(line)
        if not fields.get("NodeName") or not fields.get("State"):
            raise ScontrolError(
                "malformed", f"scontrol node line without NodeName/State: {line[:120]!r}"
            )
        reason, by = split_reason(fields.get("Reason", ""))
        return cls(
            name=fields["NodeName"],
            state=fields["State"],
            reason=reason,
            reason_by=by,
            fields=fields,
        )


PATH_MAX = 4096  # bytes of a path Linux takes (limits.h)


def state_save_location(text: str) -> str:
    """slurmctld's `StateSaveLocation` from `scontrol show config` (`StateSaveLocation =
    /var/spool/slurmctld`). ScontrolError(malformed) when the output names none, names two,
    or names something that is no absolute path (`(null)`, a relative path, control
    characters, longer than a path can be): fleetwatch writes its state file there."""
    values = {
        value.strip()
        for key, sep, value in (line.partition("=") for line in text.splitlines())
        if sep and key.strip() == "StateSaveLocation"
    }
    if not values:
        raise ScontrolError("malformed", "scontrol show config names no StateSaveLocation")
    if len(values) > 1:
        shown = ", ".join(repr(v[:60]) for v in sorted(values)[:3])
        raise ScontrolError(
            "malformed", f"scontrol show config names {len(values)} StateSaveLocations: {shown}"
        )
    (value,) = values
    if (
        not value.startswith("/")
        or not value.isprintable()
        or len(value.encode("utf-8", "surrogatepass")) > PATH_MAX
    ):
        raise ScontrolError("malformed", f"StateSaveLocation is no absolute path: {value[:120]!r}")
    return value


def split_reason(text: str) -> tuple[str, str]:
    """`fleetwatch:xid GPUFallenOffBus [root@2026-01-01T00:00:00]` → the reason and `root`."""
    body, bracket, tail = text.rpartition(" [")
    if bracket and tail.endswith("]") and "@" in tail:
        return body.strip(), tail[:-1].partition("@")[0]
    return text.strip(), ""


@dataclass
class Scontrol:
    """`scontrol` with a deadline per call and failures counted by kind in `errors`.

    `binary` is a name found on PATH or a path; `env` adds to the environment (SLURM_CONF
    for a cluster other than the default one)."""

    binary: str = "scontrol"
    timeout: float = DEFAULT_TIMEOUT
    env: Mapping[str, str] = field(default_factory=dict)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)

    def run(self, *args: str) -> str:
        """`scontrol ARGS`: its standard output, or ScontrolError (counted)."""
        argv = [self.binary, *args]
        try:
            return self._run(argv)
        except ScontrolError as exc:
            self.errors[exc.kind] += 1
            raise

    def _run(self, argv: Sequence[str]) -> str:
        command = shlex.join(argv)
        try:
            done = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=self.timeout,
                env={**os.environ, **self.env},
                check=False,
            )
        except FileNotFoundError:
            raise ScontrolError(
                "missing", f"{argv[0]} not found: is slurm-client installed?"
            ) from None
        except subprocess.TimeoutExpired:
            raise ScontrolError(
                "timeout", f"{command} did not answer within {self.timeout:g}s (killed)"
            ) from None
        except OSError as exc:
            raise ScontrolError("failed", f"{command} could not run: {exc}") from None
        if done.returncode != 0:
            said = " ".join((done.stderr.strip() or done.stdout.strip() or "no output").split())
            raise ScontrolError(_kind(said), f"{command} exited {done.returncode}: {said}")
        return done.stdout

    def nodes(self) -> list[Node]:
        """Every node of the cluster."""
        out = self.run("show", "node", "-o")
        return [self._parse(line) for line in out.splitlines() if line.strip()]

    def node(self, name: str) -> Node:
        """One node; ScontrolError(unknown_node) when Slurm has none of that name."""
        out = self.run("show", "node", "-o", name)
        lines = [line for line in out.splitlines() if line.strip()]
        if len(lines) != 1:
            self.errors["malformed"] += 1
            raise ScontrolError(
                "malformed", f"scontrol show node {name} printed {len(lines)} lines, not 1"
            )
        node = self._parse(lines[0])
        if node.name != name:
            self.errors["malformed"] += 1
            raise ScontrolError("malformed", f"asked scontrol for node {name}, got {node.name}")
        return node

    def _parse(self, line: str) -> Node:
        try:
            return Node.parse(line)
        except ScontrolError as exc:
            self.errors[exc.kind] += 1
            raise

    def drain(self, name: str, reason: str) -> None:
        """Drain `name` with `reason` (Slurm appends `[user@time]`). Running jobs finish;
        nothing new starts there."""
        if not reason.strip():
            raise ValueError("a drain needs a reason: Slurm refuses an empty one")
        self.run("update", f"nodename={name}", "state=drain", f"reason={reason}")

    def resume(self, name: str) -> None:
        """Put a drained node back into service."""
        self.run("update", f"nodename={name}", "state=resume")


def _kind(said: str) -> str:
    """The ERROR_KINDS entry for what a failed scontrol printed."""
    lowered = said.lower()
    if "munge" in lowered or "authentication" in lowered or "auth/" in lowered:
        return "auth"
    if "not found" in lowered or "invalid node name" in lowered:
        return "unknown_node"
    if "unable to contact slurm controller" in lowered or "connect" in lowered:
        return "unreachable"
    return "failed"
