"""The Goodput model's rules, one at a time, on hand-made job histories."""

from __future__ import annotations

import pytest

from fleetwatch.catalog.nvidia_xids import shipped_catalog
from fleetwatch.report.goodput_model import (
    CAUSES,
    CONTAINER_RESTARTED,
    GPU_LOST,
    GPU_MEMORY,
    GPU_OTHER,
    GPU_SYSTEM_PROCESSOR,
    IN_PLACE,
    INFINIBAND,
    LLAMA3,
    NVLINK,
    POD_RECREATED,
    THERMAL,
    UNATTRIBUTED,
    AttributionWindow,
    Interruption,
    JobHistory,
    Restart,
    Signal,
    Span,
    attribute,
    find_interruptions,
    xid_cause,
)

JOB = ("ml", "llm")
NODES = ("n1", "n2")


def history(**changes: object) -> JobHistory:
    fields: dict[str, object] = {
        "job": JOB,
        "nodes": NODES,
        "gpus": 16,
        "start": 0.0,
        "end": 10_000.0,
        "active": (Span(start=0, end=10_000),),
    }
    fields.update(changes)
    return JobHistory(**fields)  # type: ignore[arg-type]


def test_a_pod_recreation_is_one_interruption_at_the_end_of_activity() -> None:
    found = find_interruptions(
        history(
            restarts=(Restart(time=2_100, kind=POD_RECREATED, nodes=("n1", "n2")),),
            active=(Span(start=0, end=2_000), Span(start=2_400, end=10_000)),
        )
    )
    assert [(i.time, i.kinds, i.resumed) for i in found] == [(2_000, (POD_RECREATED,), 2_400)]


def test_restarts_within_a_minute_are_one_interruption() -> None:
    found = find_interruptions(
        history(
            restarts=(
                Restart(time=3_000, kind=CONTAINER_RESTARTED, nodes=("n1",)),
                Restart(time=3_050, kind=POD_RECREATED, nodes=("n2",)),
                Restart(time=5_000, kind=POD_RECREATED, nodes=("n2",)),
            ),
            active=(
                Span(start=0, end=3_000),
                Span(start=3_300, end=5_000),
                Span(start=5_200, end=10_000),
            ),
        )
    )
    assert [(i.time, i.kinds, i.nodes) for i in found] == [
        (3_000, (CONTAINER_RESTARTED, POD_RECREATED), ("n1", "n2")),
        (5_000, (POD_RECREATED,), ("n2",)),
    ]


def test_a_job_that_saved_and_then_failed_stopped_at_the_end_of_its_save() -> None:
    # Its GPUs idle from the save's start, but the work up to the save's end is safe: the
    # interruption is at the save's end (nothing redone, the save's time is the save's).
    found = find_interruptions(
        history(
            restarts=(Restart(time=2_190, kind=POD_RECREATED, nodes=("n1",)),),
            active=(Span(start=0, end=2_000), Span(start=2_700, end=10_000)),
            saves=(Span(start=2_000, end=2_120),),
        )
    )
    assert [(i.time, i.resumed) for i in found] == [(2_120, 2_700)]


def test_an_activity_gap_without_a_restart_is_an_in_place_restart() -> None:
    found = find_interruptions(
        history(active=(Span(start=0, end=4_000), Span(start=4_300, end=10_000)))
    )
    assert [(i.time, i.kinds, i.resumed) for i in found] == [(4_000, (IN_PLACE,), 4_300)]


def test_a_checkpoint_save_a_planned_stop_and_the_jobs_end_are_not_interruptions() -> None:
    found = find_interruptions(
        history(
            end=9_000,
            active=(
                Span(start=0, end=1_000),
                Span(start=1_120, end=5_000),
                Span(start=6_000, end=8_000),
            ),
            saves=(Span(start=1_000, end=1_120),),
            planned=(Span(start=5_000, end=6_000),),
            restarts=(Restart(time=5_900, kind=POD_RECREATED),),
        )
    )
    assert found == []


def test_a_gap_shorter_than_the_step_is_noise() -> None:
    assert (
        find_interruptions(
            history(active=(Span(start=0, end=4_000), Span(start=4_030, end=10_000))), step=60
        )
        == []
    )


def test_an_interruption_that_never_resumes_has_no_resume_time() -> None:
    found = find_interruptions(
        history(
            restarts=(Restart(time=8_100, kind=POD_RECREATED),),
            active=(Span(start=0, end=8_000),),
        )
    )
    assert [(i.time, i.resumed) for i in found] == [(8_000, None)]


def interruption(**changes: object) -> Interruption:
    fields: dict[str, object] = {
        "job": JOB,
        "time": 5_000.0,
        "kinds": (POD_RECREATED,),
        "nodes": NODES,
    }
    fields.update(changes)
    return Interruption(**fields)  # type: ignore[arg-type]


def test_attribution_takes_the_strongest_signal_and_keeps_the_rest_as_evidence() -> None:
    signals = [
        Signal(node="n2", time=4_900, cause=INFINIBAND, detail="mlx5_0/1 down"),
        Signal(node="n1", time=4_800, cause=GPU_MEMORY, detail="Xid 48"),
        Signal(node="n1", time=5_100, cause=THERMAL, detail="GPUOverheating"),
    ]
    found = attribute(interruption(), signals)
    assert (found.cause, found.node) == (GPU_MEMORY, "n1")
    assert [s.cause for s in found.evidence] == [GPU_MEMORY, INFINIBAND, THERMAL]


@pytest.mark.parametrize(
    ("when", "counted"),
    [(5_000 - 600, True), (5_000 - 601, False), (5_000 + 300, True), (5_000 + 301, False)],
)
def test_the_window_is_ten_minutes_before_to_five_after(when: float, counted: bool) -> None:
    found = attribute(interruption(), [Signal(node="n1", time=when, cause=THERMAL, detail="")])
    assert found.cause == (THERMAL if counted else UNATTRIBUTED)


def test_signals_of_other_nodes_do_not_count_and_the_window_is_configurable() -> None:
    elsewhere = [Signal(node="n9", time=5_000, cause=GPU_LOST, detail="Xid 79")]
    assert attribute(interruption(), elsewhere).cause == UNATTRIBUTED
    late = [Signal(node="n1", time=5_900, cause=GPU_LOST, detail="Xid 79")]
    wide = attribute(interruption(), late, window=AttributionWindow(before=600, after=1_200))
    assert (wide.cause, wide.node) == (GPU_LOST, "n1")


def test_no_signal_is_unattributed_with_no_node() -> None:
    found = attribute(interruption(), [])
    assert (found.cause, found.node, found.evidence) == (UNATTRIBUTED, "", ())


@pytest.mark.parametrize(
    ("xid", "cause"),
    [
        (79, GPU_LOST),
        (48, GPU_MEMORY),
        (95, GPU_MEMORY),
        (119, GPU_SYSTEM_PROCESSOR),
        (74, NVLINK),
        (62, GPU_OTHER),
        (13, None),
        (999, None),
    ],
)
def test_xids_by_nvidias_catalog(xid: int, cause: str | None) -> None:
    assert xid_cause(xid, shipped_catalog()) == cause


def test_every_cause_lines_up_with_llama3() -> None:
    assert set(LLAMA3) == set(CAUSES)


def test_a_lasting_signal_counts_while_it_overlaps_the_window() -> None:
    # Firing from an hour before until two minutes before the interruption.
    lasting = Signal(node="n2", time=1_400, until=4_880, cause=INFINIBAND, detail="port down")
    found = attribute(interruption(), [lasting])
    assert (found.cause, found.node) == (INFINIBAND, "n2")
    over = Signal(node="n2", time=1_400, until=4_300, cause=INFINIBAND, detail="port down")
    assert attribute(interruption(), [over]).cause == UNATTRIBUTED
