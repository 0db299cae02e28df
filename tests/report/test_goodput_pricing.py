"""What interruptions cost: lost GPU-hours, ETTR measured and predicted, Young/Daly, the
fleet's rates and lemon nodes, on hand-made figures."""

from __future__ import annotations

import math

import pytest

from fleetwatch.report.goodput_model import (
    GPU_MEMORY,
    INFINIBAND,
    POD_RECREATED,
    UNATTRIBUTED,
    Interruption,
    JobHistory,
    Span,
)
from fleetwatch.report.goodput_pricing import (
    LemonThresholds,
    NodeRecord,
    lemons,
    per_thousand_node_days,
    poisson_tail,
    predicted_ettr,
    price,
    projected_mttf_hours,
    recommend,
    young_daly_interval,
)

JOB = ("ml", "llm")
DAY = 86_400.0


def hit(
    time: float, resumed: float | None, cause: str = GPU_MEMORY, node: str = "n1"
) -> Interruption:
    return Interruption(
        job=JOB,
        time=time,
        kinds=(POD_RECREATED,),
        nodes=("n1", "n2"),
        resumed=resumed,
        cause=cause,
        node=node,
    )


def test_lost_time_is_downtime_plus_work_since_the_last_save() -> None:
    job = JobHistory(
        job=JOB,
        nodes=("n1", "n2"),
        gpus=16,
        start=0,
        end=36_000,
        saves=(Span(start=3_600, end=3_660), Span(start=7_200, end=7_260)),
        active=(
            Span(start=0, end=3_600),
            Span(start=3_660, end=7_200),
            Span(start=7_260, end=9_000),
            Span(start=9_600, end=36_000),
        ),
    )
    cost = price(job, [hit(9_000, 9_600)], assumed_interval=3_600)
    assert cost.down_seconds == 600
    assert cost.redone_seconds == 9_000 - 7_260
    assert cost.saving_seconds == 120
    assert cost.lost_gpu_hours_by_cause == {GPU_MEMORY: pytest.approx((600 + 1_740) * 16 / 3600)}
    assert cost.ettr == pytest.approx(1 - (600 + 1_740 + 120) / 36_000)
    assert not cost.redone_estimated
    assert cost.checkpoint_interval_seconds == 3_600
    assert cost.save_seconds == 60
    assert cost.restart_seconds == 600
    assert cost.mtti_hours == pytest.approx(10)


def test_a_planned_stop_counts_against_ettr_but_costs_no_gpu_hours() -> None:
    # A job suspended for an hour (not holding its GPUs, no restart): not progressing, so
    # not productive, though no interruption prices it.
    job = JobHistory(
        job=JOB,
        nodes=("n1",),
        gpus=8,
        start=0,
        end=36_000,
        active=(Span(start=0, end=18_000), Span(start=21_600, end=36_000)),
        saves=(Span(start=17_940, end=18_000),),
    )
    cost = price(job, [], assumed_interval=3_600)
    assert cost.lost_gpu_hours == 0
    assert cost.ettr == pytest.approx(1 - 3_600 / 36_000)


def test_without_checkpoint_records_redone_work_is_estimated_and_said_so() -> None:
    job = JobHistory(job=JOB, nodes=("n1",), gpus=8, start=0, end=20_000)
    cost = price(
        job,
        [hit(10_000, 10_300, UNATTRIBUTED), hit(10_400, 10_500, INFINIBAND)],
        assumed_interval=3_600,
    )
    assert cost.redone_estimated
    # Half the assumed interval, but never more than the job ran since it resumed.
    assert cost.redone_seconds == 1_800 + 100
    assert set(cost.lost_gpu_hours_by_cause) == {UNATTRIBUTED, INFINIBAND}


def test_an_interruption_that_never_resumes_holds_until_the_end() -> None:
    job = JobHistory(
        job=JOB, nodes=("n1",), gpus=8, start=0, end=10_000, saves=(Span(start=0, end=10),)
    )
    cost = price(job, [hit(9_000, None)], assumed_interval=3_600)
    assert cost.down_seconds == 1_000
    assert cost.restart_seconds is None


def test_predicted_ettr_is_the_closed_form() -> None:
    # Meta's whole-cluster job: 2,048 nodes at 6.5 failures per 1,000 node-days.
    rate = 6.5 / 1000 / 86400
    hourly = predicted_ettr(
        nodes=2048, rate_per_node_second=rate, restart=600, interval=3600, save=60
    )
    expected = (1 - 2048 * rate * (600 + 1800)) / (1 + 60 / 3600)
    assert hourly == pytest.approx(expected)
    five = predicted_ettr(nodes=2048, rate_per_node_second=rate, restart=600, interval=300, save=60)
    assert five > hourly
    assert predicted_ettr(nodes=1, rate_per_node_second=1, restart=1, interval=10, save=1) == 0.0


def test_young_daly_and_the_recommendation() -> None:
    assert young_daly_interval(save=60, mttf=7_200) == pytest.approx(math.sqrt(2 * 60 * 7_200))
    job = JobHistory(
        job=JOB,
        nodes=tuple(f"n{i}" for i in range(128)),
        gpus=1024,
        start=0,
        end=86_400,
        saves=tuple(Span(start=t, end=t + 30) for t in range(0, 86_400, 3_600)),
    )
    cost = price(job, [], assumed_interval=3_600)
    advice = recommend(
        cost, rate_per_node_second=6.5 / 1000 / 86400, checkpoint_bytes=3e12, assumed_interval=3_600
    )
    assert advice is not None
    assert advice.optimum < advice.interval
    assert advice.ettr_optimum > advice.ettr_now
    assert advice.bandwidth_bytes_per_second == pytest.approx(1e11)
    assert advice.sentence().startswith(
        f"save every {advice.optimum / 60:.0f} min instead of 60: ETTR "
    )
    assert recommend(cost, rate_per_node_second=0, assumed_interval=3_600) is None


def test_fleet_rates_and_projected_mttf() -> None:
    assert per_thousand_node_days(13, 2_000 * 86_400) == pytest.approx(6.5)
    # Meta: 1,024 GPUs at 6.5 per 1,000 node-days is about 3.7 h; 16,384 GPUs, 14 minutes.
    assert projected_mttf_hours(1024, 6.5) == pytest.approx(24 / (128 * 0.0065))
    assert projected_mttf_hours(16_384, 2.34) == pytest.approx(24 / (2048 * 0.00234))
    assert projected_mttf_hours(8, 0.0) is None


def test_lemons_are_repeat_offenders_multi_and_single_node_apart() -> None:
    other = ("ml", "other")
    found = [
        hit(1, 2, node="bad"),
        Interruption(
            job=other,
            time=5,
            kinds=(POD_RECREATED,),
            nodes=("bad", "x"),
            resumed=6,
            cause=INFINIBAND,
            node="bad",
        ),
        hit(9, 10, node="once"),
        hit(11, 12, cause=UNATTRIBUTED, node=""),
    ]
    records = {"noisy": NodeRecord(xids=30, taints=4), "quiet": NodeRecord(xids=1)}
    # A fleet of 100 nodes for 28 days: the rest of it interrupted 1 job.
    present = {f"n{k}": 28 * DAY for k in range(96)}
    present |= dict.fromkeys(("bad", "once", "noisy", "quiet"), 28 * DAY)
    scored = lemons(found, {JOB: 2, other: 2}, records, LemonThresholds(), present)
    assert [(s.node, s.lemon) for s in scored] == [
        ("bad", True),
        ("noisy", True),
        ("once", False),
        ("quiet", False),
    ]
    assert scored[0].reasons[0] == "interrupted 2 multi-node jobs"
    assert scored[0].jobs == 2
    assert scored[0].expected == pytest.approx(1 / 99)
    expects = "2 interruptions where the rest of the fleet's rate expects 0.01"
    assert expects in scored[0].reasons[-1]


def test_poisson_tail() -> None:
    assert poisson_tail(0, 3.0) == 1.0
    assert poisson_tail(1, 0.0) == 0.0
    assert poisson_tail(1, 2.0) == pytest.approx(1 - math.exp(-2))
    assert poisson_tail(3, 0.5) == pytest.approx(1 - math.exp(-0.5) * (1 + 0.5 + 0.125))
    assert poisson_tail(40, 2.0) == pytest.approx(0.0, abs=1e-15)


def test_a_node_is_a_lemon_only_against_the_rest_of_the_fleets_rate() -> None:
    """A fleet whose every node interrupted 3 multi-node jobs in the window has no lemon;
    one that interrupted 12 where the rest interrupt 3 is one; a fleet that fails rarely
    is judged by the floor."""

    def node_hits(node: str, count: int) -> list[Interruption]:
        return [hit(k, k + 1, node=node) for k in range(count)]

    fleet = [f"n{k}" for k in range(20)]
    present = dict.fromkeys([*fleet, "lemon"], 2 * DAY)
    busy = [i for node in fleet for i in node_hits(node, 3)]
    scored = {s.node: s for s in lemons(busy, {JOB: 2}, {}, LemonThresholds(), present)}
    assert not any(s.lemon for s in scored.values())
    assert "within the fleet: 3 interruptions" in scored["n0"].reasons[-1]
    with_lemon = busy + node_hits("lemon", 12)
    scored = {s.node: s for s in lemons(with_lemon, {JOB: 2}, {}, LemonThresholds(), present)}
    assert [n for n, s in scored.items() if s.lemon] == ["lemon"]
    assert scored["lemon"].expected == pytest.approx(3.0)
    assert scored["lemon"].tail == pytest.approx(poisson_tail(12, 3.0))
    rare = node_hits("lemon", 2)
    scored = {s.node: s for s in lemons(rare, {JOB: 2}, {}, LemonThresholds(), present)}
    assert scored["lemon"].lemon
    assert scored["lemon"].expected == 0.0
