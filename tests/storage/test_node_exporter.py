"""Cross-check against Debian's node_exporter (`--collector.mountstats`) on one fixture procfs.

Its `node_mountstats_nfs_*` series are keyed by export (`10.0.0.5:/export/ckpt`), ours by
mount point; the fixture's mountstats maps one to the other. Every per-operation counter and
the bytes to and from the server must agree, the wrapped 18446743919241604546 ms queue time
included (both export counters modulo 2^53, exact in a float64).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.collectors import storage
from fleetwatch.collectors.sources.mounts import parse_mountstats
from fleetwatch.collectors.storage import StorageCollector, StorageSettings
from fleetwatch.exporter.render import Renderer
from fleetwatch.sim.loopback_servers import http_get
from testbed.mounts import MOUNTSTATS, write_procfs
from testbed.tool_servers import node_exporter

# node_exporter family -> ours (per operation).
PER_OPERATION = {
    "node_mountstats_nfs_operations_requests_total": storage.OPERATIONS,
    "node_mountstats_nfs_operations_transmissions_total": storage.OP_TRANSMISSIONS,
    "node_mountstats_nfs_operations_major_timeouts_total": storage.OP_MAJOR_TIMEOUTS,
    "node_mountstats_nfs_operations_sent_bytes_total": storage.OP_SENT,
    "node_mountstats_nfs_operations_received_bytes_total": storage.OP_RECEIVED,
    "node_mountstats_nfs_operations_queue_time_seconds_total": storage.OP_QUEUE,
    "node_mountstats_nfs_operations_response_time_seconds_total": storage.OP_RTT,
    "node_mountstats_nfs_operations_request_time_seconds_total": storage.OP_EXECUTE,
}
PER_MOUNT = {
    "node_mountstats_nfs_total_read_bytes_total": storage.READ_BYTES,
    "node_mountstats_nfs_total_write_bytes_total": storage.WRITTEN_BYTES,
}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.integration
def test_every_nfs_counter_agrees_with_node_exporter(tmp_path: Path) -> None:
    procfs = write_procfs(tmp_path / "proc")
    with node_exporter(
        tmp_path / "ne", sysfs=Path("/sys"), procfs=procfs, collectors=["mountstats"]
    ) as server:
        theirs = _samples(http_get(server.url + "/metrics").decode())
    collector = StorageCollector(procfs=procfs, settings=StorageSettings(), wait=30.0)
    try:
        ours = _samples(Renderer().render(collector.collect()).decode())
    finally:
        collector.close()
    point_of = {entry.source: entry.mountpoint for entry in parse_mountstats(MOUNTSTATS).stats}

    compared, mismatches = 0, []
    for (name, labels), value in theirs.items():
        found = dict(labels)
        key: tuple[str, tuple[tuple[str, str], ...]]
        if name in PER_OPERATION:
            key = (PER_OPERATION[name], (("mountpoint", point_of[found["export"]]),
                                         ("operation", found["operation"])))  # fmt: skip
        elif name in PER_MOUNT:
            key = (PER_MOUNT[name], (("mountpoint", point_of[found["export"]]),))
        else:
            continue
        if key not in ours:
            # We leave out operations the kernel never counted; node_exporter writes zeros.
            requests = theirs[
                ("node_mountstats_nfs_operations_requests_total", labels)
            ] if name in PER_OPERATION else None  # fmt: skip
            assert requests == 0, f"{name}{found} missing here"
            continue
        compared += 1
        if ours[key] != value:
            mismatches.append(f"{name}{found}: node_exporter {value}, ours {ours[key]}")
    assert not mismatches, "\n".join(mismatches)
    assert compared >= 100, f"only {compared} values compared"
    wrapped = (storage.OP_QUEUE, (("mountpoint", "/mnt/checkpoints"), ("operation", "ACCESS")))
    assert ours[wrapped] == (18446743919241604546 % 2**53) / 1000  # exact in a float64
