"""The ledger's canonical JSON: the fast encoder gives RFC 8785's bytes, or hands over to the library."""

from __future__ import annotations

import random

import orjson
import pytest
import rfc8785

from agent_gateway.ledger import entries


def test_every_bmp_character_and_astral_ones_are_escaped_as_rfc_8785_escapes_them() -> None:
    for base in range(0, 0x10000, 256):
        text = "".join(chr(c) for c in range(base, base + 256) if not 0xD800 <= c < 0xE000)
        assert entries.canonical({"t": text}) == rfc8785.dumps({"t": text})
    astral = "".join(chr(c) for c in range(0x10000, 0x110000, 97))
    assert entries.canonical([astral]) == rfc8785.dumps([astral])


def test_member_names_sort_by_utf16_code_units_where_code_points_would_not() -> None:
    # U+E000 sorts above a surrogate pair in UTF-16, below U+1F600 by code point.
    value = {"\ue000": 1, "\U0001f600": 2, "a": 3, "\u00e9": 4, "": 5}
    assert entries.canonical(value) == rfc8785.dumps(value)
    assert entries.canonical(value).index("\U0001f600".encode()) < entries.canonical(value).index("\ue000".encode())


def test_random_values_encode_as_the_library_encodes_them() -> None:
    generator = random.Random(8785)
    alphabet = [chr(c) for c in (*range(0x00, 0x80), 0xE9, 0x20AC, 0x2028, 0xD7FF, 0xE000, 0xFFFF, 0x1F600)]

    def text() -> str:
        return "".join(generator.choice(alphabet) for _ in range(generator.randrange(6)))

    def value(depth: int) -> object:
        kind = generator.randrange(8 if depth < 3 else 5)
        if kind == 0:
            return text()
        if kind == 1:
            return generator.choice([None, True, False])
        if kind == 2:
            return generator.randrange(-(2**53) + 1, 2**53)
        if kind == 3:
            return generator.choice([0.5, -0.0, 1e21, 1e-7, 123456789.125])
        if kind == 4:
            return generator.randrange(-1000, 1000)
        if kind == 5:
            return [value(depth + 1) for _ in range(generator.randrange(4))]
        return {text(): value(depth + 1) for _ in range(generator.randrange(5))}

    for _ in range(3000):
        made = value(0)
        assert entries.canonical(made) == rfc8785.dumps(made), made


@pytest.mark.parametrize("value", [2**53, -(2**53), "\ud800", {"a": ["x\udfff"]}, float("nan")])
def test_what_i_json_leaves_out_is_refused_as_the_library_refuses_it(value: object) -> None:
    with pytest.raises(rfc8785.CanonicalizationError):
        entries.canonical(value)


def test_the_largest_safe_integers_are_encoded() -> None:
    assert entries.canonical([2**53 - 1, -(2**53) + 1]) == b"[9007199254740991,-9007199254740991]"


def test_a_runs_entry_is_the_librarys_encoding_of_it_whatever_its_strings_hold() -> None:
    # The Run's entry skips canonical()'s check of its shape: its strings may hold anything.
    generator = random.Random(41)
    alphabet = [chr(c) for c in (0x00, 0x1F, 0x22, 0x5C, 0x41, 0x7F, 0xE9, 0x2028, 0xD7FF, 0xE000, 0xFFFF, 0x1F600)]
    for _ in range(500):
        strings = ["".join(generator.choice(alphabet) for _ in range(generator.randrange(8))) for _ in range(5)]
        fields = {
            "run_id": strings[0], "signal_id": strings[1], "kind": strings[2], "origin": "message",
            "session": generator.choice([None, strings[3]]), "prompt": strings[4], "payload": {"text": strings[4]},
            "instructions_seq": generator.randrange(1, 2**53), "started_at": "2026-11-29T00:00:00.000Z",
        }
        entry = orjson.loads(entries.run(**fields))
        assert entries.run(**fields) == rfc8785.dumps(entry)
    lone = dict(fields, session="\udc00")
    with pytest.raises(rfc8785.CanonicalizationError):
        entries.run(**lone)


@pytest.mark.parametrize(
    "value",
    [
        {"a": [{"\ue000": 1, "\U0001f600": 2}]},  # names sorting otherwise, deep in a list
        {"é": {"\U0001f600": [], "\ue000x": None}},
        {"é": "✓", "b": [True, 0, False, 1]},  # non-ASCII names and values, booleans beside integers
        [{"k": 1.0}, {"k": 2**53 - 1}],  # a float deep in: the library's number form
    ],
)
def test_names_past_ascii_and_numbers_anywhere_encode_as_the_library_encodes_them(value: object) -> None:
    assert entries.canonical(value) == rfc8785.dumps(value)
