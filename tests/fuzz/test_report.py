"""Prometheus' answers to the fleet report, fuzzed: range-query and label-values answers as
Prometheus, Thanos and VictoriaMetrics write them (warnings, `isPartial`), as JSON trees and as
raw bytes. An answer gives series of equal-length time and value lists, or `QueryError`."""

from __future__ import annotations

import json
import math
from typing import Any, Final

import pytest
from hypothesis import given

from fleetwatch.report.promapi import (
    QueryError,
    Series,
    _json,
    answer_data,
    label_set,
    range_series,
)
from tests.fuzz.harness import FUZZ, bounded_label, exercise, named
from tests.fuzz.mutations import mutated_bytes, mutated_tree

URL: Final = "http://prometheus:9090/api/v1/query_range"
RANGE_ANSWERS: Final = (
    {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {"node": "gpu-node-1", "gpu": "3"},
                    "values": [[1764720000, "71.5"], [1764720060, "NaN"], [1764720120, "+Inf"]],
                },
                {"metric": {}, "values": [[1764720000.5, "0"]]},
            ],
        },
        "warnings": ["store gateway 2 did not answer"],
    },
    {"status": "success", "isPartial": True, "data": {"resultType": "matrix", "result": []}},
    {"status": "error", "errorType": "timeout", "error": "query timed out in expression eval"},
)
LABEL_ANSWERS: Final = (
    {"status": "success", "data": ["fleetwatch_gpu_temperature_celsius", "up"]},
    {"status": "success", "data": []},
)


def _answer_bytes(raw: bytes) -> tuple[Any, list[str]]:
    """What the client does with an answer's bytes (promapi's `_get`, after the HTTP call)."""
    return answer_data(_json(raw, 200, URL), what="query")


def _answer(body: Any) -> tuple[Any, list[str]]:
    return _answer_bytes(json.dumps(body, allow_nan=True).encode())


def _range(body: Any) -> tuple[list[Series], list[str]]:
    data, warnings = _answer(body)
    return range_series(data, what="query"), warnings


# A bound on a label read from a mutated answer: up to 4 mutations each grow a field by 64 KiB.
_LABEL: Final = 4 * 65536 + 4096


def range_holds(found: tuple[list[Series], list[str]]) -> None:
    series, warnings = found
    assert all(isinstance(w, str) for w in warnings)
    for one in series:
        for name, value in one.labels.items():
            bounded_label(name, _LABEL)
            assert isinstance(value, str)
        assert len(one.timestamps) == len(one.values)
        assert all(math.isfinite(t) for t in one.timestamps)
        assert all(isinstance(v, float) for v in one.values)


@FUZZ
@given(mutated_tree(RANGE_ANSWERS))
def test_range_answer(body: Any) -> None:
    exercise(
        "Prometheus range answer (report)", _range, body, errors=(QueryError,), holds=range_holds
    )


def _range_bytes(raw: bytes) -> tuple[list[Series], list[str]]:
    data, warnings = _answer_bytes(raw)
    return range_series(data, what="query"), warnings


@FUZZ
@given(mutated_bytes([json.dumps(body).encode() for body in RANGE_ANSWERS], huge=65536))
def test_range_answer_bytes(raw: bytes) -> None:
    exercise(
        "Prometheus range answer bytes (report)",
        _range_bytes,
        raw,
        errors=(QueryError,),
        holds=range_holds,
    )


def _labels(body: Any) -> set[str]:
    data, _ = _answer(body)
    return label_set(data, what="label values")


def labels_hold(values: set[str]) -> None:
    assert all(isinstance(value, str) for value in values)


@FUZZ
@given(mutated_tree(LABEL_ANSWERS))
def test_label_values_answer(body: Any) -> None:
    exercise(
        "Prometheus label values answer (report)",
        _labels,
        body,
        errors=(QueryError,),
        holds=labels_hold,
    )


def test_answers_of_the_wrong_shape_are_query_errors() -> None:
    """Answers that raised KeyError or TypeError in the client before it read them through
    range_series and label_set: a success without data, a matrix that is not one, warnings
    that are not a list, label values that are not a list."""
    for body in (
        {"status": "success"},
        {"status": "success", "data": {"result": [{"values": [[1, "1"]]}]}},
        {"status": "success", "data": {"result": [{"metric": {}, "values": [[1]]}]}},
        {"status": "success", "data": 5},
    ):
        try:
            _range(body)
        except QueryError:
            continue
        raise AssertionError(f"{body} was read")
    assert _answer({"status": "success", "data": [], "warnings": 5})[1] == ["5"]
    for data in (5, {"a": 1}):
        try:
            _labels({"status": "success", "data": data})
        except QueryError:
            continue
        raise AssertionError(f"{data} was read")


def test_infinite_times_and_deep_nesting_are_query_errors() -> None:
    """Found by the fuzzer: a sample time of 1e999 (JSON's Infinity) was read as a time, and
    an answer of 10000 nested arrays raised RecursionError out of json.loads."""
    infinite = (
        b'{"status": "success", "data": {"result": [{"metric": {}, "values": [[1e999, "1"]]}]}}'
    )
    with pytest.raises(QueryError):
        _range_bytes(infinite)
    with pytest.raises(QueryError):
        _range_bytes(b"[" * 10000)


def test_an_error_answer_is_named_by_an_excerpt() -> None:
    """Found by the fuzzer (`named`): an error answer's `errorType` and `error` were quoted
    whole in the QueryError the report prints."""
    with pytest.raises(QueryError) as raised:
        _answer({"status": "error", "errorType": "x" * 65536, "error": "y" * 65536})
    named(str(raised.value))


def test_a_sample_that_is_no_number_is_named_by_an_excerpt() -> None:
    """Found by `./dev.sh fuzz --examples 10000`: a sample value of 5000 characters went
    whole into the QueryError (float()'s message quotes it)."""
    body = {"status": "success", "data": {"result": [{"metric": {}, "values": [[1, "x" * 5000]]}]}}
    with pytest.raises(QueryError) as raised:
        _range(body)
    named(str(raised.value))
