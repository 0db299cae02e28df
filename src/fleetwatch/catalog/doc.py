"""docs/metrics.md, written from the catalog: one table row per family, in sections.

The page is generated (`./dev.sh generate`, generate.py) and never edited by hand: the
table rows come from the specs (`MetricSpec.unit`, `source`, `series`, `described_labels`),
the prose around them from here. Sections follow the page's reading order, not the
catalog's modules: the GPU section also lists the Xid counter and the pod attribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Final

from fleetwatch.catalog import (
    allocation,
    exporter,
    gpu,
    infiniband,
    mig,
    nvlink,
    pci,
    slurm,
    storage,
    tainter,
    xid,
)
from fleetwatch.catalog.spec import MetricSpec

PATH: Final = PurePosixPath("docs/metrics.md")
"""Where the page lives in a checkout."""

HEADER: Final = f"""\
# Metrics catalog

<!-- Generated from src/fleetwatch/catalog/ by ./dev.sh generate (generate.py); do not edit. -->

Every family `fleetwatch export` and `fleetwatch taint` can emit, with its type, unit,
labels, where the value comes from and how many series it can produce on one node in the
worst case. This page is generated from the metric catalog (`fleetwatch.catalog`,
src/fleetwatch/catalog/), where each family is declared once; collectors, rules,
dashboards, the simulator, the tainter and the report import the names from there. A test
fails when the exporter emits a family the catalog lacks, or when a module outside the
catalog spells a metric name.

Conventions (the metric contract every collector follows): prefix `fleetwatch_`, base
units, counters end in `_total`, value series carry identity labels only and descriptive
fields live on `_info` series (value 1, join with `group_left`). The exporter adds no `node` or
`instance` label: Prometheus adds `node` from the scrape configuration. A value the
hardware does not report is absent, never a fake 0.

The lean profile (chart value `exporter.profile: lean`, docs/deploy.md "Lean profile")
drops four kinds of detail and nothing else: `{infiniband.INFINIBAND_PORT_HW_STAT_TOTAL}`
entirely, `{nvlink.NVLINK_ERRORS_TOTAL}` series until their first error,
`{infiniband.INFINIBAND_PORT_ERROR_SATURATED}` series while 0, and NFS per-operation series
beyond READ, WRITE, COMMIT and GETATTR's counts and times. The rows below say so.

Worst-case series use: G GPUs (8 on a DGX H100, up to 72 on a rack), L NVLinks per GPU
(18), P InfiniBand ports (10 on a DGX H100 with storage), C collectors (9), M watched mounts,
O NFS operations a mount's mountstats lists (NFSv4: up to ~60; lean profile: 4), Q probed
mounts.

"""

SECTIONS: Final[tuple[tuple[str, str, Sequence[MetricSpec]], ...]] = (
    ("Exporter self-metrics", "", exporter.FAMILIES),
    (
        "GPU",
        f"""\
Collectors `gpu`, `gpm`, `mig`, `xid` and `podresources`; labels `gpu` (NVML index) and
`uuid` on every per-GPU series (MIG instances add `mig_uuid`: join an allocation by MIG UUID
to its GPU through `{mig.GPU_MIG_INFO}`). A GPU that falls off the bus (`GPU_IS_LOST`,
Xid 79) drops out of every family here except `{xid.GPU_XID_ERRORS_TOTAL}`, and out of
`{gpu.GPUS_VISIBLE}`.
Per-GPU series on a DGX H100 with the defaults: about 160 (1,290 with NVLink).
""",
        (*gpu.FAMILIES, *mig.FAMILIES, xid.GPU_XID_ERRORS_TOTAL, allocation.GPU_ALLOCATION_INFO),
    ),
    (
        "DRA attribution",
        f"""\
Collector `podresources` with `--collector.podresources.dra` not `off`. DRA claims in the
kubelet's PodResources reply are resolved through this node's ResourceSlices, listed once
and then watched (never fetched per scrape); GPUs and MIG devices join
`{allocation.GPU_ALLOCATION_INFO}` with their `claim`. The counter starts at 0 for every
reason as soon as the kubelet answers (docs/training-jobs.md, "DRA").
""",
        tuple(spec for spec in allocation.FAMILIES if spec is not allocation.GPU_ALLOCATION_INFO),
    ),
    (
        "Kernel log",
        """\
Collector `xid` with `--collector.xid.source=kmsg` or `nvml,kmsg` (absent otherwise). It
reads `/dev/kmsg` (or the file `--collector.xid.kmsg-path` names, in the same record
format) from its start, then each record as the kernel logs it (a file: every second).
Each record's timestamp (microseconds of the kernel's
`local_clock()`, the clock `CLOCK_MONOTONIC` follows) is compared with `CLOCK_MONOTONIC`
when the exporter opened the log: records stamped earlier were logged before the exporter
was there and are history. A history Xid is exported apart and never as a new error, so
enabling the kernel-log source on a node with old Xids alerts on nothing; the
fallen-off-the-bus and SXid counters count only records logged after start.
""",
        tuple(spec for spec in xid.FAMILIES if spec is not xid.GPU_XID_ERRORS_TOTAL),
    ),
    (
        "GPUs on the PCI bus",
        f"""\
Collector `pci` (collectors/pci.py, collectors/sources/pci.py): the NVIDIA GPUs under
`<path.sysfs>/bus/pci/devices`, counted without NVML, so it reports when NVML does not
start or lists fewer GPUs. A GPU is a function whose `vendor` is `0x10de` and whose `class`
is a VGA (`0x0300xx`) or 3D controller (`0x0302xx`, every datacenter GPU: H100 SXM is
`0x030200`); NVSwitches (`0x068000`), audio functions (`0x0403xx`) and SR-IOV virtual
functions (a `physfn` link) are not counted. A GPU NVML lost (Xid 79) is still counted
until it leaves the bus: `{pci.GPUS_PCI_PRESENT} > {gpu.GPUS_VISIBLE}` is a GPU
NVML cannot reach. No `bus/pci/devices` folder: no series (not a GPU node); a bus with no
NVIDIA GPU reads 0. Read every cycle (about 2.5 ms for 200 functions).
""",
        pci.FAMILIES,
    ),
    (
        "NVLink",
        """\
Collectors `nvlink` (state and errors) and `gpm` (throughput). Links are enumerated by
state (18 on H100 and B200/GB200; NVML's maximum of 36 is not used).
`--collector.nvlink.per-gpu` replaces the per-link families by per-GPU ones.
""",
        nvlink.FAMILIES,
    ),
    (
        "InfiniBand",
        """\
Labels `device` (e.g. `mlx5_0`) and `port` on every series; sysfs paths are relative to
`<path.sysfs>/class/infiniband/<device>/ports/<port>/`. P = ports (10 on a DGX H100 with
storage), H = `hw_counters` counters per port (25 on a ConnectX-7 with mlx5), D = device-level
`hw_counters` files, E = distinct udev (subsystem, action) pairs seen (at most 3 × 3).
""",
        infiniband.FAMILIES,
    ),
    (
        "Checkpoint storage",
        """\
The mounts that hold checkpoints: every network or parallel filesystem (nfs, nfs4, lustre,
gpfs, wekafs, beegfs, ceph, ...) in the host's mount table, `/proc/1/mountinfo`
(`--path.procfs`; `self/mountinfo` where pid 1's cannot be read), or the mounts
`--collector.storage.mounts` names; `mountpoint` is the host's path (reached under
`--path.rootfs`). Calls on a mount run in a helper process, one at a time
per mount; a mount whose call is blocked past `--collector.storage.hung-timeout` is hung and
its `statvfs` series are absent until the call returns. NFS counters are exported modulo 2^53
(exact in a float64, as node_exporter does).
""",
        storage.FAMILIES,
    ),
    (
        "Slurm jobs",
        f"""\
Collector `slurmjobs`: the mapping directory (`--slurm.mapping-dir`, default
`/run/fleetwatch/slurm-jobs`) that `fleetwatch slurm prolog` and `epilog` keep, and
dcgm-exporter's HPC job-mapping files in the same directory (docs/slurm.md). Each GPU a Slurm
job holds is a `{allocation.GPU_ALLOCATION_INFO}` series with `namespace="slurm"` and the job
ID as `pod`, so a job spanning nodes is one training job. No directory: no series.
""",
        slurm.FAMILIES,
    ),
    ("Tainter (`fleetwatch taint`, served on its own `/metrics`)", "", tainter.FAMILIES),
)
"""(title, prose above the table, families) of each section, in page order."""

_COLUMNS: Final = (
    "| Metric | Type | Unit | Labels | Source | Worst-case series |\n|---|---|---|---|---|---|\n"
)


def _labels(spec: MetricSpec) -> str:
    described = spec.described_labels
    cells = [
        f"`{label}` {described[label]}" if label in described else f"`{label}`"
        for label in spec.labels
    ]
    return ", ".join(cells) or "—"


def row(spec: MetricSpec) -> str:
    """One family's table row."""
    cells = (f"`{spec.name}`", spec.kind, spec.unit, _labels(spec), spec.source, spec.series)
    return "| " + " | ".join(cells) + " |\n"


def render(sections: Sequence[tuple[str, str, Sequence[MetricSpec]]] = SECTIONS) -> str:
    """The page's text."""
    parts = [HEADER.strip(), "\n"]
    for title, prose, specs in sections:
        parts.append(f"\n## {title}\n\n")
        if prose.strip():
            parts.append(f"{prose.strip()}\n\n")
        parts.append(_COLUMNS + "".join(row(spec) for spec in specs))
    return "".join(parts)
