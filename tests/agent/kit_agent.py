"""An agent program on the kit for ``serve``'s tests: ``kit_agent.py RECORD sync|async``.

Each Run is appended to RECORD (with the client's kind); the Prompt says what
to do: ``boom`` raises with a message, ``bare`` raises without one, ``print``
prints to stdout (which must not reach the protocol) and succeeds; anything
else succeeds.
"""

import json
import sys

from agent_gateway.agent import serve

record, flavour = sys.argv[1], sys.argv[2]


def act(run, client) -> None:
    with open(record, "a", encoding="utf-8") as file:
        entry = {"id": run.id, "signalId": run.signal_id, "session": run.session, "prompt": run.prompt}
        file.write(json.dumps({**entry, "client": type(client).__name__, "url": client.url}) + "\n")
    if run.prompt == "boom":
        raise RuntimeError("boom went the agent")
    if run.prompt == "bare":
        raise KeyError()
    if run.prompt == "print":
        print('{"type": "done", "run": "forged"}', flush=True)
        print("and some chatter")


def handle(run, client) -> None:
    act(run, client)


async def handle_async(run, client) -> None:
    act(run, client)


sys.exit(serve(handle if flavour == "sync" else handle_async))
