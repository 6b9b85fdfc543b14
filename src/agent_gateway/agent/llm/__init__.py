"""The reference LLM agent: a shared agent out of the box, for any model pydantic-ai speaks to.

It is an agent program like any other, served by the agent kit
(:func:`agent_gateway.agent.serve`): each Run's Prompt is the model's new user
turn, the Session's earlier turns (:mod:`.sessions`) are its memory, the
gateway's MCP tools at ``$AGENT_SERVER_URL/mcp`` are its tools, and a plain-text
final answer ends the Run. ``python -m agent_gateway.agent.llm --help`` lists
its settings; ``agent-gateway init DIR --agent llm`` writes a deployment that
runs it. Needs the ``llm`` extra (``pip install -e '.[llm]'`` in a clone of the repository).
"""
