"""Fixtures of the foundation tests: an empty (never migrated) database of each backend."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import POSTGRES_URL, REQUIRE_POSTGRES, admin


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of each backend that no migration has touched."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    name = f"agw_fresh_{uuid.uuid4().hex[:12]}"
    try:
        asyncio.run(admin(f"CREATE DATABASE {name}"))
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        reason = f"PostgreSQL at {POSTGRES_URL} is unreachable: {exc}"
        if REQUIRE_POSTGRES:
            pytest.fail(reason)
        pytest.skip(reason)
    base, _, _ = POSTGRES_URL.rpartition("/")
    yield f"{base}/{name}"
    asyncio.run(admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
