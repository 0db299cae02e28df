"""Kubernetes name patterns, written once: node names, label keys and values, taint reasons.

The tainter checks webhook labels and flags with them, the rules config and the simulated
cluster check their pod label keys, and the chart's values schema checks taint reasons, so
a name one of them accepts is accepted by all (and by the API server). The `*_PATTERN`
strings are plain regular expressions (RE2 and ECMA compatible) for JSON schemas; the
`is_*` functions match a whole string.
"""

from __future__ import annotations

import re
from typing import Final

DNS_SUBDOMAIN_PATTERN: Final = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
"""A DNS subdomain (RFC 1123, 253 characters at most): node names, label key prefixes."""
NAME_PART_PATTERN: Final = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
"""The name part of a label or taint key (63 characters at most)."""
LABEL_KEY_PATTERN: Final = rf"({DNS_SUBDOMAIN_PATTERN}/)?{NAME_PART_PATTERN}"
"""A label key: an optional DNS-subdomain prefix and `/`, then a name part."""
LABEL_VALUE_PATTERN: Final = rf"({NAME_PART_PATTERN})?"
"""A label value: empty, or shaped like a name part."""
TAINT_REASON_PATTERN: Final = NAME_PART_PATTERN
"""A fleetwatch taint reason: the name part of the taint key `fleetwatch.io/<reason>`."""

_NODE_NAME: Final = re.compile(DNS_SUBDOMAIN_PATTERN)
_LABEL_KEY: Final = re.compile(LABEL_KEY_PATTERN)
_LABEL_VALUE: Final = re.compile(LABEL_VALUE_PATTERN)
_TAINT_REASON: Final = re.compile(TAINT_REASON_PATTERN)
TAINT_REASON_RULE: Final = "letters, digits, '-', '_', '.', 63 characters at most"
"""What a valid taint reason is, in words, for error messages."""


def anchored(pattern: str) -> str:
    """`pattern` matching a whole string, as JSON schemas need it (none of the patterns
    here has a top-level `|`, so `^...$` binds to all of it)."""
    return f"^{pattern}$"


def is_node_name(text: str) -> bool:
    """True when `text` can name a Kubernetes node (or a pod or namespace subdomain)."""
    return bool(_NODE_NAME.fullmatch(text))


def is_label_key(text: str) -> bool:
    """True when `text` is a valid Kubernetes label key (`example.com/name` or `name`)."""
    return bool(_LABEL_KEY.fullmatch(text))


def is_label_value(text: str) -> bool:
    """True when `text` is a valid Kubernetes label value (empty included)."""
    return bool(_LABEL_VALUE.fullmatch(text))


def is_taint_reason(text: str) -> bool:
    """True when `fleetwatch.io/<text>` is a valid taint key."""
    return bool(_TAINT_REASON.fullmatch(text))
