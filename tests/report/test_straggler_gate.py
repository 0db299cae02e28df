"""The report's straggler gate follows GPUStraggler: a straggler that outlasts the baseline
keeps counting, as the alert keeps firing while it persists."""

from __future__ import annotations

from fleetwatch.report.thresholds import shipped_policy
from fleetwatch.rules.definitions import straggler_gate

BUSY, DRAGGED = 0.55, 0.2


def test_a_straggler_outlasting_the_baseline_keeps_the_job_training() -> None:
    p = shipped_policy()
    assert DRAGGED < p.job_busy_ratio < BUSY
    # The job's recent-max median was busy for two buckets, then the baseline holds only
    # the level the straggler dragged it down to; a straggler candidate in every bucket.
    recent = [BUSY, BUSY, DRAGGED, DRAGGED, DRAGGED]
    assert straggler_gate(p, job_recent_max_tensor=recent, straggled=[True] * 5) == [True] * 5


def test_the_gate_closes_once_the_straggler_is_gone() -> None:
    p = shipped_policy()
    recent = [BUSY, DRAGGED, DRAGGED, DRAGGED]
    gate = straggler_gate(p, job_recent_max_tensor=recent, straggled=[True, True, False, True])
    # Bucket 2 passes on the straggler of bucket 1; bucket 3 had none before it.
    assert gate == [True, True, True, False]


def test_an_idle_job_never_opens_the_gate() -> None:
    p = shipped_policy()
    recent = [DRAGGED] * 3
    assert straggler_gate(p, job_recent_max_tensor=recent, straggled=[True] * 3) == [False] * 3
