"""Record ids: UUIDs in the spec's pattern, stored lower-case.

A leaf: the routes check path and query ids with it, and so does the command line,
which must not import the HTTP framework to do so.
"""

from __future__ import annotations

import re

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
