"""Xid errors (the `xid` collector: NVML events and/or the kernel log) and the kernel-log
families of `--collector.xid.source=kmsg`.

Part of the metric catalog (`fleetwatch.catalog`): each family is declared here once and
imported by name wherever it is emitted or read."""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.gpu import GPU_RECOVERY_ACTION
from fleetwatch.catalog.spec import Families

FAMILIES: Final = Families(collectors=("xid",))
"""Every family of this module, in declaration order (the order docs/metrics.md lists them)."""

GPU_XID_ERRORS_TOTAL: Final = FAMILIES.declare(
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
        "or `nvml,kmsg`), counted once (a kernel record within `--collector.xid.dedup-window` "
        "of the span since NVML's last take is the same Xid); NVML's queued events are "
        "taken at each run of the collector, so a new Xid shows from the run after it was "
        "raised; only Xids raised after the exporter started "
        "(kernel-log records stamped earlier are history, below), so a series appears "
        "with the first new Xid; `gpu`/`uuid` are empty for a kernel-log Xid of a GPU "
        "NVML never enumerated. What each Xid means: [docs/xid.md](xid.md)"
    ),
    series="G × Xids seen",
)


GPU_XID_HISTORY_ERRORS: Final = FAMILIES.declare(
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


GPU_FALLEN_OFF_BUS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_gpu_fallen_off_bus_total",
    "counter",
    "Kernel-log 'GPU has fallen off the bus' messages since the exporter started.",
    ("gpu", "uuid", "pci_bus_id"),
    unit="messages",
    source=(
        "the driver's own fallen-off-the-bus record, `NVRM: The NVIDIA GPU 0000:xx:00.0 "
        "(PCI ID: 10de:xxxx) installed in this system has fallen off the bus and is not "
        "responding to commands.` (one record over several lines, `(PCI ID: ...)` optional) "
        "or `NVRM: GPU xx:00.0: GPU has fallen off the bus.` (domain optional), "
        "which has no Xid number (it usually follows an `Xid ...: 79` record, counted "
        f"in `{GPU_XID_ERRORS_TOTAL}`); `gpu`/`uuid` empty for a GPU NVML "
        "never enumerated, `pci_bus_id` empty when the message names none"
    ),
    series="G",
)


GPU_XID_RECOVERY_ACTIONS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_gpu_xid_recovery_actions_total",
    "counter",
    (
        "Xid 154 records in the kernel log since the exporter started, by the recovery action "
        "each announces (unknown when the text names none NVML knows)."
    ),
    ("gpu", "uuid", "action"),
    unit="records",
    source=(
        "new Xid 154 kernel-log records (`--collector.xid.source` with `kmsg`), by the action "
        "the text announces (`... changed from 0x0 (None) to 0x1 (GPU Reset Required)`; "
        "NVML's numbering, `unknown` for a code NVML does not name or a text without one). "
        f"The kernel log's view of what `{GPU_RECOVERY_ACTION}` reads from NVML field "
        "230: it keeps the announcement after the field is reset, and works where the field "
        "is not supported"
    ),
    series="6G",
    label_values={
        "action": (
            "(`none`, `gpu_reset`, `node_reboot`, `drain_p2p`, `drain_and_reset`, `unknown`)"
        ),
    },
)


GPU_XID_NVLINK5_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_gpu_xid_nvlink5_errors_total",
    "counter",
    (
        "NVLink5 Xids (144-150) in the kernel log since the exporter started, by unit and the "
        "action NVIDIA's decode table gives the message (the Xid's catalog action when no row "
        "describes it)."
    ),
    ("gpu", "uuid", "xid", "unit", "action"),
    unit="Xids",
    source=(
        "new NVLink5 Xid kernel-log records (`kmsg` source), by the action NVIDIA's *XID "
        "144-150 Decode* gives the message's unit, error status, link-down reason and "
        "severity (docs/xid.md); the Xid's catalog action when no row describes it"
    ),
    series="G × (decode units + 7)",
    label_values={
        "xid": "(144-150)",
        "unit": (
            "(the decode table's units, e.g. `RLW_RXPIPE`, `NETIR_LINK_DOWN`; `other` for one "
            "it does not name)"
        ),
        "action": "(`none`, `restart_application`, `reset_gpu`)",
    },
)


NVSWITCH_SXID_ERRORS_TOTAL: Final = FAMILIES.declare(
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


GPU_XID_EVENTS_LISTENING: Final = FAMILIES.declare(
    "fleetwatch_gpu_xid_events_listening",
    "gauge",
    (
        "1 while the GPU's Xid events reach the exporter through NVML; 0 while they do not "
        "(the event set could not be made, registering the GPU failed, the last take of the "
        "events failed, or a take is blocked in NVML): Xids from NVML are not counted then."
    ),
    ("gpu", "uuid"),
    unit="0/1",
    source=(
        "the `xid` collector's NVML event set (`--collector.xid.source` with `nvml`): 1 "
        "when the GPU is registered on it (`nvmlDeviceRegisterEvents`) and the last "
        "`nvmlEventSetWait_v2` take answered; a failed registration is tried again at each "
        "run, a failed take at the next. Absent for a GPU without Xid events (not "
        "supported), for one that answered lost (fallen off the bus), and with "
        "`--collector.xid.source=kmsg`"
    ),
    series="G",
)


GPU_XID_NVML_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_gpu_xid_nvml_errors_total",
    "counter",
    (
        "NVML calls of the Xid collector's event set that failed, by GPU (empty for a call "
        "on the whole set), call and error."
    ),
    ("gpu", "uuid", "call", "error"),
    unit="calls",
    source=(
        "`nvmlEventSetCreate`, `nvmlDeviceGetSupportedEventTypes`, "
        "`nvmlDeviceRegisterEvents`, `nvmlEventSetWait_v2` (other than the `Timeout` "
        "that says no event is queued) and `nvmlEventSetFree` calls that failed; each new "
        "kind is logged once"
    ),
    series="(G + 1) × calls × errors seen",
)


KMSG_UNREADABLE_RECORDS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_kmsg_unreadable_records_total",
    "counter",
    (
        "Kernel-log lines that are not timestamped records, Xid, SXid or "
        "fallen-off-the-bus records that do not parse (malformed) or hold binary data, or "
        "an event's text written from user space (ignored: only the kernel is trusted)."
    ),
    ("reason",),
    unit="records",
    source=(
        "kernel-log lines skipped; the first of each reason is logged with a sentence saying why"
    ),
    series="4",
    label_values={
        "reason": (
            "(`no_timestamp`: not a `prio,seq,usec,flags;message` record; "
            "`malformed`: an Xid, SXid or fallen-off-the-bus record whose fields do not "
            "parse, truncated ones included, and lines longer than any kernel record; "
            "`binary`: such a record holding control bytes or invalid UTF-8; `user_space`: "
            "an Xid, fallen-off-the-bus, SXid or storage event's text in a record of another "
            "facility than the kernel's, which any process that can write /dev/kmsg can forge)"
        ),
    },
)
