"""The runtimes' tests share the Signal Worker's fixtures, and run on both event loops."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop

from tests.signals.conftest import agent_program, make_gateway

__all__ = ["agent_program", "make_gateway"]


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Each test here runs on asyncio's loop and on uvloop's, which ``serve`` runs.

    They differ where a runtime meets its program: uvloop answers a write to a
    pipe the program has closed with RuntimeError, asyncio with BrokenPipeError.
    """
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
