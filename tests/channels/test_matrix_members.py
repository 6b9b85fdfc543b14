"""How the Matrix channel counts a room's members as each message of a sync was written (no
homeserver: the events as matrix-nio parses them from the wire)."""

from __future__ import annotations

from typing import Any

import nio

from agent_gateway.channels import matrix


def event(source: dict[str, Any]) -> Any:
    return nio.Event.parse_event({"event_id": f"${id(source)}", "origin_server_ts": 1, **source})


def member(who: str, membership: str, previous: str | None = None) -> Any:
    unsigned = {"prev_content": {"membership": previous}} if previous else {}
    return event({
        "type": "m.room.member", "state_key": who, "sender": who, "content": {"membership": membership},
        "unsigned": unsigned,
    })


def said(who: str, words: str) -> Any:
    return event({"type": "m.room.message", "sender": who, "content": {"msgtype": "m.text", "body": words}})


def room(joined: int, invited: int = 0) -> nio.MatrixRoom:
    """A room as matrix-nio holds it once a sync is applied: the homeserver's counts."""
    found = nio.MatrixRoom("!room:example.org", "@agent:example.org")
    found.update_summary(nio.RoomSummary(joined, invited, []))
    return found


def test_a_message_written_before_someone_left_in_the_same_sync_counts_them() -> None:
    events = [said("@alice:x", "among ourselves"), member("@bob:x", "leave", "join"), said("@alice:x", "just us")]
    assert matrix._members_at(room(2), events) == [3, 2, 2]


def test_a_message_written_before_an_invite_in_the_same_sync_does_not_count_the_invited() -> None:
    events = [said("@alice:x", "just us"), member("@bob:x", "invite"), said("@alice:x", "hi bob"), member("@bob:x", "join", "invite")]
    assert matrix._members_at(room(2, 1), events) == [2, 3, 3, 3]
    assert [matrix._shared(members) for members in matrix._members_at(room(3), events)] == [False, True, True, True]


def test_a_profile_change_or_a_refused_invite_moves_nothing_it_should_not() -> None:
    events = [member("@alice:x", "join", "join"), member("@bob:x", "leave", "invite"), said("@alice:x", "hello")]
    assert matrix._members_at(room(2), events) == [3, 2, 2]


def test_a_room_not_known_counts_none() -> None:
    assert matrix._members_at(None, [said("@alice:x", "hello")]) == [None]
    assert matrix._shared(None) and not matrix._shared(2) and matrix._shared(3)
