"""A kit for agent authors: a typed client of the Agent server and the runtime loop.

    from agent_gateway.agent import serve

    def handle(run, client):
        client.send_message(user_id, "hello")   # raises AgentError when refused

    raise SystemExit(serve(handle))
"""

from agent_gateway.agent.client import (
    AgentError,
    AsyncClient,
    Client,
    Decision,
    Message,
    RunRecord,
    Schedule,
    Signal,
    User,
)
from agent_gateway.agent.serve import Run, serve

__all__ = [
    "AgentError",
    "AsyncClient",
    "Client",
    "Decision",
    "Message",
    "Run",
    "RunRecord",
    "Schedule",
    "Signal",
    "User",
    "serve",
]
