"""Xid errors (the `xid` collector: NVML events and/or the kernel log) and the kernel-log
families of `--collector.xid.source=kmsg`.

Part of the metric catalog (`fleetwatch.catalog`): each family is declared here once and
imported by name wherever it is emitted or read."""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.spec import MetricSpec

GPU_XID_ERRORS_TOTAL: Final = MetricSpec(
    "fleetwatch_gpu_xid_errors_total",
    "counter",
    (
        "Xid errors raised by the GPU, by Xid (from NVML events and, when enabled, the "
        "kernel log, counted once). Stays after the GPU is lost."
    ),
    ("gpu", "uuid", "xid"),
    unit="Xids",
    source=(
        "NVML events (`nvmlEventSetWait_v2`, Xid critical error) and/or `NVRM: Xid` "
        "records in `/dev/kmsg` (`--collector.xid.source`: `nvml` by default, `kmsg`, "
        "or `nvml,kmsg`), counted once; only Xids raised after the exporter started "
        "(kernel-log records stamped earlier are history, below), so a series appears "
        "with the first new Xid; `gpu`/`uuid` are empty for a kernel-log Xid of a GPU "
        "NVML never enumerated. What each Xid means: [docs/xid.md](xid.md)"
    ),
    series="G × Xids seen",
)


GPU_XID_HISTORY_ERRORS: Final = MetricSpec(
    "fleetwatch_gpu_xid_history_errors",
    "gauge",
    (
        "Xids the kernel log held from before the exporter started, by Xid (history, not new "
        "errors)."
    ),
    ("gpu", "uuid", "xid"),
    unit="Xids",
    source=(
        "`NVRM: Xid` records stamped before the exporter started: the Xids since boot "
        "that no exporter counted (or that a previous exporter process already did). "
        "Not a new error: no alert reads it"
    ),
    series="G × Xids seen",
)


GPU_FALLEN_OFF_BUS_TOTAL: Final = MetricSpec(
    "fleetwatch_gpu_fallen_off_bus_total",
    "counter",
    "Kernel-log 'GPU has fallen off the bus' messages since the exporter started.",
    ("gpu", "uuid", "pci_bus_id"),
    unit="messages",
    source=(
        "the driver's `NVRM: GPU 0000:xx:00.0: GPU has fallen off the bus.` record, "
        "which has no Xid number (it usually follows an `Xid ...: 79` record, counted "
        "in `fleetwatch_gpu_xid_errors_total`); `gpu`/`uuid` empty for a GPU NVML "
        "never enumerated, `pci_bus_id` empty when the message names none"
    ),
    series="G",
)


NVSWITCH_SXID_ERRORS_TOTAL: Final = MetricSpec(
    "fleetwatch_nvswitch_sxid_errors_total",
    "counter",
    "NVSwitch SXid errors in the kernel log since the exporter started.",
    ("device", "sxid", "severity"),
    unit="SXids",
    source=(
        "`nvidia-nvswitchN: SXid (PCI:...): <sxid>, Fatal, ...` (or `Non-fatal`) "
        "records (the first line of each report; the driver's follow-up lines are not "
        "counted again); meanings in NVIDIA's Fabric Manager User Guide"
    ),
    series="NVSwitches × SXids seen",
    label_values={
        "device": "(`nvswitch0`, ...)",
        "severity": "(`fatal`, `non_fatal`)",
    },
)


KMSG_UNREADABLE_RECORDS_TOTAL: Final = MetricSpec(
    "fleetwatch_kmsg_unreadable_records_total",
    "counter",
    ("Kernel-log lines that are not timestamped records, or Xid/SXid records that do not parse."),
    ("reason",),
    unit="records",
    source="kernel-log lines skipped; the first of each reason is logged",
    series="2",
    label_values={
        "reason": (
            "(`no_timestamp`: not a `prio,seq,usec,flags;message` record; "
            "`malformed`: an Xid or SXid record whose fields do not parse)"
        ),
    },
)


FAMILIES: Final = (
    GPU_XID_ERRORS_TOTAL,
    GPU_XID_HISTORY_ERRORS,
    GPU_FALLEN_OFF_BUS_TOTAL,
    NVSWITCH_SXID_ERRORS_TOTAL,
    KMSG_UNREADABLE_RECORDS_TOTAL,
)
"""Every family of this module, in the order docs/metrics.md lists them."""
