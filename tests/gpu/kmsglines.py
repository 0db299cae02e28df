"""Kernel-log records as /dev/kmsg hands them out, for the Xid tests and the Xid rollout test.

A helper module (not a test module) so neither test imports the other.
"""

from __future__ import annotations

import time


def record(sequence: int, seconds: float, message: str) -> str:
    """One /dev/kmsg record (priority 3) stamped `seconds` on the monotonic clock."""
    return f"3,{sequence},{round(seconds * 1e6)},-;{message}\n"


def an_hour_ago() -> float:
    """CLOCK_MONOTONIC an hour ago (or boot, on a machine up for less)."""
    return max(time.monotonic() - 3600, 0.0)
