"""`fleetwatch slurm healthcheck`: Slurm's own health check (slurm.conf
`HealthCheckProgram`, or a check NHC runs).

It reads the local exporter's `/metrics` (`--exporter.url`); with no exporter answering, it
starts one (`fleetwatch export` on a free loopback port, with this process's FLEETWATCH_*
settings) for one collection, under the same deadline, and stops it. It judges the node on the
conditions one scrape can show of the alerts that take a node out (those with a taint reason
in rules/config.yaml), with the thresholds of rules/config.yaml (the shipped one, with the
override file `--rules.config-file` names merged over it), and when one holds it drains this node
(`SLURMD_NODENAME`, or `--healthcheck.node`) with the reason format the drain controller uses,
`fleetwatch:<reason> <alertname>`. It never resumes a node, and it leaves a node that is
already drained (by a person, another tool, or itself) as it is.

The whole run stays within `--healthcheck.deadline` (default 40 s, under Slurm's 60 s
kill): the scrape, the one-shot exporter and every scontrol call have their share, and a
hung NVML can cost at most the one-shot exporter's share (the process is killed). A check
that cannot judge (no exporter and none could start, scontrol failing) says so on standard
error and exits 0: slurmd holds a node's registration until the health check exits 0, and a
node must not be kept out because the checker, not the node, is broken.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.catalog.gpu import (
    GPU_FABRIC_DEGRADED,
    GPU_INFO,
    GPU_ROW_REMAP_FAILED,
    GPU_TEMPERATURE_CELSIUS,
    GPU_TEMPERATURE_MARGIN_CELSIUS,
    GPUS_EXPECTED,
    GPUS_VISIBLE,
)
from fleetwatch.catalog.nvlink import NVLINK_UP
from fleetwatch.rules.config import Config, load_config
from fleetwatch.slurm.scontrol import Scontrol, ScontrolError

if TYPE_CHECKING:
    from fleetwatch.slurm.cli import SlurmCommand

REASON_PREFIX: Final = "fleetwatch:"
"""Every fleetwatch drain reason starts with it: `fleetwatch:<reason> <alertname>`."""
ONE_SHOT_SHARE: Final = 0.6  # of the deadline, for a one-shot exporter's first collection

Samples = Mapping[str, list[tuple[dict[str, str], float]]]


@dataclass(frozen=True)
class Finding:
    """A condition that holds: the alert it is, its taint reason, what was seen."""

    alert: str
    reason: str
    detail: str

    @property
    def drain_reason(self) -> str:
        """`fleetwatch:<reason> <alertname>`, as the drain controller writes it."""
        return f"{REASON_PREFIX}{self.reason} {self.alert}"


def parse_exposition(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples of a Prometheus text exposition by metric name; ValueError when it is not one."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def _values(samples: Samples, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    return [
        (have, value)
        for have, value in samples.get(name, [])
        if all(have.get(key) == want for key, want in labels.items())
    ]


def _gpu(labels: Mapping[str, str]) -> str:
    return f"GPU {labels.get('gpu', '?')} ({labels.get('uuid', '?')})"


# Each check: the alert it stands for, and what in one scrape shows its condition, with the
# alert's threshold from config.yaml. Only alerts that take a node out (a taint reason).
Check = Callable[[Samples, Config], list[str]]


def _overheating(samples: Samples, config: Config) -> list[str]:
    """GPUs past their model's overheat policy (config.yaml's `overheat_policy`, else
    `gpu_temperature_celsius`), the model from fleetwatch_gpu_info by UUID."""
    models = {
        labels.get("uuid"): labels.get("name", "") for labels, _ in _values(samples, GPU_INFO.name)
    }
    margins = {
        labels.get("uuid"): value
        for labels, value in _values(samples, GPU_TEMPERATURE_MARGIN_CELSIUS.name)
    }
    found = []
    for labels, value in _values(samples, GPU_TEMPERATURE_CELSIUS.name, sensor="gpu"):
        model = models.get(labels.get("uuid"), "")
        margin = margins.get(labels.get("uuid"))
        headroom = config.overheat_headroom(model, value, margin)
        if headroom is None or headroom >= 0:
            continue
        policy = config.overheat_limit(model)
        if policy.margin_celsius is not None and margin is not None:
            found.append(
                f"{_gpu(labels)} at {value:g} °C, {margin:g} °C from its slowdown limit, "
                f"closer than {model}'s policy of {policy.margin_celsius:g} °C"
            )
        else:
            found.append(f"{_gpu(labels)} at {value:g} °C, above {policy.celsius:g} °C")
    return found


def _fallen_off_bus(samples: Samples, config: Config) -> list[str]:
    visible = _values(samples, GPUS_VISIBLE.name)
    expected = _values(samples, GPUS_EXPECTED.name)
    if not visible or not expected or visible[0][1] >= expected[0][1]:
        return []
    return [f"NVML sees {visible[0][1]:g} GPUs, {expected[0][1]:g} expected"]


def _row_remap_failed(samples: Samples, config: Config) -> list[str]:
    return [
        f"{_gpu(labels)} failed a row remap"
        for labels, value in _values(samples, GPU_ROW_REMAP_FAILED.name)
        if value > 0
    ]


def _fabric_degraded(samples: Samples, config: Config) -> list[str]:
    return [
        f"{_gpu(labels)} NVLink fabric degraded"
        for labels, value in _values(samples, GPU_FABRIC_DEGRADED.name)
        if value == 1
    ]


def _nvlink_down(samples: Samples, config: Config) -> list[str]:
    return [
        f"{_gpu(labels)} NVLink {labels.get('link', '?')} down"
        for labels, value in _values(samples, NVLINK_UP.name)
        if value == 0
    ]


CHECKS: Final[tuple[tuple[str, Check], ...]] = (
    ("GPUFallenOffBus", _fallen_off_bus),
    ("GPURowRemapFailed", _row_remap_failed),
    ("GPUFabricDegraded", _fabric_degraded),
    ("NVLinkDown", _nvlink_down),
    ("GPUOverheating", _overheating),
)
"""In the order a drain names them (the first that holds names the drain)."""


def findings(samples: Samples, config: Config) -> list[Finding]:
    """Every condition that holds in `samples`, each with its alert's taint reason."""
    found = []
    for alert, check in CHECKS:
        reason = config.alerts[alert].taint
        if reason is None:  # config.yaml no longer takes the node out on it
            continue
        found += [Finding(alert, reason, detail) for detail in check(samples, config)]
    return found


class Deadline:
    """What is left of the run's budget."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._end = clock() + seconds

    def left(self) -> float:
        return max(0.0, self._end - self._clock())


def scrape(url: str, timeout: float) -> str:
    """`URL/metrics` as text; OSError when nothing answers."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout) as response:  # noqa: S310
        body: bytes = response.read()
        return body.decode()


def one_shot(deadline: Deadline, environ: Mapping[str, str]) -> str:
    """Start `fleetwatch export` on a free loopback port, wait for its first collection
    (`/readyz`), read `/metrics`, stop it; within ONE_SHOT_SHARE of what is left. OSError
    naming what failed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    budget = Deadline(deadline.left() * ONE_SHOT_SHARE)
    exporter = subprocess.Popen(
        [sys.executable, "-m", "fleetwatch", "export", f"--web.listen-address=127.0.0.1:{port}"],
        env=dict(environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        while budget.left() > 0:
            if exporter.poll() is not None:
                said = exporter.stderr.read().decode(errors="replace") if exporter.stderr else ""
                raise OSError(f"the one-shot exporter exited {exporter.returncode}: {said[-500:]}")
            try:
                with urllib.request.urlopen(  # noqa: S310 - loopback
                    f"{url}/readyz", timeout=min(2.0, budget.left() + 0.01)
                ) as ready:
                    if ready.status == 200:
                        return scrape(url, timeout=max(0.5, budget.left()))
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise OSError("the one-shot exporter did not finish a collection in time")
    finally:
        exporter.kill()
        exporter.wait(timeout=5)


def run(command: SlurmCommand, environ: Mapping[str, str]) -> int:
    """The health check: judge, drain on a finding, print what was done; 0 unless the
    command line is wrong."""
    deadline = Deadline(command.deadline)
    node = command.node or environ.get("SLURMD_NODENAME", "")
    if not node:
        print(
            "fleetwatch slurm healthcheck: error: no node: set SLURMD_NODENAME "
            "(slurmd does) or give --healthcheck.node",
            file=sys.stderr,
        )
        return 2
    try:
        text = scrape(command.exporter_url, timeout=min(5.0, deadline.left() / 4))
        where = command.exporter_url
    except OSError as exc:
        try:
            text = one_shot(deadline, environ)
            where = f"a one-shot exporter ({command.exporter_url} did not answer: {exc})"
        except OSError as failed:
            _say(f"cannot judge node {node}: {command.exporter_url}: {exc}; {failed}")
            return 0
    try:
        samples = parse_exposition(text)
    except ValueError as exc:
        _say(f"cannot judge node {node}: {where} served no valid exposition: {exc}")
        return 0
    found = findings(samples, load_config(override=command.rules_config))
    if not found:
        print(f"fleetwatch slurm healthcheck: node {node} healthy ({where})")
        return 0
    print(f"fleetwatch slurm healthcheck: node {node}, read from {where}:")
    for finding in found:
        print(f"  {finding.alert}: {finding.detail}")
    return _drain(node, found[0], deadline, dry_run=command.dry_run)


def _drain(node: str, finding: Finding, deadline: Deadline, *, dry_run: bool) -> int:
    """Drain `node` for `finding` unless it is drained already (by anyone: a person's reason
    is theirs to keep)."""
    scontrol = Scontrol(timeout=max(1.0, min(10.0, deadline.left() / 2)))
    try:
        current = scontrol.node(node)
        if current.drained:
            _say(f"node {node} is already drained ({current.reason!r}); left as it is")
            return 0
        if dry_run:
            print(f"fleetwatch slurm healthcheck: would drain {node}: {finding.drain_reason}")
            return 0
        scontrol.drain(node, finding.drain_reason)
    except ScontrolError as exc:
        _say(f"cannot drain node {node} ({exc.kind}): {exc}")
        return 0
    print(f"fleetwatch slurm healthcheck: drained {node}: {finding.drain_reason}")
    return 0


def _say(problem: str) -> None:
    print(f"fleetwatch slurm healthcheck: error: {problem}", file=sys.stderr)
