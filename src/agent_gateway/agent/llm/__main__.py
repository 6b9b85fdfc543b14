"""``python -m agent_gateway.agent.llm --model PROVIDER:MODEL ...``: the reference LLM agent program.

Run under the gateway (``runtime.command``, as ``agent-gateway init --agent
llm`` writes it), never by hand: it reads Runs from the gateway on stdin.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from agent_gateway.agent import serve
from agent_gateway.agent.client import URL_ENV
from agent_gateway.agent.llm.settings import Settings

DEFAULTS = Settings(model="")


def _positive(kind: type) -> object:
    def parse(text: str) -> object:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive (got {text})")
        return value

    parse.__name__ = kind.__name__
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m agent_gateway.agent.llm",
        description="The reference LLM agent: answers each Run with the model, the Session's memory "
        "(in the Workspace) and the gateway's MCP tools at $AGENT_SERVER_URL/mcp.",
    )
    p.add_argument("--model", required=True, help="PROVIDER:MODEL, such as openai:gpt-4o or anthropic:claude-sonnet-4-5")
    p.add_argument("--base-url", help="for openai: a server speaking the Chat Completions API, such as "
                   "http://127.0.0.1:11434/v1 (Ollama)")
    p.add_argument("--api-key-env", help="the environment variable holding the API key (default: the "
                   "provider's usual one, OPENAI_API_KEY for openai:)")
    p.add_argument("--instructions", type=Path, default=DEFAULTS.instructions,
                   help="the instructions file, read at each Run (default: %(default)s, in the Workspace)")
    p.add_argument("--sessions", type=Path, default=DEFAULTS.sessions,
                   help="folder of the Session files (default: %(default)s, in the Workspace)")
    p.add_argument("--history", type=_positive(int), default=DEFAULTS.history,
                   help="exchanges a Session keeps; older ones are dropped whole (default: %(default)s)")
    p.add_argument("--max-turns", type=_positive(int), default=DEFAULTS.max_turns,
                   help="model requests per Run at most (default: %(default)s)")
    p.add_argument("--max-tool-calls", type=_positive(int), default=DEFAULTS.max_tool_calls,
                   help="tool calls per Run at most (default: %(default)s)")
    p.add_argument("--timeout", type=_positive(float), default=DEFAULTS.timeout,
                   help="seconds one model request may take (default: %(default)s)")
    p.add_argument("--retries", type=int, choices=range(0, 11), metavar="0..10", default=DEFAULTS.retries,
                   help="retries of a model request that failed with 429, 5xx or a timeout (default: %(default)s)")
    return p


def main() -> int:
    args = parser().parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    settings = Settings(**vars(args))
    # Imported here: the parser is read by the gateway too (ledger.instructions), without the llm extra.
    from agent_gateway.agent.llm.agent import LLMAgent

    agent = LLMAgent(settings, os.environ.get(URL_ENV, ""))
    return serve(agent.handle)


if __name__ == "__main__":
    raise SystemExit(main())
