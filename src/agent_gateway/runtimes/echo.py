"""The demo echo agent: ``python -m agent_gateway.runtimes.echo``.

The reference for an agent program written with the kit (``agent_gateway.agent``):
``serve`` hands it each Run, under the persistent runtime (which ``agent-gateway
init`` configures) or the command runtime alike, and it acts through the Agent
server at ``$AGENT_SERVER_URL``. For a Message Prompt it posts an outbound
Message, ``{userId, text}``, whose text is ``echo: `` and the User's words.

Which User: the Session ``user_<id>`` (as the default
``[handlers."message.received"]`` session template names it), else the first
line of the default Prompt template, ``A message from user <id>:``. The User's
words are what follows that first line and its blank line, or the whole Prompt
when it is not in that form. A Prompt naming no User fails the Run, and so does
an answer the Agent server refuses, with the reason.
"""

from __future__ import annotations

import re
import sys

from agent_gateway.agent import Client, Run, serve

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_SESSION = re.compile(rf"user_({_UUID})")
_HEADER = re.compile(rf"A message from user ({_UUID}):\n\n")


def answer(prompt: str, session: str) -> tuple[str, str] | None:
    """The ``(userId, text)`` to post for ``prompt`` in ``session``; None when no User is named."""
    header = _HEADER.match(prompt)
    words = prompt[header.end() :] if header else prompt
    by_session = _SESSION.fullmatch(session)
    user_id = by_session[1] if by_session else header[1] if header else None
    return None if user_id is None else (user_id.lower(), f"echo: {words}")


def handle(run: Run, client: Client) -> None:
    reply = answer(run.prompt, run.session or "")
    if reply is None:
        raise ValueError("echo: neither the Session nor the Prompt names a User; nothing to answer")
    client.send_message(*reply)


if __name__ == "__main__":
    sys.exit(serve(handle))
