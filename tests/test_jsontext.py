"""JSON text kept exact: integers past 64 bits, and orjson's strictness kept (jsontext.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_gateway import jsontext


@pytest.mark.parametrize(
    "text",
    [
        "18446744073709551616",
        "-9223372036854775809",
        "123456789012345678901234567890",
        '{"a": [1, 100000000000000000000000], "b": 0.5}',
        "[9223372036854775807, 18446744073709551615, -9223372036854775808]",
    ],
)
def test_integers_of_any_size_are_exact(text: str) -> None:
    expected = json.loads(text)
    for form in (text, text.encode()):
        value = jsontext.loads(form)
        assert repr(value) == repr(expected)
        assert repr(jsontext.loads(jsontext.dumps(value))) == repr(expected)
        assert repr(jsontext.loads(jsontext.dumps(value, indent=True))) == repr(expected)


def test_long_digit_runs_elsewhere_are_untouched() -> None:
    value = jsontext.loads(b'{"phone": "12345678901234567890123", "x": 1.5, "y": 0.12345678901234567890}')
    assert value == {"phone": "12345678901234567890123", "x": 1.5, "y": 0.12345678901234568}


def test_dumps_is_compact_utf8_and_keeps_key_order() -> None:
    assert jsontext.dumps({"z": 1, "a": "é"}) == '{"z":1,"a":"é"}'.encode()
    assert jsontext.dumps({"z": 10**20, "a": "é"}) == '{"z":100000000000000000000,"a":"é"}'.encode()
    assert jsontext.dumps({"z": 10**20}, indent=True) == b'{\n  "z": 100000000000000000000\n}'


@pytest.mark.parametrize(
    "text",
    [b"NaN", b"[Infinity]", b'"\xff"', b'"\\ud800"', b"1e400", b"{", b"", b"[1,]", b"[18446744073709551616, NaN]"],
    ids=repr,
)
def test_loads_stays_strict(text: bytes) -> None:
    with pytest.raises(ValueError):
        jsontext.loads(text)


@pytest.mark.parametrize("value", [{1: "non-string key"}, {"a": object()}, [10**30, float("inf")]], ids=["non-string-key", "object", "big-int-and-inf"])
def test_dumps_refuses_what_is_not_json(value: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        jsontext.dumps(value)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_any_json_value_round_trips_exactly(value: object) -> None:
    for indent in (False, True):
        text = jsontext.dumps(value, indent=indent)
        assert repr(jsontext.loads(text)) == repr(value)
        assert repr(jsontext.loads(text.decode())) == repr(value)
    # And text written by anyone else (here the standard library) reads back exactly too.
    assert repr(jsontext.loads(json.dumps(value).encode())) == repr(value)
