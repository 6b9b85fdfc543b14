"""The pydantic-ai model a ``PROVIDER:MODEL`` names, with its API key from the environment."""

from __future__ import annotations

import importlib
import os

import httpx2
from pydantic_ai.models import Model, infer_model
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers import infer_provider_class
from pydantic_ai.providers.openai import OpenAIProvider

from agent_gateway.agent.llm import providers

# A local OpenAI-compatible server (Ollama, llama.cpp) wants no key, but the OpenAI SDK insists on one.
NO_KEY = "unused"


class ModelUnavailable(Exception):
    """The model cannot be built (no API key, say): every Run fails with this one line."""


def build(spec: str, *, base_url: str | None, api_key_env: str | None) -> Model:
    """The model ``spec`` names; raises ModelUnavailable with one line (never the key)."""
    try:
        provider, name = providers.parse_model(spec, base_url)
    except ValueError as exc:
        raise ModelUnavailable(str(exc)) from None
    if provider == providers.FUNCTION:
        return FunctionModel(_callable(name), model_name=name)
    env = providers.key_env(provider, api_key_env)
    key = os.environ.get(env) if env else None
    if provider == "openai" and base_url is not None:
        # The Chat Completions API, the one every OpenAI-compatible server offers.
        provider_ = OpenAIProvider(base_url=base_url, api_key=key or NO_KEY, http_client=_client())
        return OpenAIChatModel(name, provider=provider_)
    if not key:
        raise ModelUnavailable(f"no API key for {spec}: ${env} is not set in the gateway's environment")
    provider_class = infer_provider_class(provider)
    return infer_model(spec, provider_factory=lambda _: provider_class(api_key=key))  # type: ignore[call-arg]


def _client() -> httpx2.AsyncClient | None:
    """For a base URL under confinement: the egress proxy for every request, its NO_PROXY aside.

    NO_PROXY names the loopback, where the sandbox's Agent server is; a model server on the host's
    loopback (Ollama on localhost) is outside the sandbox, reachable through the proxy only."""
    proxy = os.environ.get("HTTP_PROXY")
    if proxy is None:
        return None  # unconfined: the host's network, the environment's proxies
    return httpx2.AsyncClient(proxy=proxy, timeout=httpx2.Timeout(600, connect=5))


def _callable(target: str) -> object:
    """``MODULE:CALLABLE`` imported (the testing hook of providers.FUNCTION_MODELS_ENV)."""
    module, _, attribute = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ModelUnavailable(f"function:{target}: {exc}") from None
