"""The runtimes' tests share the Signal Worker's fixtures."""

from tests.signals.conftest import agent_program, make_gateway

__all__ = ["agent_program", "make_gateway"]
