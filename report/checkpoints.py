"""The checkpoint section: jobs' saves, the nodes that write slowest, mounts that hung,
turned read-only or are filling up.

Mount findings come from the storage collector's series; the jobs' saves and the nodes'
write rates from the checkpoint recording rules, which exist only where a job saved. Where
either is absent the section says so in its notes: an empty table here never stands for
"every save was fast".
"""

from __future__ import annotations

from fleetwatch.report.dataset import Dataset
from fleetwatch.report.query import JOB, MOUNT
from fleetwatch.report.section import Section, frame_values, ranked, require
from fleetwatch.report.storage_queries import JOB_CHECKPOINT_BURST, NODE_CHECKPOINT_WRITE

TITLE = "Checkpoint storage"
# A node writing below this share of the fleet's median rate while saving is slow.
SLOW_SHARE = 0.5


def checkpoints(ds: Dataset) -> Section:
    """Saves per job, slow writers, and the mounts that hung, went read-only or fill up."""
    section = Section(TITLE)
    _saves(ds, section)
    _slow_nodes(ds, section)
    for name, table, column in (
        ("mount_hung_seconds", "mounts_hung", "minutes_hung"),
        ("mount_read_only_seconds", "mounts_read_only", "minutes_read_only"),
    ):
        if require(section, ds, name):
            frame = frame_values(ds, name, MOUNT, column)
            assert frame is not None
            frame[column] = frame[column] / 60
            section.tables[table] = ranked(frame, [column])
    if require(section, ds, "mount_hours_to_full", "mount_available_ratio"):
        hours = frame_values(ds, "mount_hours_to_full", MOUNT, "hours_to_full")
        ratio = frame_values(ds, "mount_available_ratio", MOUNT, "available_ratio")
        assert hours is not None
        assert ratio is not None
        filling = hours.merge(ratio, on=list(MOUNT), how="left")
        section.tables["mounts_filling"] = filling.sort_values(
            "hours_to_full", kind="stable", ignore_index=True
        )[[*MOUNT, "available_ratio", "hours_to_full"]]
    return section


def _saves(ds: Dataset, section: Section) -> None:
    """Per job: saves started, minutes saving, the mean save's seconds, peak write rate."""
    names = ("job_checkpoint_saves", "job_checkpoint_saving_seconds", "job_checkpoint_peak_bytes")
    if not require(section, ds, *names):
        return
    saves = frame_values(ds, names[0], JOB, "saves")
    saving = frame_values(ds, names[1], JOB, "saving_seconds")
    peak = frame_values(ds, names[2], JOB, "peak_bytes_per_second")
    assert saves is not None
    assert saving is not None
    assert peak is not None
    if saves.empty:
        section.notes.append(
            f"checkpoint saves: {JOB_CHECKPOINT_BURST} has no samples in the window: no job's "
            "saves could be timed (is the storage collector on, and are the checkpoint "
            "recording rules loaded?)"
        )
        return
    jobs = saves.merge(saving, on=list(JOB), how="left").merge(peak, on=list(JOB), how="left")
    jobs["mean_save_seconds"] = jobs["saving_seconds"] / jobs["saves"]
    section.tables["checkpoint_saves"] = ranked(
        jobs[[*JOB, "saves", "mean_save_seconds", "saving_seconds", "peak_bytes_per_second"]],
        ["mean_save_seconds"],
    )


def _slow_nodes(ds: Dataset, section: Section) -> None:
    """Nodes whose mean write rate while saving is below SLOW_SHARE of the median node's."""
    name = "node_checkpoint_write_while_saving"
    if not require(section, ds, name):
        return
    nodes = frame_values(ds, name, ("node",), "bytes_per_second")
    assert nodes is not None
    if nodes.empty:
        section.notes.append(
            f"slowest nodes: {NODE_CHECKPOINT_WRITE} has no samples in the window: no node's "
            "checkpoint writes could be compared"
        )
        return
    median = float(nodes["bytes_per_second"].median())
    nodes["share_of_median"] = nodes["bytes_per_second"] / median if median else 0.0
    slow = nodes[nodes["share_of_median"] < SLOW_SHARE]
    section.tables["checkpoint_slow_nodes"] = slow.sort_values(
        "share_of_median", kind="stable", ignore_index=True
    )
