"""The demo echo agent: ``python -m agent_gateway.runtimes.echo``.

The reference for what a real agent program does under the command runtime:
it reads its Prompt on stdin and acts through the Agent server at
``$AGENT_SERVER_URL``. For a Message Prompt it posts an outbound Message,
``{userId, text}``, to ``/messages``, whose text is ``echo: `` and the User's
words.

Which User: the Session ``user_<id>`` (``AGENT_GATEWAY_SESSION``, as the
default ``[handlers."message.received"]`` session template names it), else the
first line of the default Prompt template, ``A message from user <id>:``. The
User's words are what follows that first line and its blank line, or the whole
Prompt when it is not in that form. A Prompt naming no User fails the Run
(exit 2); an answer the Agent server refuses fails it too (exit 1), with the
reason on stderr.
"""

from __future__ import annotations

import os
import re
import sys

import httpx

MESSAGES_PATH = "/messages"
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


def main() -> int:
    prompt = sys.stdin.read()
    url = os.environ.get("AGENT_SERVER_URL")
    if not url:
        print("echo: AGENT_SERVER_URL is not set; run me under the gateway's command runtime", file=sys.stderr)
        return 2
    reply = answer(prompt, os.environ.get("AGENT_GATEWAY_SESSION", ""))
    if reply is None:
        print("echo: neither the Session nor the Prompt names a User; nothing to answer", file=sys.stderr)
        return 2
    user_id, text = reply
    try:
        response = httpx.post(url.rstrip("/") + MESSAGES_PATH, json={"userId": user_id, "text": text}, timeout=30)
    except httpx.HTTPError as exc:
        print(f"echo: the Agent server at {url} did not answer: {exc}", file=sys.stderr)
        return 1
    if response.status_code != 201:
        print(f"echo: POST {MESSAGES_PATH} answered {response.status_code}: {response.text[:500]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
