"""MCP resources and a prompt beside the tools: the Decision log and a User's Message log to read,
and the gateway explained to a model.

A resource is read through the same route request as its tool (``read_decisions``,
``read_messages``, newest page), so it answers exactly what that route answers;
a refusal is a protocol error carrying the route's message (404 as MCP's
"resource not found").
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from mcp import types
from mcp.shared.exceptions import MCPError

from agent_gateway.mcp import tools as tool_table
from agent_gateway.mcp.delivery import Sender, Unreachable

DECISIONS_URI = "gateway://decisions"
MESSAGES_TEMPLATE = "gateway://messages/{userId}"
_MESSAGES_URI = re.compile(r"gateway://messages/(?P<userId>[^/?#]+)")
RESOURCE_NOT_FOUND = -32002  # MCP's code for a resource that does not exist
PROMPT_NAME = "agent-gateway"

RESOURCES = types.ListResourcesResult(
    resources=[
        types.Resource(
            name="decisions",
            title="The Decision log",
            uri=DECISIONS_URI,
            description="The newest page of the one global Decision log (what read_decisions answers without arguments).",
            mime_type="application/json",
        )
    ]
)
TEMPLATES = types.ListResourceTemplatesResult(
    resource_templates=[
        types.ResourceTemplate(
            name="messages",
            title="A User's Message log",
            uri_template=MESSAGES_TEMPLATE,
            description="The newest page of one User's Message log, both directions (what read_messages answers for that userId).",
            mime_type="application/json",
        )
    ]
)
PROMPTS = types.ListPromptsResult(
    prompts=[
        types.Prompt(
            name=PROMPT_NAME,
            title="The agent-gateway, explained",
            description="What the gateway is, what each of its tools is for, and what their errors mean.",
        )
    ]
)


async def read(send: Sender, available: Mapping[str, tool_table.Tool], uri: str) -> types.ReadResourceResult:
    """The resource at ``uri``, read through its tool's route request."""
    if uri == DECISIONS_URI:
        tool, arguments = available["read_decisions"], {}
    elif match := _MESSAGES_URI.fullmatch(uri):
        tool, arguments = available["read_messages"], {"userId": match["userId"]}
    else:
        raise MCPError(RESOURCE_NOT_FOUND, f"no resource at {uri!r}")
    try:
        status, content = await send(tool.request(arguments))
    except Unreachable as exc:
        raise MCPError(types.INTERNAL_ERROR, str(exc)) from None
    if not 200 <= status < 300:
        raise MCPError(RESOURCE_NOT_FOUND if status == 404 else types.INVALID_PARAMS, tool_table.refusal(status, content))
    text = types.TextResourceContents(uri=uri, mime_type="application/json", text=content.decode())
    return types.ReadResourceResult(contents=[text])


def prompt(name: str, guide: str, available: Mapping[str, tool_table.Tool]) -> types.GetPromptResult:
    """The prompt ``name``: the gateway explained, then each tool (of ``available``) with what it does."""
    if name != PROMPT_NAME:
        raise MCPError(types.INVALID_PARAMS, f"no prompt is named {name!r}")
    lines = [guide, "", "The tools:"]
    lines += [f"- {tool.name}: {tool.description}" for tool in available.values()]
    message = types.PromptMessage(role="user", content=types.TextContent(type="text", text="\n".join(lines)))
    return types.GetPromptResult(description=PROMPTS.prompts[0].description, messages=[message])
