"""A stand-in for `scontrol`, for the tainter's Slurm backend tests where no Slurm runs.

`FakeSlurm(directory)` writes an executable `scontrol` there that runs this file as a
program: it keeps node states in `slurm.json`, appends every call to `calls.jsonl`, and
answers what the backend asks as Slurm 22.05 does (`-o show node [NAME]` one node a line
with `Reason=TEXT [user@time]` last, `show config`, `update nodename=N state=drain|resume
reason=...`, `Invalid node name specified` for an unknown node). A test makes it hang
(`hang`) or fail (`fail`) to check deadlines and backoff. The real Slurm tests use
`fleetwatch.sim.slurm` instead.
"""

from __future__ import annotations

import fcntl
import json
import sys
import time
from pathlib import Path
from typing import Any

STATE = "slurm.json"
CALLS = "calls.jsonl"


class FakeSlurm:
    """The fake's directory, its scontrol and its state, seen from a test."""

    def __init__(
        self,
        directory: Path,
        nodes: tuple[str, ...] = ("gpu01", "gpu02"),
        *,
        cpu_nodes: tuple[str, ...] = (),
    ) -> None:
        """Nodes `nodes` with two GPUs each (`Gres=gpu:2`), and `cpu_nodes` with none
        (`Gres=(null)`)."""
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.scontrol = directory / "scontrol"
        self.scontrol.write_text(
            f'#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} {directory} "$@"\n'
        )
        self.scontrol.chmod(0o755)
        self.save_location = directory / "statesave"
        self._write(
            {
                "nodes": {
                    name: {"state": "IDLE", "reason": "", "user": "", "gres": gres}
                    for names, gres in ((nodes, "gpu:2"), (cpu_nodes, "(null)"))
                    for name in names
                },
                "config": {"StateSaveLocation": str(self.save_location)},
                "hang": False,
                "fail": False,
            }
        )

    def _write(self, data: dict[str, Any]) -> None:
        (self.directory / STATE).write_text(json.dumps(data))

    def _read(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.directory / STATE).read_text())
        return data

    def set(self, **flags: bool) -> None:
        """Make every later call hang (`hang=True`) or fail (`fail=True`), or not."""
        data = self._read()
        data.update(flags)
        self._write(data)

    def admin(self, node: str, *, state: str, reason: str) -> None:
        """What a person's scontrol (or NHC) does to `node`."""
        data = self._read()
        data["nodes"][node].update(state=state, reason=reason, user="admin")
        self._write(data)

    def node(self, name: str) -> dict[str, str]:
        """`name`'s state, reason and who set it."""
        node: dict[str, str] = self._read()["nodes"][name]
        return {key: node[key] for key in ("state", "reason", "user")}

    def calls(self) -> list[list[str]]:
        """Every call so far, its arguments."""
        path = self.directory / CALLS
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def updates(self) -> list[list[str]]:
        """The `update` calls so far."""
        return [c for c in self.calls() if c[:1] == ["update"]]


def _line(name: str, node: dict[str, str]) -> str:
    reason = (
        f" Reason={node['reason']} [{node['user'] or 'root'}@2026-12-03T06:00:00]"
        if node["reason"]
        else ""
    )
    return (
        f"NodeName={name} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=1 Gres={node['gres']} "
        f"NodeAddr=127.0.0.1 NodeHostName=localhost Version=22.05.8 RealMemory=1 "
        f"State={node['state']} ThreadsPerCore=1 Partitions=main CfgTRES=cpu=1 "
        f"CurrentWatts=0 AveWatts=0{reason}"
    )


def main(argv: list[str]) -> int:
    """Run as scontrol: `fake_scontrol.py DIRECTORY ARGS...`."""
    directory, args = Path(argv[0]), argv[1:]
    with open(directory / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(directory / CALLS, "a") as calls:
            calls.write(json.dumps(args) + "\n")
        data = json.loads((directory / STATE).read_text())
    if data["hang"]:
        time.sleep(3600)
    if data["fail"]:
        print("slurm_load_node error: Unable to contact slurm controller", file=sys.stderr)
        return 1
    words = [a for a in args if a != "-o"]
    nodes: dict[str, dict[str, str]] = data["nodes"]
    if words[:2] == ["show", "node"]:
        names = words[2:] or sorted(nodes)
        if any(n not in nodes for n in names):
            print(f"Node {names[0]} not found", file=sys.stderr)
            return 1
        print("\n".join(_line(n, nodes[n]) for n in names))
        return 0
    if words[:2] == ["show", "config"]:
        print("Configuration data as of 2026-12-03T06:00:00")
        for key, value in data["config"].items():
            print(f"{key:<22} = {value}")
        return 0
    if words[:1] == ["update"]:
        fields = dict(w.split("=", 1) for w in words[1:])
        name = fields.get("nodename", "")
        if name not in nodes:
            print("Invalid node name specified", file=sys.stderr)
            return 1
        with open(directory / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = json.loads((directory / STATE).read_text())
            node = data["nodes"][name]
            base = node["state"].split("+")[0]
            if fields.get("state") == "drain":
                node.update(state=f"{base}+DRAIN", reason=fields["reason"], user="root")
            elif fields.get("state") == "resume":
                node.update(state=base, reason="", user="")
            (directory / STATE).write_text(json.dumps(data))
        return 0
    print(f"fake scontrol: unsupported {args}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
