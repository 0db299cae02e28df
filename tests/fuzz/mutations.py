"""Seeds and mutations: real samples the tests already hold, changed the ways bad input
arrives. A fuzz test draws a seed and applies a few mutations to it:

- cut short (a read interrupted, a file being rewritten), bits flipped, bytes inserted;
- a field grown huge (up to `huge` bytes: a 1 MiB line), a number replaced by one no
  counter holds (negative, 5000 digits, `nan`, `1e309`, hexadecimal);
- the wrong encoding (UTF-16, Latin-1 read as UTF-8, a byte-order mark), escapes;
- lines duplicated, dropped, reordered, or spliced from another seed.

`mutated_bytes`/`mutated_text` work on raw text; `mutated_tree` on a parsed JSON or YAML
value (keys dropped and added, values replaced by ones of another type, lists grown).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Final

from hypothesis import strategies as st

Draw = st.DrawFn
Mutation = Callable[[Draw, bytes, Sequence[bytes], int], bytes]

MIB: Final = 1 << 20
_NUMBER: Final = re.compile(rb"-?\d+")
ODD_NUMBERS: Final = (
    b"-1",
    b"0",
    b"18446744073709551616",
    b"9" * 5000,
    b"nan",
    b"NaN",
    b"inf",
    b"-inf",
    b"1e309",
    b"0x1f",
    b"1.5",
    b"\xd9\xa3",  # ARABIC-INDIC DIGIT THREE: int() reads it
    b"\xc2\xb2",  # SUPERSCRIPT TWO: str.isdigit() says yes, int() refuses it
    b"",
)
ODD_TOKENS: Final = (
    b"\x00",
    b"\\x0a",
    b"\\x00",
    b"\\040",
    b"\r",
    b"\r\n",
    b"\t",
    b"\n\n",
    b" ",
    b":",
    b"=",
    b";",
    b",",
    b"-",
    b"'",
    b'"',
    b"{",
    b"}",
    b"[",
    b"]",
    b"\xef\xbb\xbf",
    b"\xff\xfe",
    b"\xc3",
    b"\xe2\x80\xae",
)


def _position(draw: Draw, data: bytes) -> int:
    return draw(st.integers(0, len(data)))


def truncate(draw: Draw, data: bytes, seeds: Sequence[bytes], huge: int) -> bytes:
    return data[: _position(draw, data)]


def flip_bits(draw: Draw, data: bytes, seeds: Sequence[bytes], huge: int) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        index = draw(st.integers(0, len(out) - 1))
        out[index] ^= 1 << draw(st.integers(0, 7))
    return bytes(out)


def insert(draw: Draw, data: bytes, seeds: Sequence[bytes], huge: int) -> bytes:
    at = _position(draw, data)
    extra = draw(st.one_of(st.sampled_from(ODD_TOKENS), st.binary(max_size=16)))
    return data[:at] + extra + data[at:]


def grow_field(draw: Draw, data: bytes, seeds: Sequence[bytes], huge: int) -> bytes:
    """A slice of the input (or one byte) repeated up to `huge` bytes, where it was."""
    at = _position(draw, data)
    piece = data[at : at + draw(st.integers(1, 16))] or b"A"
    size = draw(st.sampled_from((256, 8193, 65536, huge)))
    return data[:at] + piece * (size // len(piece) + 1) + data[at:]


def odd_number(draw: Draw, data: bytes, seeds: Sequence[bytes], huge: int) -> bytes:
    numbers = list(_NUMBER.finditer(data))
    if not numbers:
        return data
    found = draw(st.sampled_from(numbers))
    return data[: found.start()] + draw(st.sampled_from(ODD_NUMBERS)) + data[found.end() :]


def wrong_encoding(draw: Draw, data: bytes, seeds: Sequence[bytes], huge: int) -> bytes:
    text = data.decode("utf-8", errors="replace")
    how = draw(st.sampled_from(("utf-16", "utf-16-le", "latin-1-twice", "bom", "utf-32")))
    if how == "latin-1-twice":  # UTF-8 bytes read as Latin-1 and written out as UTF-8 again
        return data.decode("latin-1").encode("utf-8")
    if how == "bom":
        return b"\xef\xbb\xbf" + data
    return text.encode(how)


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def duplicate_line(draw: Draw, data: bytes, seeds: Sequence[bytes], huge: int) -> bytes:
    lines = _lines(data)
    index = draw(st.integers(0, len(lines) - 1))
    lines.insert(index, lines[index])
    return b"\n".join(lines)


def drop_line(draw: Draw, data: bytes, seeds: Sequence[bytes], huge: int) -> bytes:
    lines = _lines(data)
    del lines[draw(st.integers(0, len(lines) - 1))]
    return b"\n".join(lines)


def reorder_lines(draw: Draw, data: bytes, seeds: Sequence[bytes], huge: int) -> bytes:
    return b"\n".join(draw(st.permutations(_lines(data))))


def splice(draw: Draw, data: bytes, seeds: Sequence[bytes], huge: int) -> bytes:
    other = draw(st.sampled_from(seeds))
    return data[: _position(draw, data)] + other[_position(draw, other) :]


MUTATIONS: Final[tuple[Mutation, ...]] = (
    truncate,
    flip_bits,
    insert,
    grow_field,
    odd_number,
    wrong_encoding,
    duplicate_line,
    drop_line,
    reorder_lines,
    splice,
)


@st.composite
def mutated_bytes(draw: Draw, seeds: Sequence[bytes], *, steps: int = 4, huge: int = MIB) -> bytes:
    """A seed, changed by up to `steps` mutations (none: the seed as it is)."""
    data: bytes = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(0, steps))):
        mutation = draw(st.sampled_from(MUTATIONS))
        data = mutation(draw, data, seeds, huge)
    return data


def mutated_text(
    seeds: Sequence[str], *, steps: int = 4, huge: int = MIB
) -> st.SearchStrategy[str]:
    """`mutated_bytes` of UTF-8 seeds, decoded as a reader does (bad bytes replaced)."""
    raw = [seed.encode() for seed in seeds]
    return mutated_bytes(raw, steps=steps, huge=huge).map(
        lambda data: data.decode("utf-8", errors="replace")
    )


JSON_SCALARS: Final = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(("", "NaN", "+Inf", "-1", "firing", "resolved", "4", "success", "x" * 5000)),
)
JSON_VALUES: Final = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)


@st.composite
def _tree(draw: Draw, value: Any, depth: int) -> Any:
    roll = draw(st.integers(0, 15))
    if roll == 0:
        return draw(JSON_VALUES)
    if depth > 8:
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if draw(st.integers(0, 11)) == 0:
                continue  # a key dropped
            out[key] = draw(_tree(item, depth + 1))
        if roll == 1:
            out[draw(st.text(max_size=12))] = draw(JSON_VALUES)
        return out
    if isinstance(value, list):
        items = [draw(_tree(item, depth + 1)) for item in value]
        if roll == 1 and items:
            items += items * draw(st.integers(1, 50))  # duplicated entries
        if roll == 2:
            items = draw(st.permutations(items))
        return items
    return value


def mutated_tree(seeds: Sequence[Any]) -> st.SearchStrategy[Any]:
    """A parsed seed (JSON or YAML value) with parts of it dropped, replaced or grown."""
    return st.sampled_from(seeds).flatmap(lambda seed: _tree(seed, 0))
