"""errors.py: GatewayError is the root of every area's errors."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import agent_gateway
from agent_gateway import errors

# Each one's reason (beside its class where it is not evident).
NOT_GATEWAY_ERRORS = {
    "agent_gateway.agent.client.AgentError",  # the kit's side of the boundary
    "agent_gateway.agent.llm.faults.RunError",  # the reference agent program's own, on the kit's side
    "agent_gateway.agent.llm.models.ModelUnavailable",
    "agent_gateway.signatures.identity.AlgorithmMismatch",  # a bare 500 under a route
    "agent_gateway.cli.chat.SessionEnded",  # the chat command's way out of its loops, caught there
    "agent_gateway.runtimes.persistent._Ended",  # private: the runtime turns each into a RunFailed
    "agent_gateway.runtimes.persistent._ProtocolBroken",
}


def test_every_exception_class_derives_from_gateway_error() -> None:
    found = set()
    for module_info in pkgutil.walk_packages(agent_gateway.__path__, "agent_gateway."):
        if module_info.name.endswith("__main__"):
            continue
        module = importlib.import_module(module_info.name)
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, Exception) and value.__module__ == module.__name__:
                found.add(value)
    outside = {f"{cls.__module__}.{cls.__qualname__}" for cls in found if not issubclass(cls, errors.GatewayError)}
    assert outside == NOT_GATEWAY_ERRORS


def test_a_default_message_is_the_docstring_and_an_empty_one_is_kept() -> None:
    assert errors.AuthenticationFailed().message == "authentication failed"
    assert errors.NotFound("").message == ""
