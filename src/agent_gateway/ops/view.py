"""What the ops listener reads of a gateway process: a narrow view, so that ``ops`` does not
import the ``Gateway`` that assembles it (``gateway.py`` imports ``ops``)."""

from __future__ import annotations

from typing import Protocol

from agent_gateway.ops.metrics import Sampled
from agent_gateway.store.engine import Store


class GatewayView(Protocol):
    """A gateway process as ``/readyz`` and ``/metrics`` see it."""

    @property
    def store(self) -> Store: ...

    @property
    def sampled(self) -> Sampled: ...

    def loops_alive(self) -> dict[str, bool]:
        """Whether each loop of this process's roles runs, by name (``worker``, ``scheduler``, ``webhooks``)."""
        ...

    def channels_status(self) -> dict[str, str]:
        """Each chat channel this process stands for, and whether it reaches its server."""
        ...

    def flush_metrics(self) -> None:
        """Move this process's counts so far into the metrics."""
        ...
