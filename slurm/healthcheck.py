"""`fleetwatch slurm healthcheck`: Slurm's own health check (slurm.conf
`HealthCheckProgram`, or a check NHC runs).

It judges the node by the remediation contract the drain controller acts on
(`fleetwatch.slurm.findings`): with a Prometheus to ask (`--prometheus.url` and the
other `--prometheus.*` client flags, `fleetwatch.promclient`), the node's
firing alerts that carry a taint reason the contract declares; without one, or when it does
not answer, the local exporter's `/metrics` (`--exporter.url`) judged by the local checks
the contract declares beside each alert, with the thresholds of rules/config.yaml (the
shipped one, with the override file `--rules.config-file` names merged over it; the
contract then follows the override too). With no exporter answering, it
starts one (`fleetwatch export` on a free loopback port, with this process's FLEETWATCH_*
settings) for one collection, under the same deadline, and stops it. When a condition holds
it drains this node (`SLURMD_NODENAME`, or `--healthcheck.node`) with the reason format the
drain controller uses, `fleetwatch:<reason> <alertname>`. It never resumes a node, and it
leaves a node that is already drained (by a person, another tool, or itself) as it is.

The whole run stays within `--healthcheck.deadline` (default 40 s, under Slurm's 60 s
kill): Prometheus' answer, the scrape, the one-shot exporter and every scontrol call have
their share, and a hung NVML can cost at most the one-shot exporter's share (the process is
killed). A check that cannot judge (no Prometheus, no exporter and none could start,
scontrol failing) says so on standard error and exits 0: slurmd holds a node's registration
until the health check exits 0, and a node must not be kept out because the checker, not
the node, is broken.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

from fleetwatch.promclient import (
    PrometheusClientError,
    PrometheusClientSettings,
    instant_query,
)
from fleetwatch.rules.config import ConfigError
from fleetwatch.rules.contract import TAINT_LABEL, Contract, load_contract
from fleetwatch.slurm.findings import (
    Finding,
    Judgement,
    Samples,
    from_alerts,
    from_scrape,
    parse_exposition,
)
from fleetwatch.slurm.scontrol import Scontrol, ScontrolError

if TYPE_CHECKING:
    from fleetwatch.slurm.cli import SlurmCommand

ONE_SHOT_SHARE: Final = 0.6  # of the deadline, for a one-shot exporter's first collection
PROMETHEUS_SHARE: Final = 0.25  # of the deadline, for Prometheus' answer


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


def firing_alerts_query(node: str) -> str:
    """The PromQL of the node's firing alerts that ask for a taint."""
    name = node.replace("\\", "\\\\").replace('"', '\\"')
    return f'ALERTS{{alertstate="firing", {TAINT_LABEL}!="", node="{name}"}}'


def run(command: SlurmCommand, environ: Mapping[str, str]) -> int:
    """The health check: judge, drain on a finding, print what was done; 0 unless the
    command line or the config it names is wrong."""
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
        config = command.rules.load()
        contract = (
            load_contract(command.contract) if command.contract else command.rules.contract(config)
        )
    except ConfigError as exc:
        print(f"fleetwatch slurm healthcheck: error: {exc}", file=sys.stderr)
        return 2
    judged = _ask_prometheus(command.prometheus, node, contract, deadline)
    if judged is None:
        scraped = _scrape_exporter(command, node, deadline, environ)
        if scraped is None:
            return 0
        samples, where = scraped
        judged = from_scrape(samples, contract, config), where
    judgement, where = judged
    found = judgement.findings
    if not found:
        left = f"; not judged: {', '.join(judgement.not_judged)}" if judgement.not_judged else ""
        print(f"fleetwatch slurm healthcheck: node {node} healthy ({where}{left})")
        return 0
    print(f"fleetwatch slurm healthcheck: node {node}, read from {where}:")
    for finding in found:
        print(f"  {finding.alert}: {finding.detail}")
    return _drain(node, found[0], deadline, dry_run=command.dry_run)


def _ask_prometheus(
    prometheus: PrometheusClientSettings, node: str, contract: Contract, deadline: Deadline
) -> tuple[Judgement, str] | None:
    """The node's firing tainting alerts, where `--prometheus.url` is given and answers;
    None (having said why) otherwise."""
    if prometheus.url is None:
        return None
    try:
        result = instant_query(
            prometheus,
            firing_alerts_query(node),
            timeout=max(0.5, deadline.left() * PROMETHEUS_SHARE),
        )
    except PrometheusClientError as exc:
        _say(f"{exc}; judging one scrape of the exporter")
        return None
    return from_alerts(result, contract), f"the firing alerts in {prometheus.url}"


def _scrape_exporter(
    command: SlurmCommand, node: str, deadline: Deadline, environ: Mapping[str, str]
) -> tuple[Samples, str] | None:
    """One scrape of the local exporter (or of a one-shot one) and where it came from; None
    (having said why) when none could be read."""
    try:
        text = scrape(command.exporter_url, timeout=min(5.0, deadline.left() / 4))
        where = command.exporter_url
    except OSError as exc:
        try:
            text = one_shot(deadline, environ)
            where = f"a one-shot exporter ({command.exporter_url} did not answer: {exc})"
        except OSError as failed:
            _say(f"cannot judge node {node}: {command.exporter_url}: {exc}; {failed}")
            return None
    try:
        return parse_exposition(text), where
    except ValueError as exc:
        _say(f"cannot judge node {node}: {where} served no valid exposition: {exc}")
        return None


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
