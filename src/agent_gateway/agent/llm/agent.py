"""One Run of the reference LLM agent: instructions, Session, model, the gateway's tools."""

from __future__ import annotations

import os

from pydantic_ai import Agent, AgentRunError, UsageLimits
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.settings import ModelSettings

from agent_gateway import clock
from agent_gateway.agent import AsyncClient, Run
from agent_gateway.agent.llm import faults, models, providers
from agent_gateway.agent.llm.sessions import SessionStore
from agent_gateway.agent.llm.settings import Settings

# How often a tool the model called badly may be retried with the error shown to the model.
TOOL_RETRIES = 3


class LLMAgent:
    """Answers Runs with the model, the Session's memory and the MCP tools of the Agent server at ``url``."""

    def __init__(self, settings: Settings, url: str) -> None:
        self.settings = settings
        self.sessions = SessionStore(settings.sessions, settings.history)
        self._url = url.rstrip("/") + "/mcp"
        # Masked wherever it could surface; never written anywhere.
        self._secrets = tuple(filter(None, [os.environ.get(_key_env(settings) or "")]))
        self._agent: Agent[None, str] | None = None
        self._toolset: MCPToolset[None] | None = None
        self._unavailable: str | None = None
        try:
            model = models.build(settings.model, base_url=settings.base_url, api_key_env=settings.api_key_env)
        except models.ModelUnavailable as exc:
            # Fail each Run with the reason rather than exit: an exit would restart the program in a loop.
            self._unavailable = str(exc)
            return
        self._agent = Agent(
            model,
            output_type=str,
            retries=TOOL_RETRIES,
            model_settings=ModelSettings(timeout=settings.timeout, max_retries=settings.retries),
        )

    async def handle(self, run: Run, client: AsyncClient) -> None:
        """Run the model on ``run``'s Prompt; raise RunError with one line when it fails."""
        try:
            await self._answer(run)
        except Exception as exc:
            if not isinstance(exc, (faults.RunError, AgentRunError)):
                await self._reconnect()  # not the model's failure: perhaps the MCP session's
            raise faults.RunError(faults.describe(exc, model=self.settings.model, secrets=self._secrets)) from None

    async def _answer(self, run: Run) -> None:
        if self._agent is None:
            raise faults.RunError(self._unavailable)
        instructions = self._instructions()
        history = self.sessions.load(run.session) if run.session is not None else []
        result = await self._agent.run(
            run.prompt,
            message_history=history,
            instructions=instructions,
            toolsets=[await self._tools()],
            usage_limits=UsageLimits(
                request_limit=self.settings.max_turns, tool_calls_limit=self.settings.max_tool_calls
            ),
        )
        if run.session is not None:
            self.sessions.save(run.session, result.all_messages())

    def _instructions(self) -> str:
        """The instructions file, read at each Run so that an edit needs no restart, and the time.

        The time lets the model turn "tomorrow at 9" into a Schedule's instant."""
        try:
            text = self.settings.instructions.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise faults.RunError(f"instructions {self.settings.instructions}: {exc.strerror or exc}") from None
        return f"{text.rstrip()}\n\nThe time now is {clock.now_iso()} (UTC)."

    async def _tools(self) -> MCPToolset[None]:
        """The gateway's MCP tools, on one session kept open across Runs (entered here, once)."""
        if self._toolset is None:
            toolset: MCPToolset[None] = MCPToolset(self._url, id="gateway")
            await toolset.__aenter__()
            self._toolset = toolset
        return self._toolset

    async def _reconnect(self) -> None:
        """Drop the MCP session after an unexpected failure; the next Run opens a fresh one."""
        toolset, self._toolset = self._toolset, None
        if toolset is not None:
            try:
                await toolset.__aexit__(None, None, None)
            except Exception:  # a session already broken: nothing left to close
                pass


def _key_env(settings: Settings) -> str | None:
    """The variable holding the API key, if the model is one that takes a key."""
    try:
        provider, _ = providers.parse_model(settings.model, settings.base_url)
    except ValueError:
        return None  # models.build says why, at every Run
    return providers.key_env(provider, settings.api_key_env)
