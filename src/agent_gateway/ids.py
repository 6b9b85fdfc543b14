"""Record ids: UUIDs in the spec's pattern, stored lower-case.

A leaf: the routes check path and query ids with it, and so does the command line,
which must not import the HTTP framework to do so.
"""

from __future__ import annotations

import random
import re
import time

from agent_gateway import errors

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def is_uuid(value: object) -> bool:
    return type(value) is str and _UUID.fullmatch(value) is not None


def uuid(name: str, value: str | None) -> str | None:
    """A UUID in the spec's pattern, returned lower-cased (ids are stored lower-case)."""
    if value is None:
        return None
    if not is_uuid(value):
        raise errors.InvalidInput(f"{name} must be a UUID")
    return value.lower()


def new() -> str:
    """A new record id (a Message's, a Signal's, a Run's, an outbox row's): a UUID of version 7
    (RFC 9562, 5.7), its first 48 bits the Unix time in milliseconds and 74 of the rest random, so
    new ids sort after older ones. Inserted in that order, each goes at the right edge of an index
    on the id, where a random one dirtied a random page of it in each commit (on PostgreSQL a page
    image in the WAL too).

    Not for a User's id, the only handle a User has, which should not say when it was issued."""
    # Unique, not secret: the random module's bits (reseeded in a forked child) cost no system call.
    random_bits = random.getrandbits(74)
    rand_a, rand_b = random_bits >> 62, random_bits & ((1 << 62) - 1)
    value = (time.time_ns() // 1_000_000) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
