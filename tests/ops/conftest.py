"""Fixtures for the ops listener: a client of a gateway's ops app, and reading /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_gateway.gateway import Gateway


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
