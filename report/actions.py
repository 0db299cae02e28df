"""The action list at the top of the report: drain, reseat/recable, RMA, reclaim,
investigate, one row per finding that calls for a person, drawn from the sections."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fleetwatch.catalog.nvidia_xids import FALLEN_OFF_BUS, shipped_catalog
from fleetwatch.report.query import Window
from fleetwatch.report.section import Section
from fleetwatch.rules.definitions import overheat_policy_text

RMA_XIDS = frozenset(str(code) for code in shipped_catalog().rma())
FELL_OFF_BUS_XID = str(FALLEN_OFF_BUS)


def _gpu(row: Any) -> str:
    return f"{row.node} GPU {row.gpu}"


def overheat_words(window: Window) -> str:
    """What a hot GPU's row says it was past: "above 78 °C", or with models judged by their
    own policy, the whole policy in words."""
    default = f"{window.threshold_celsius:g}"
    if not window.overheat_policy:
        return f"above {default} °C"
    policy = overheat_policy_text(window.overheat_policy, default)
    return f"past its model's overheat policy ({policy})"


def actions(sections: dict[str, Section], overheat: str) -> pd.DataFrame:
    """The short list at the top: drain, reseat/recable, RMA, reclaim, investigate.
    `overheat` is what a hot GPU was past (`overheat_words`)."""
    rows: list[tuple[str, str, str]] = []

    def table(section: str, name: str) -> pd.DataFrame:
        return sections[section].tables.get(name, pd.DataFrame())

    for r in table("Thermal", "thermal_hot_gpus").itertuples():
        rows.append(
            (
                "drain",
                r.node,
                f"GPU {r.gpu} {overheat} for "
                f"{r.minutes_above:.0f} min (max {r.max_celsius:.1f} °C, "
                f"{r.slowdown_minutes:.0f} min thermal slowdown)",
            )
        )
    for r in table("Reliability", "gpus_lost").itertuples():
        xid = f" after Xid {r.xids}" if r.xids else ""
        rows.append(
            (
                "drain",
                r.node,
                f"GPU {r.gpu} fell off the bus{xid}, last seen about {r.last_seen_approx}: "
                "reboot the node",
            )
        )
    lost = {(r.node, r.gpu) for r in table("Reliability", "gpus_lost").itertuples()}
    xid_events = table("Reliability", "xid_events")
    if not xid_events.empty:
        xid_events = xid_events[xid_events["xid"] == FELL_OFF_BUS_XID]
    for r in xid_events.itertuples():
        if (r.node, r.gpu) not in lost:
            rows.append(
                (
                    "drain",
                    r.node,
                    f"GPU {r.gpu} fell off the bus (Xid 79, {r.events:.0f} events) and came "
                    "back: reboot the node before it drops out of a job again",
                )
            )
    for r in table("Thermal", "thermal_outliers").itertuples():
        rows.append(
            (
                "reseat",
                _gpu(r),
                f"runs {r.excess_celsius:.1f} °C hotter than peers at "
                f"{r.median_watts:.0f} W (robust z {r.robust_z:.1f}): check cooling "
                "and seating before it crosses the threshold",
            )
        )
    for r in table("Fabric", "ib_flaps").itertuples():
        rows.append(
            (
                "recable",
                f"{r.node} {r.device}/{r.port}",
                f"{r.flaps:.0f} link flaps, down {r.down_minutes:.0f} min",
            )
        )
    for r in table("Fabric", "ib_saturated_counters").itertuples():
        rows.append(
            (
                "recable",
                f"{r.node} {r.device}/{r.port}",
                f"{r.error} pinned at its maximum for {r.saturated_minutes:.0f} min: "
                "its rate reads 0; inspect the cable and reset the counters",
            )
        )
    rma = table("Reliability", "xid_events")
    if not rma.empty:
        rma = rma[rma["xid"].isin(RMA_XIDS)]
    for r in rma.itertuples():
        rows.append(("rma", _gpu(r), f"Xid {r.xid} ({r.events:.0f} events)"))
    for r in table("Reliability", "remap_failed").itertuples():
        rows.append(("rma", _gpu(r), "row remapping failed"))
    ecc = table("Reliability", "ecc_errors")
    if not ecc.empty:
        ecc = ecc[ecc["severity"] == "uncorrected"]
    for r in ecc.itertuples():
        rows.append(("rma", _gpu(r), f"{r.errors:.0f} uncorrected ECC errors"))
    for r in table("Training jobs", "stragglers").itertuples():
        events = (
            f", clock events {r.clock_slowed_share:.0%} of the time" if r.clock_slowed_share else ""
        )
        rows.append(
            (
                "investigate",
                _gpu(r),
                f"straggler of {r.namespace}/{r.training_job} for {r.straggling_hours:.1f} h: "
                f"tensor activity {r.tensor_mean:.2f} (job median {r.job_median_tensor:.2f}) "
                f"at SM clock {r.sm_clock_mhz:.0f} MHz (job median "
                f"{r.job_median_sm_clock_mhz:.0f} MHz){events}: the whole job waits for it",
            )
        )
    reclaim = {(r.node, r.gpu) for r in table("Activity", "idle_allocated_gpus").itertuples()}
    for r in table("Training jobs", "idle_in_job").itertuples():
        if (r.node, r.gpu) in reclaim:
            continue  # idle whatever its job does: the reclaim row below says so
        rows.append(
            (
                "investigate",
                _gpu(r),
                f"idle in {r.namespace}/{r.training_job} for {r.idle_hours:.1f} h: tensor "
                f"activity {r.tensor_mean:.2f} vs job median {r.job_median_tensor:.2f} "
                "(starved, misassigned or a stuck rank)",
            )
        )
    for r in table("Training jobs", "job_slowdowns").itertuples():
        rows.append(
            (
                "investigate",
                f"{r.namespace}/{r.training_job}",
                f"job slowed down from {r.first_slow_bucket}: median tensor activity "
                f"{r.median_tensor:.2f}, {r.drop:.0%} below its baseline {r.baseline_tensor:.2f}; "
                f"suspects: {r.suspects or 'none found'}",
            )
        )
    for r in table("Activity", "idle_allocated_gpus").itertuples():
        rows.append(
            (
                "reclaim",
                _gpu(r),
                f"allocated to {r.namespace}/{r.pod} but idle for "
                f"{r.idle_gpu_hours:.1f} GPU-hours (tensor {r.tensor_mean:.3f})",
            )
        )
    return pd.DataFrame(rows, columns=["action", "target", "reason"])
