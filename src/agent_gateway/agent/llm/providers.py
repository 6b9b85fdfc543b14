"""The model providers the reference LLM agent is set up for, and how a ``PROVIDER:MODEL`` names one.

Plain data, without pydantic-ai: ``agent-gateway init`` reads it on the core
install. ``openai:`` with a base URL is any server speaking the Chat Completions
API (Ollama, vLLM, llama.cpp, and the hosted services that offer it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from urllib.parse import urlsplit


@dataclasses.dataclass(frozen=True)
class Provider:
    name: str
    key_env: str  # the environment variable its SDK reads the API key from
    endpoint: str  # host:port of its hosted API


PROVIDERS = {
    provider.name: provider
    for provider in (
        Provider("openai", "OPENAI_API_KEY", "api.openai.com:443"),
        Provider("anthropic", "ANTHROPIC_API_KEY", "api.anthropic.com:443"),
    )
}

# Testing hook: with this variable set to 1 (in the gateway's environment, passed to the agent), a model
# "function:MODULE:CALLABLE" is pydantic-ai's FunctionModel calling MODULE.CALLABLE(messages, info): a
# scripted model for tests and benchmarks. Without it, such a model is refused.
FUNCTION_MODELS_ENV = "LLM_AGENT_FUNCTION_MODELS"
FUNCTION = "function"


def parse_model(spec: str, base_url: str | None = None) -> tuple[str, str]:
    """``(provider, model)`` of ``PROVIDER:MODEL``; raises ValueError saying what is wrong."""
    provider, _, model = spec.partition(":")
    if not model:
        raise ValueError(f"--model must be PROVIDER:MODEL, such as openai:gpt-4o (got {spec!r})")
    if provider == FUNCTION:
        if os.environ.get(FUNCTION_MODELS_ENV) != "1":
            raise ValueError(f"function: models are a testing hook, enabled by {FUNCTION_MODELS_ENV}=1")
        return provider, model
    if provider not in PROVIDERS:
        names = ", ".join(f"{name}:" for name in PROVIDERS)
        raise ValueError(f"unknown provider {provider!r}: use {names} (openai: with --base-url for any "
                         "OpenAI-compatible server)")
    if base_url is not None and provider != "openai":
        raise ValueError("--base-url is for openai: (a server speaking the Chat Completions API)")
    return provider, model


def key_env(provider: str, api_key_env: str | None) -> str | None:
    """The variable holding the API key: the one given, else the provider's usual one."""
    if api_key_env is not None or provider == FUNCTION:
        return api_key_env
    return PROVIDERS[provider].key_env


def endpoints(provider: str, base_url: str | None) -> list[str]:
    """``host:port`` entries the agent must reach for the model: the provider's hosted API, or the base
    URL's host and port, and its addresses too (the egress proxy lets a name that resolves to a
    loopback or private address through only when the address itself is listed: Ollama on localhost)."""
    if base_url is None:
        return [] if provider == FUNCTION else [PROVIDERS[provider].endpoint]
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--base-url must be an http:// or https:// URL (got {base_url!r})")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    hosts = [parts.hostname]
    with contextlib.suppress(OSError):  # not resolvable here and now: the name alone
        hosts += [info[4][0] for info in socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)]
    return [f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host in dict.fromkeys(hosts)]
