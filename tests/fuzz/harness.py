"""What every fuzz test shares: the Hypothesis profiles, and the tally of what each parser
was given and did with it (docs/reliability.md's table is written from it).

`exercise(parser, parse, data, ...)` runs one parser on one input and tallies it: an
exception of the parser's documented error type (or a result the caller calls malformed)
counts as malformed, and its message must name the problem in a line a log can hold
(`named`); any other exception counts as a crash and fails the test; `holds` asserts what a
valid reading must satisfy, and each time it passes a property held.

Two profiles: `ci` (the suite: a few examples per property, within its time budget) and
`fuzz` (`./dev.sh fuzz --examples N`: `FLEETWATCH_FUZZ_EXAMPLES` examples per property).
"""

from __future__ import annotations

import math
import os
import tracemalloc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, TypeVar

from hypothesis import HealthCheck, settings

EXAMPLES_VARIABLE: Final = "FLEETWATCH_FUZZ_EXAMPLES"
TABLE_VARIABLE: Final = "FLEETWATCH_FUZZ_TABLE"
CI_EXAMPLES: Final = 50
# Mutated samples are big, slow to build and often filtered: none of that is a test's fault.
_RELAXED: Final = [
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.filter_too_much,
    HealthCheck.large_base_example,
]

settings.register_profile(
    "ci", max_examples=CI_EXAMPLES, deadline=None, suppress_health_check=_RELAXED
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get(EXAMPLES_VARIABLE, "10000")),
    deadline=None,
    suppress_health_check=_RELAXED,
    print_blob=True,
)
PROFILE: Final = "fuzz" if os.environ.get(EXAMPLES_VARIABLE) else "ci"
FUZZ: Final = settings(settings.get_profile(PROFILE))
"""The decorator every property carries: the profile this run uses."""
CI_COSTLY_EXAMPLES: Final = 10
FUZZ_COSTLY: Final = settings(FUZZ, max_examples=CI_COSTLY_EXAMPLES) if PROFILE == "ci" else FUZZ
"""For a property whose example costs a tenth of a second or more (a YAML config loaded twice,
a sysfs tree written): fewer examples in the suite, as many as any in `./dev.sh fuzz`."""

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Tally:
    """What one parser was given and did: inputs tried, crashes (exceptions outside its
    documented error type), inputs it counted as malformed, properties that held."""

    tried: int = 0
    crashes: int = 0
    malformed: int = 0
    held: int = 0


TALLIES: dict[str, Tally] = {}


def _never(_: object) -> bool:
    return False


def _nothing(_: object) -> None:
    return None


def exercise(
    parser: str,
    parse: Callable[[T], R],
    data: T,
    *,
    errors: tuple[type[BaseException], ...] = (),
    malformed: Callable[[R], bool] = _never,
    holds: Callable[[R], None] = _nothing,
) -> R | None:
    """`parse(data)`, tallied under `parser`; None when it raised one of `errors`."""
    tally = TALLIES.setdefault(parser, Tally())
    tally.tried += 1
    try:
        result = parse(data)
    except errors as exc:
        tally.malformed += 1
        named(str(exc))
        return None
    except Exception:
        tally.crashes += 1
        raise
    if malformed(result):
        tally.malformed += 1
    holds(result)
    tally.held += 1
    return result


MESSAGE_LIMIT: Final = 1024
"""The longest reason a malformed input may be named by: what is logged once and counted
says what was wrong, and quotes at most an excerpt of the input (never a 1 MiB line)."""


def named(reason: str) -> None:
    """A malformed input's reason or error message: said, and short enough for one log line."""
    assert isinstance(reason, str), reason
    assert reason.strip(), "a malformed input without a reason"
    assert len(reason) <= MESSAGE_LIMIT, f"a reason of {len(reason)} characters: {reason[:200]!r}"


def finite_counts(values: Iterable[object]) -> None:
    """Counters of a valid reading: non-negative integers (bool is no count)."""
    for value in values:
        assert isinstance(value, int), value
        assert not isinstance(value, bool), value
        assert value >= 0, value


def finite_number(value: float | None) -> None:
    """A gauge of a valid reading: None (unknown) or a finite, non-negative number."""
    if value is not None:
        assert math.isfinite(value), value
        assert value >= 0, value


def bounded_label(text: str, limit: int = 4096) -> None:
    """A label value read from outside: a string of bounded length."""
    assert isinstance(text, str), text
    assert len(text) <= limit, len(text)


def peak_bytes(work: Callable[[], object]) -> int:
    """The most memory Python allocated while `work` ran (tracemalloc), in bytes."""
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
