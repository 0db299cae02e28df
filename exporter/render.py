"""Prometheus text exposition (format 0.0.4) for gauge and counter families, fast.

`prometheus_client.generate_latest` formats every label set from scratch on every call
(10 to 15 µs a series here). Our label sets are the same from one cycle to the next, so
`Renderer` keeps each sample's formatted `{labels} ` text (one list shared by the families
of the same label sets) and only formats the value each time. The output is byte-for-byte
what `generate_latest` writes for the same families (a test holds it to that), so
correctness is borrowed from the reference.
Every collector hands over `SeriesFamily`s (label dicts and values as two lists), the one
family type: each is rendered from its two lists, with its prefixes kept while its label
list holds the same dicts. A family whose label list and values are what they were at the
last render reuses that render's bytes: most families of a GPU node (error counters at 0,
thresholds, link states, PCIe widths, HCA rates) do not change from one cycle to the next.
A family handed over again with the very tuple of values it was last rendered from (a
collector's memoised family) reuses them without its values being looked at.
A family of which only some values changed (one port's error counter among a node's 192)
has only those lines formatted again, the others taken from the last render's bytes.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate, compress
from typing import Final, cast

from fleetwatch.collectors.families import SeriesFamily


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _go_float(value: float) -> str:
    """prometheus_client's `floatToGoString` for a float, written here so that the exporter
    does not load prometheus_client (about 4 MiB) for one function; the renderer's tests
    hold the output to `generate_latest`'s."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to the exponent form sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


_EXACT: Final = 2**53  # integers below this are exact as floats: str(n) == repr digits


def format_value(value: float) -> str:
    """Go-compatible float formatting (`+Inf`, `NaN`, `1e+06`), as Prometheus expects.

    Exactly what prometheus_client's `floatToGoString` writes for `float(value)`, with
    fast paths for the integral values that counters and states are (ints and bools
    straight from a `SeriesFamily`, or integral floats): below 1e6 `123.0`, from 1e6 on
    the exponent form `1.23456e+06`.
    """
    # Ints (counters straight from the kernel or NVML, the commonest) go straight on.
    number = cast(int, value)
    if type(value) is not int:
        if value == 0:  # keeps -0.0's sign
            return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
        if type(value) is float and not value.is_integer():
            return _go_float(value)  # fractions, NaN, infinities
        number = int(value)
    if -1_000_000 < number < 1_000_000:
        return f"{number}.0"
    if 1_000_000 <= number < _EXACT:
        return _exponent_form(number)
    return _go_float(float(number))


def _exponent_form(number: int) -> str:
    """Go's shortest form of an integer from 1e6 to 2**53 (exact as a double): its
    digits without trailing zeros, the first before the point, and the exponent."""
    text = str(number)
    digits = text.rstrip("0")
    if len(digits) == 1:
        return f"{digits}e+{len(text) - 1:02d}"
    return f"{digits[0]}.{digits[1:]}e+{len(text) - 1:02d}"


class Renderer:
    """Renders families to exposition bytes, reusing formatted label prefixes between calls."""

    def __init__(self) -> None:
        self._headers: dict[tuple[str, str, str], bytes] = {}
        # A SeriesFamily's prefixes (label texts) by sample name, with (a copy of) the label
        # list they were made for: one formatted prefix a series, held once.
        self._lists: dict[str, tuple[list[dict[str, str]], list[str]]] = {}
        # A family's rendered bytes by sample name, with the prefix list and (a copy of) the
        # values they were made from, and the values' tuple itself where they came as one.
        self._bodies: dict[str, _Body] = {}
        # Where a family's body was last made by formatting only the lines that changed:
        # the body with where each line starts (8 bytes a line, for families that move).
        self._lines: dict[str, _Lines] = {}

    def _header(self, family: SeriesFamily) -> bytes:
        key = (family.name, family.type, family.documentation)
        header = self._headers.get(key)
        if header is None:
            name = family.name + "_total" if family.type == "counter" else family.name
            header = (
                f"# HELP {name} {_escape_help(family.documentation)}\n# TYPE {name} {family.type}\n"
            ).encode()
            self._headers[key] = header
        return header

    def _prefix_list(self, family: SeriesFamily) -> list[str]:
        """The family's `{labels} ` prefixes (`_label_text`), formatted again only when its
        label list changed (a device appeared or vanished; rare). Equal lists hold the same
        dicts in the same order almost always (LabelCache), and list equality checks each
        element by identity before comparing dict contents. Prefixes are not kept per label
        dict across lists: on a node with 50 NFS mounts that index cost 1.6 MB for 9,350
        series. Families with equal label lists (a mount's eight per-operation families)
        share one list of prefixes, made once."""
        hit = self._lists.get(family.sample_name)
        if hit is not None and hit[0] == family.labels:
            return hit[1]
        for kept in self._lists.values():
            if kept[0] == family.labels:  # another family's list of the same label sets
                break
        else:
            kept = (list(family.labels), [_label_text(labels) for labels in family.labels])
        self._lists[family.sample_name] = kept
        return kept[1]

    def _body(self, family: SeriesFamily) -> bytes:
        """The family's sample lines, reused while its labels and values are unchanged.

        Values compare bit for bit as doubles where all are present (`_values_key`), so
        -0.0 (equal to 0.0, rendered "-0.0") is told apart: a reused body is always the one
        a fresh render writes. Where a few of such a family's values changed, only their
        lines are formatted again (`_Lines`).
        """
        values = family.values
        prefixes = self._prefix_list(family)  # a new list whenever the label list changed
        name = family.sample_name
        hit = self._bodies.get(name)
        if hit is not None and hit[0] is prefixes and hit[3] is values:
            return hit[2]  # the very tuple of the last render: nothing can have changed
        kept = values if type(values) is tuple else None
        key = _values_key(values)
        if hit is not None and hit[0] is prefixes and key is not None:
            if hit[1] == key:
                return hit[2]
            if type(key) is bytes and type(hit[1]) is bytes:
                changed = _few_changed(hit[1], key)
                if changed is not None:
                    lines = self._lines.get(name) or _Lines(hit[2])
                    lines.update(name, prefixes, values, changed)
                    self._lines[name] = lines
                    self._bodies[name] = (prefixes, key, lines.body, kept)
                    return lines.body
        self._lines.pop(name, None)
        body = _lines_of(name, prefixes, values)
        self._bodies[name] = (prefixes, key, body, kept)
        return body

    def render_parts(self, families: Iterable[SeriesFamily]) -> list[bytes]:
        """Exposition text for `families` as the renderer's own header and body bytes, in
        order (join them for the text): a caller that joins parts of several renderers
        holds the text once, not once more per renderer."""
        out: list[bytes] = []
        for family in families:
            if not family.count():
                continue
            out.append(self._header(family))
            out.append(self._body(family))
        return out

    def render(self, families: Iterable[SeriesFamily]) -> bytes:
        """Exposition text for `families`; families without samples are left out."""
        return b"".join(self.render_parts(families))


# A family's last render: its prefix list, its values' `_values_key`, its bytes, and its
# values where they were a tuple (immutable: the same tuple again is the same lines).
_Values = tuple[float | None, ...]
_Body = tuple[list[str], bytes | _Values | None, bytes, _Values | None]


def _lines_of(name: str, prefixes: list[str], values: Sequence[float | None]) -> bytes:
    """Every present value's line: `name`, its prefix, its value; the name joins the
    lines (each line after a newline starts with it), so no line is put together in
    Python code but its value's text."""
    if None in values:
        present = [value is not None for value in values]
        prefixes = list(compress(prefixes, present))
        values = list(compress(values, present))
    if not values:
        return b""
    texts = map(operator.add, prefixes, map(format_value, cast("Sequence[float]", values)))
    joiner = "\n" + name
    return f"{name}{joiner.join(texts)}\n".encode()


def _label_text(labels: dict[str, str]) -> str:
    """What follows the sample name on a line, up to the value: `{k="v",...} `, or ` `.
    Kept without the name, which every line of the family shares (a third of the text
    held on a node with 50 NFS mounts)."""
    if labels:
        body = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels.items()))
        return f"{{{body}}} "
    return " "


def _values_key(values: Sequence[float | None]) -> bytes | tuple[float | None, ...] | None:
    """What a family's lines depend on, to compare with the last render's: the values as
    doubles, bit for bit, made in one C pass (a value renders as a function of its double,
    and the bits tell -0.0 from 0.0); for a family with absent values the tuple of values,
    or None (never reused) when one of them is -0.0."""
    try:
        return array("d", cast("Sequence[float]", values)).tobytes()
    except TypeError:  # an absent value (None)
        pass
    except OverflowError:  # an integer beyond a double: compared as it is
        pass
    found = tuple(values)
    if 0.0 in found and any(v == 0 and math.copysign(1.0, v) < 0 for v in found if v is not None):
        return None
    return found


class _Lines:
    """A rendered body whose every value was present, with where each line starts, so
    that the lines of the values that changed can be formatted again and the others taken
    from it."""

    __slots__ = ("body", "starts")

    def __init__(self, body: bytes) -> None:
        self.body = body
        lengths = map(len, body.split(b"\n"))  # each line without its newline, then b""
        self.starts = array("L", accumulate(lengths, _after_newline, initial=0))

    def update(
        self, name: str, prefixes: list[str], values: Sequence[float | None], changed: list[int]
    ) -> None:
        """Make the body for `values` (every one present) from the one held, formatting
        only the lines `changed` (their indices, ascending)."""
        body, starts = self.body, self.starts
        pieces: list[bytes] = []
        shifted = False
        done = 0
        for i in changed:
            line = f"{name}{prefixes[i]}{format_value(cast(float, values[i]))}\n".encode()
            start, end = starts[i], starts[i + 1]
            pieces += (body[done:start], line)
            done = end
            shifted = shifted or len(line) != end - start
        pieces.append(body[done:])
        self.body = b"".join(pieces)
        if shifted:  # a line's length changed: where the lines after it start moved
            lengths = array("L", map(operator.sub, starts[1:], starts[:-1]))
            for i, line in zip(changed, pieces[1::2], strict=True):
                lengths[i] = len(line)
            self.starts = array("L", accumulate(lengths, initial=0))


def _few_changed(old_key: bytes, key: bytes) -> list[int] | None:
    """The indices of the values whose double differs between two `_values_key` bytes of
    as many values, or None when more than a quarter of them do (a whole render then costs
    no more than taking the rest from the last one)."""
    olds, news = memoryview(old_key).cast("Q"), memoryview(key).cast("Q")
    changed = list(compress(range(len(news)), map(operator.ne, olds, news)))
    return None if len(changed) * 4 > len(news) else changed


def _after_newline(start: int, length: int) -> int:
    """Where the next line starts, after a line of `length` bytes and its newline."""
    return start + length + 1
