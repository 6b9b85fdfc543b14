"""Record ids: the spec's UUID pattern, and new ones in time order (ids.new)."""

from __future__ import annotations

import time
import uuid

import pytest

from agent_gateway import errors, ids


def test_a_new_id_is_a_uuid_of_version_7_in_the_specs_pattern() -> None:
    value = ids.new()
    parsed = uuid.UUID(value)
    assert ids.is_uuid(value) and value == value.lower() and str(parsed) == value
    assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)


def test_a_new_id_begins_with_the_unix_time_in_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    value = ids.new()
    after = time.time_ns() // 1_000_000
    assert before <= uuid.UUID(value).int >> 80 <= after


def test_new_ids_sort_in_the_order_they_were_made_across_milliseconds() -> None:
    made = []
    for _ in range(3):
        made.append(ids.new())
        started = time.time_ns()
        while time.time_ns() - started < 2_000_000:  # into a later millisecond, whatever the machine's speed
            pass
    assert sorted(made) == made


def test_new_ids_are_random_within_a_millisecond() -> None:
    made = {ids.new() for _ in range(10_000)}
    assert len(made) == 10_000
    # 74 random bits: what follows the time alone tells them apart.
    assert len({value[15:] for value in made}) == 10_000


@pytest.mark.parametrize("value", ["", "not-a-uuid", "0b7c5e4e52c34a83a7a40ad3c1b8f7a2", "0b7c5e4e-52c3-4a83-a7a4-0ad3c1b8f7a2 "])
def test_uuid_refuses_what_is_not_in_the_pattern(value: str) -> None:
    with pytest.raises(errors.InvalidInput, match="id must be a UUID"):
        ids.uuid("id", value)


def test_uuid_lower_cases() -> None:
    assert ids.uuid("id", "0B7C5E4E-52C3-4A83-A7A4-0AD3C1B8F7A2") == "0b7c5e4e-52c3-4a83-a7a4-0ad3c1b8f7a2"
    assert ids.uuid("id", None) is None
