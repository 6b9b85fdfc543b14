"""Fixtures for the ops listener: a client of a gateway's ops app, and reading /metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from agent_gateway.gateway import Gateway
from tests.conftest import Databases, admin


@pytest.fixture
def postgresql_url(postgres_databases: Databases) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database, for the cases that drop it under a running gateway."""
    with postgres_databases.url(migrated=True) as url:
        yield url


READY_DEADLINE_S = 300  # a ceiling for a broken build


async def until_ready(ops: httpx.AsyncClient) -> httpx.Response:
    """``/readyz`` once it answers 200, or its last answer after the ceiling. Each check is
    bounded (readiness.CHECK_TIMEOUT_S): on a loaded machine one probe may fail where the
    next passes, and a prober asks again, as this does."""
    deadline = time.monotonic() + READY_DEADLINE_S
    while True:
        response = await ops.get("/readyz")
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        await asyncio.sleep(0.1)


async def readyz(ops: httpx.AsyncClient) -> httpx.Response:
    """``/readyz``, asked again while its database check runs out of time (on a loaded
    machine): the answer of a check that finished, or the last one after the ceiling."""
    deadline = time.monotonic() + READY_DEADLINE_S
    while True:
        response = await ops.get("/readyz")
        database = response.json().get("checks", {}).get("database", "")
        if not database.startswith("no answer within") or time.monotonic() > deadline:
            return response
        await asyncio.sleep(0.1)


async def drop(url: str) -> None:
    """Drop the database of ``url`` under whoever is connected to it."""
    await admin(f"DROP DATABASE {sa.make_url(url).database} WITH (FORCE)")


async def close_to_connections(url: str) -> None:
    """Close the database of ``url``: its sessions ended, no new one allowed (as gone to its
    users as a drop, without the checkpoint of the whole server every drop waits for, which
    took a minute and more in a busy run)."""
    name = sa.make_url(url).database
    await admin(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
    await admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")


@pytest.fixture
async def ops(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the ops listener's app, in process."""
    assert gateway.ops_app is not None
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.ops_app), base_url="http://ops") as client:
        yield client


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus exposition: (name, labels) -> value."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(text: str, name: str, **labels: str) -> float:
    """One sample's value; 0 when the series has not appeared yet."""
    return samples(text).get((name, frozenset(labels.items())), 0.0)


async def scrape(ops: httpx.AsyncClient) -> str:
    response = await ops.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return response.text
