"""A value from outside (a YAML or JSON file an operator wrote) as an error message quotes it:
its `repr`, cut short.

`repr` can raise: YAML reads `0x999…` of any length as an int, and Python refuses to write an
int of more than `sys.get_int_max_str_digits()` decimal digits (ValueError), alone or inside
a list. Such a value is named by its size instead, so the error that quotes it is raised,
not a ValueError from building its message (found by the fuzzer, in the rules config's
schema).
"""

from __future__ import annotations

LIMIT = 80
"""Characters of a value an error message quotes."""


def shown(value: object) -> str:
    """`repr(value)`, at most `LIMIT` characters of it."""
    try:
        return repr(value)[:LIMIT]
    except ValueError:
        if isinstance(value, int):
            return f"<an integer of {value.bit_length()} bits>"
        return f"<a {type(value).__name__} holding an integer too long to write>"
