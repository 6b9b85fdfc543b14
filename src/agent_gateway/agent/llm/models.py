"""The pydantic-ai model a ``PROVIDER:MODEL`` names, with its API key from the environment."""

from __future__ import annotations

import importlib
import os

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
        return OpenAIChatModel(name, provider=OpenAIProvider(base_url=base_url, api_key=key or NO_KEY))
    if not key:
        raise ModelUnavailable(f"no API key for {spec}: ${env} is not set in the gateway's environment")
    provider_class = infer_provider_class(provider)
    return infer_model(spec, provider_factory=lambda _: provider_class(api_key=key))  # type: ignore[call-arg]


def _callable(target: str) -> object:
    """``MODULE:CALLABLE`` imported (the testing hook of providers.FUNCTION_MODELS_ENV)."""
    module, _, attribute = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ModelUnavailable(f"function:{target}: {exc}") from None
