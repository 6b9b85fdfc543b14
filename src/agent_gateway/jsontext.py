"""JSON text in and out, with every value kept exactly.

orjson is fast and strict (it refuses NaN, invalid UTF-8 and lone
surrogates), but it holds integers to 64 bits: it parses a longer integer as
a float, silently losing digits, and refuses to write one. JSON has no such
limit and the spec stores Attributes, payloads and Schedule data "exactly as
written", so these two functions fall back to the standard library, which
keeps integers exact, in just those cases.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# Any integer outside orjson's 64-bit range has at least 19 digits in a row.
_LONG_DIGITS_BYTES = re.compile(rb"[0-9]{19}")
_LONG_DIGITS_TEXT = re.compile(r"[0-9]{19}")
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


def loads(text: bytes | str) -> Any:
    """Parse strict JSON; raise ValueError (orjson.JSONDecodeError) for anything else."""
    value = orjson.loads(text)
    pattern = _LONG_DIGITS_BYTES if isinstance(text, bytes) else _LONG_DIGITS_TEXT
    if pattern.search(text):  # type: ignore[arg-type]
        # orjson has already judged the text valid; re-read it for exact integers.
        value = json.loads(text)
    return value


def dumps(value: Any, *, indent: bool = False) -> bytes:
    """Serialize a JSON value (as :func:`loads` returns them) to UTF-8 JSON text."""
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else None)
    except orjson.JSONEncodeError:
        if not _has_big_integer(value):
            raise
    separators = None if indent else (",", ":")
    return json.dumps(
        value, ensure_ascii=False, allow_nan=False, indent=2 if indent else None, separators=separators
    ).encode()


def _has_big_integer(value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return not _INT64_MIN <= value <= _UINT64_MAX
    if isinstance(value, dict):
        return any(_has_big_integer(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_big_integer(item) for item in value)
    return False
