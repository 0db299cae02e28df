"""NVLink state and errors (the `nvlink` collector) and throughput (the `gpm` collector).

Part of the metric catalog (`fleetwatch.catalog`): each family is declared here once and
imported by name wherever it is emitted or read."""

from __future__ import annotations

from typing import Final

from fleetwatch.catalog.spec import Families, Read
from fleetwatch.catalog.units import mebibytes_to_bytes

FAMILIES: Final = Families(collectors=("nvlink",))
"""Every family of this module, in declaration order (the order docs/metrics.md lists them)."""

NVLINK_UP: Final = FAMILIES.declare(
    "fleetwatch_nvlink_up",
    "gauge",
    "1 when the NVLink is active, 0 when it is down.",
    ("gpu", "uuid", "link"),
    unit="0/1",
    source=(
        "`nvmlDeviceGetNvLinkState`, or field 165 of the GPU's batched call where it reads "
        "active or inactive"
    ),
    series="G × L",
)


NVLINK_LINKS_UP: Final = FAMILIES.declare(
    "fleetwatch_nvlink_links_up",
    "gauge",
    "NVLinks of the GPU that are active.",
    ("gpu", "uuid"),
    unit="links",
    source="`nvmlDeviceGetNvLinkState`, summed (only with `--collector.nvlink.per-gpu`)",
    series="G",
)


NVLINK_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_nvlink_errors_total",
    "counter",
    (
        "NVLink errors by kind: replay, recovery, crc_flit, crc_data, ecc_data (per-link "
        "counters), and the NVLink5 counters symbol, effective, recovery_failed, "
        "malformed_packet, buffer_overrun where the driver has them."
    ),
    ("gpu", "uuid", "link", "error"),
    unit="errors",
    source=(
        "`nvmlDeviceGetNvLinkErrorCounter` per link (not the legacy totals, which "
        "read 0 on Hopper); NVLink5 field values 221, 219, 214, 206, 207 scoped to "
        "the link; `link` dropped with `--collector.nvlink.per-gpu`; **lean profile** "
        "(`--no-collector.nvlink.zero-errors`): a counter is exported from its first "
        "error on"
    ),
    series="10 × G × L (lean: erring links only)",
    label_values={
        "error": (
            "(`replay`, `recovery`, `crc_flit`, `crc_data`, `ecc_data`; NVLink5: "
            "`symbol`, `effective`, `recovery_failed`, `malformed_packet`, "
            "`buffer_overrun`)"
        ),
    },
)


NVLINK_THROUGHPUT_BYTES_PER_SECOND: Final = FAMILIES.declare(
    "fleetwatch_nvlink_throughput_bytes_per_second",
    "gauge",
    "NVLink traffic of the GPU over all links, by direction.",
    ("gpu", "uuid", "direction"),
    unit="bytes/s",
    source="GPM metrics 60/61 `NVLINK_TOTAL_RX/TX_PER_SEC` (MiB/s)",
    series="2G",
    collectors=("gpm",),
    reads=(
        Read("nvlink_rx", ("rx",), mebibytes_to_bytes),
        Read("nvlink_tx", ("tx",), mebibytes_to_bytes),
    ),
)


NVLINK_NVML_ERRORS_TOTAL: Final = FAMILIES.declare(
    "fleetwatch_nvlink_nvml_errors_total",
    "counter",
    (
        "NVML calls that failed (timeout, unknown error) by GPU, call and error; the values "
        "those calls would have given are absent while the rest keeps reporting."
    ),
    ("gpu", "uuid", "call", "error"),
    unit="calls",
    source=(
        "NVML calls of the `nvlink` collector that failed other than NotSupported/InvalidArgument"
    ),
    series="G × calls × errors seen",
)
